"""RSA (Li et al. 2019, the baseline of paper 002) over several rounds against a hand loop of its
update (issue 29 item 2): workers ``w_n ← w_n − η_k (∇f_n(w_n; ξ) + δ w_n + λ sign(w_n − w_0))``,
server ``w_0 ← w_0 − η_k (δ_0 w_0 + λ Σ_n sign(w_0 − w_n))`` with ``η_k = lr / √k``, on least
squares (``∇f(w; B) = Xᵀ(Xw − y)/|B|``); the minibatches are the algorithm's own draws.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import RSA
from fedrisk.algorithms.base import Algorithm, RoundContext
from fedrisk.data.federation import Federation
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, D, Linear

SEED = 0


def federation(sizes: tuple[int, ...], seed: int) -> Federation:
    """Least squares, client k's rows shifted by 0.3 k, targets from its own ``N(0, I)`` truth."""
    return _ls.least_squares(sizes, seed, shift=0.3, scale=1.0)


def batch_rows(alg: Algorithm, fed: Federation, r: int, k: int) -> torch.Tensor:
    """The rows of client ``k``'s single minibatch in round ``r`` (the algorithm's own draw)."""
    ctx = RoundContext(r, fed_info(fed))
    return alg.draw(ctx, k, fed.client_sizes[k], client_generator(SEED, round=r, client=k))["batches"][0]


def test_rsa_over_four_rounds_matches_the_hand_loop() -> None:
    fed = federation((8, 10, 12), seed=2)  # an odd count: the sign sum never cancels
    clients = fed.clients
    lr, lam, delta, delta0 = 0.3, 0.05, 0.02, 0.1
    alg = RSA(model=Linear(), loss=mean_squared_error, lam=lam, lr=lr, delta=delta, delta_server=delta0, batch_size=4)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w0 = torch.zeros(D, dtype=F64)  # zero_init
    ws = [torch.zeros(D, dtype=F64) for _ in clients]
    for r in range(4):
        sim.step()
        eta = lr / math.sqrt(r + 1)
        for k, s in enumerate(clients):
            idx = batch_rows(alg, fed, r, k)
            x, y = s.x[idx], s.y[idx]
            grad = x.T @ (x @ ws[k] - y) / len(idx)
            ws[k] = ws[k] - eta * (grad + delta * ws[k] + lam * torch.sign(ws[k] - w0))
            torch.testing.assert_close(sim.client_states[k]["w"]["w"], ws[k], rtol=1e-12, atol=1e-12)
        w0 = w0 - eta * (delta0 * w0 + lam * sum(torch.sign(w0 - w) for w in ws))
        torch.testing.assert_close(sim.server_state["w"]["w"], w0, rtol=1e-12, atol=1e-12)
    assert float(w0.abs().min()) > 0  # every coordinate moved


def test_rsa_under_the_gaussian_attack_redrawn_each_round_matches_the_hand_loop() -> None:
    """Client 2 is Byzantine: the server sees ``scale · N(0, I)`` drawn afresh every round from
    the round's attack generator, in place of its model (its own state stays honest)."""
    from fedrisk.attacks.standard import GaussianAttack
    from fedrisk.rng import server_generator

    fed = federation((8, 10, 12), seed=3)
    clients = fed.clients
    lr, lam, scale = 0.3, 0.05, 0.2  # a small scale: the noise's signs vary against w0
    alg = RSA(model=Linear(), loss=mean_squared_error, lam=lam, lr=lr, delta=0.0, delta_server=0.0, batch_size=4)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64, attack=GaussianAttack(scale), byzantine=[2])
    w0 = torch.zeros(D, dtype=F64)
    ws = [torch.zeros(D, dtype=F64) for _ in clients]
    forged_seen = []
    for r in range(4):
        sim.step()
        eta = lr / math.sqrt(r + 1)
        for k, s in enumerate(clients):
            idx = batch_rows(alg, fed, r, k)
            x, y = s.x[idx], s.y[idx]
            ws[k] = ws[k] - eta * (x.T @ (x @ ws[k] - y) / len(idx) + lam * torch.sign(ws[k] - w0))
        forged = scale * torch.randn(D, generator=server_generator(SEED, r, "attack"), dtype=F64)
        forged_seen.append(forged)
        w0 = w0 - eta * lam * (torch.sign(w0 - ws[0]) + torch.sign(w0 - ws[1]) + torch.sign(w0 - forged))
        torch.testing.assert_close(sim.server_state["w"]["w"], w0, rtol=1e-12, atol=1e-12)
    assert not torch.equal(forged_seen[0], forged_seen[1])


def test_rsa_reports_the_mean_minibatch_loss() -> None:
    fed = federation((6, 9), seed=4)
    clients = fed.clients
    alg = RSA(model=Linear(), loss=mean_squared_error, lam=0.05, lr=0.3, batch_size=4, zero_init=False)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w = sim.server_state["w"]["w"].clone()  # every worker starts at the server's model
    report = sim.step()
    losses = []
    for k, s in enumerate(clients):
        idx = batch_rows(alg, fed, 0, k)
        losses.append(float(0.5 * ((s.x[idx] @ w - s.y[idx]) ** 2).mean()))  # f_n(w_n; ξ), no ridge
    assert report.train_metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)


def test_robust_sgd_with_the_mean_over_four_rounds_matches_the_hand_loop() -> None:
    """SGD with the mean aggregator (paper 002's SGD baseline): ``w_0 ← w_0 − (lr/√k) mean_n
    (∇f_n(w_0; ξ_n) + δ w_0)``, the ridge added by the workers, and the mean minibatch loss
    reported (pinned by mutation testing, frpg scope: the ridge's sign was untested)."""
    from fedrisk.algorithms import RobustSGD

    fed = federation((8, 10, 12), seed=5)
    clients = fed.clients
    lr, delta = 0.2, 0.3
    alg = RobustSGD(model=Linear(), loss=mean_squared_error, lr=lr, delta=delta, batch_size=4, zero_init=False)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w0 = sim.server_state["w"]["w"].clone()
    for r in range(4):
        report = sim.step()
        grads, losses = [], []
        for k, s in enumerate(clients):
            idx = batch_rows(alg, fed, r, k)
            x, y = s.x[idx], s.y[idx]
            grads.append(x.T @ (x @ w0 - y) / len(idx) + delta * w0)
            losses.append(float(0.5 * ((x @ w0 - y) ** 2).mean()))
        w0 = w0 - lr / math.sqrt(r + 1) * sum(grads) / len(grads)
        torch.testing.assert_close(sim.server_state["w"]["w"], w0, rtol=1e-12, atol=1e-12)
        assert report.train_metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)
