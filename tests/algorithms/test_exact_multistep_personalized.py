"""Exact multi-round checks of pFedMe and APFL at non-trivial parameters (issue 29 item 2).

pFedMe (Dinh et al. 2020, Alg. 1) with the server mixing β ∉ {0.5, 1}, and APFL (Deng et al.
2020, Alg. 1) with a mixing factor strictly inside (0, 1) that adapts, each over three rounds with
several local steps, against a plain loop on least squares (``∇f(w; B) = Xᵀ(Xw − y)/|B|``).  The
minibatches are the algorithm's own draws (``alg.draw`` with the simulation's generators); the
arithmetic is the hand loop's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import APFL, PFedMe
from fedrisk.algorithms.base import RoundContext
from fedrisk.data.federation import Federation, Samples
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, Linear

SEED, ROUNDS = 0, 3


def least_squares(sizes: tuple[int, ...] = (8, 10, 12)) -> Federation:
    return _ls.least_squares(sizes, seed=1)


def grad(w: torch.Tensor, s: Samples, idx: torch.Tensor) -> torch.Tensor:
    x, y = s.x[idx], s.y[idx]
    return x.T @ (x @ w - y) / len(idx)


def batches(alg, fed: Federation, r: int, k: int) -> torch.Tensor:
    ctx = RoundContext(r, fed_info(fed))
    return alg.draw(ctx, k, fed.client_sizes[k], client_generator(SEED, round=r, client=k))["batches"]


COMMON = {"model": Linear(), "loss": mean_squared_error, "lr": 0.04, "local_steps": 3, "batch_size": 4}


def test_pfedme_with_beta_between_and_above_the_trivial_values_over_rounds_matches_alg_1() -> None:
    fed = least_squares()
    sizes = torch.tensor(fed.client_sizes, dtype=F64)
    lam, plr, inner = 3.0, 0.05, 3
    for beta in (0.3, 1.7):  # β < 1 damps, β > 1 extrapolates (their Alg. 1 allows both)
        alg = PFedMe(**COMMON, lam=lam, personal_lr=plr, inner_steps=inner, beta=beta)
        sim = Simulation(alg, fed, seed=SEED, dtype=F64)
        w_glob = sim.server_state["params"]["w"].clone()
        for r in range(ROUNDS):
            report = sim.step()
            ws, losses = [], []
            for k, s in enumerate(fed.clients):
                idx = batches(alg, fed, r, k)
                w = theta = w_glob.clone()
                for t in range(3):
                    for _ in range(inner):
                        loss = 0.5 * float(((s.x[idx[t]] @ theta - s.y[idx[t]]) ** 2).mean())
                        theta = theta - plr * (grad(theta, s, idx[t]) + lam * (theta - w))
                    losses.append(loss)  # f(theta; D) at the last inner step's start
                    w = w - 0.04 * lam * (w - theta)
                ws.append(w)
                torch.testing.assert_close(sim.client_states[k]["personal"]["w"], theta, rtol=1e-12, atol=1e-12)
            mean = sum(n * w for n, w in zip(sizes, ws)) / sizes.sum()
            w_glob = (1 - beta) * w_glob + beta * mean
            torch.testing.assert_close(sim.server_state["params"]["w"], w_glob, rtol=1e-12, atol=1e-12)
            assert report.train_metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)


def test_apfl_personal_step_with_its_mixing_factor_over_rounds_matches_alg_1() -> None:
    """v ← v − η a ∇f(v̄), v̄ = a v + (1 − a) w; a ← clip(a − η_a ⟨v − w, ∇f(v̄)⟩, 0, 1) at the
    step's old iterates; w ← w − η ∇f(w); the server averages w (sample weights)."""
    fed = least_squares()
    sizes = torch.tensor(fed.client_sizes, dtype=F64)
    lr, a0, a_lr = 0.04, 0.3, 0.05
    alg = APFL(**COMMON, mix=a0, mix_lr=a_lr)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w_glob = sim.server_state["params"]["w"].clone()
    v = [w_glob.clone() for _ in fed.clients]
    a = [torch.tensor(a0, dtype=F64) for _ in fed.clients]
    for r in range(ROUNDS):
        report = sim.step()
        ws, losses = [], []
        for k, s in enumerate(fed.clients):
            idx = batches(alg, fed, r, k)
            w = w_glob.clone()
            for t in range(3):
                losses.append(0.5 * float(((s.x[idx[t]] @ w - s.y[idx[t]]) ** 2).mean()))  # f(w; B), w's loss
                g_w = grad(w, s, idx[t])
                g_bar = grad(a[k] * v[k] + (1 - a[k]) * w, s, idx[t])
                a_next = (a[k] - a_lr * torch.dot(v[k] - w, g_bar)).clamp(0.0, 1.0)
                v[k] = v[k] - lr * a[k] * g_bar
                w = w - lr * g_w
                a[k] = a_next
            ws.append(w)
            torch.testing.assert_close(sim.client_states[k]["v"]["w"], v[k], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(sim.client_states[k]["mix"], a[k], rtol=1e-12, atol=1e-12)
        w_glob = sum(n * w for n, w in zip(sizes, ws)) / sizes.sum()
        torch.testing.assert_close(sim.server_state["params"]["w"], w_glob, rtol=1e-12, atol=1e-12)
        assert report.train_metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)
        for k in range(3):
            personal = alg.personal_params(sim.server_state, sim.client_states[k], k)["w"]
            torch.testing.assert_close(personal, a[k] * v[k] + (1 - a[k]) * w_glob, rtol=1e-12, atol=1e-12)
    assert all(0.0 < float(x) < 1.0 and abs(float(x) - a0) > 1e-3 for x in a)  # a moved, inside (0, 1)
