"""PERM's peers (issue 28): IFCA (Ghosh et al. 2020, Alg. 1, model averaging), FedFomo
(Zhang et al. 2021, eqs. (6)-(8)) and APPLE (Luo and Wu 2022) against hand transcriptions of
their update rules, with several local steps and rounds; and their refusals."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import APPLE, IFCA, FedFomo
from fedrisk.algorithms.base import FedInfo
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy, mean_squared_error
from fedrisk.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _least_squares import F64, D
from _least_squares import ZeroLinear as Linear


def two_groups(N: int = 6, n: int = 10, seed: int = 0) -> Federation:
    """Least squares; clients < N/2 share one true model, the others another."""
    g = torch.Generator().manual_seed(seed)
    truth = [torch.tensor([2.0, -1.0, 0.5], dtype=F64), torch.tensor([-2.0, 1.0, 1.5], dtype=F64)]
    clients = []
    for k in range(N):
        a = torch.randn(n, D, generator=g, dtype=F64)
        clients.append(Samples(a, a @ truth[int(k >= N // 2)] + 0.05 * torch.randn(n, generator=g, dtype=F64)))
    return Federation("two-groups", clients, num_classes=1)


def f(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return 0.5 * float(((x @ w - y) ** 2).mean())


def gd(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int) -> torch.Tensor:
    for _ in range(steps):
        w = w - lr * x.T @ (x @ w - y) / len(y)
    return w


# ----------------------------------------------------------------------------- IFCA


def test_ifca_equals_a_hand_transcription() -> None:
    N, n, K, lr, rounds = 6, 10, 3, 0.1, 3
    fed = two_groups(N, n)
    alg = IFCA(model=Linear(), loss=mean_squared_error, num_clusters=2, lr=lr, local_steps=K, batch_size=n)
    alg = IFCA(**{**alg.__dict__, "sampling": "shuffle"})  # batches of all n rows: full-gradient steps
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    theta = torch.randn(2, D, generator=torch.Generator().manual_seed(5), dtype=F64)
    sim.server_state["models"] = {"w": theta.clone()}
    for _ in range(rounds):
        chosen, trained = [], []
        for s in fed.clients:  # j_hat = argmin_j F_i(theta_j), then K local steps from theta_j_hat
            j = min(range(2), key=lambda j: (f(theta[j], s.x, s.y), j))
            chosen.append(j)
            trained.append(gd(theta[j], s.x, s.y, lr, K))
        new = theta.clone()
        for j in range(2):  # theta_j = mean of the models of the clients that chose j
            members = [t for t, c in zip(trained, chosen) if c == j]
            if members:
                new[j] = torch.stack(members).mean(0)
        theta = new
        sim.step()
    torch.testing.assert_close(sim.server_state["models"]["w"], theta, rtol=1e-10, atol=1e-12)
    assert len(set(chosen)) == 2  # the two groups were told apart
    for k in range(N):
        assert sim.client_states[k]["cluster"].tolist() == [int(chosen[k] == 0), int(chosen[k] == 1)]
        personal = alg.personal_params(sim.server_state, sim.client_states[k], k)["w"]
        assert torch.equal(personal, sim.server_state["models"]["w"][chosen[k]])


def test_ifca_refusals() -> None:
    model = FunctionalModel(build_model("logreg", (3,), 2))
    with pytest.raises(FedriskError, match=r"num_clusters = 1 is out of range"):
        IFCA(model=model, loss=cross_entropy, num_clusters=1)
    with pytest.raises(FedriskError, match=r"clients_per_round = 7 is more than the federation's 6 clients"):
        IFCA(model=model, loss=cross_entropy, clients_per_round=7).check(FedInfo(6, (10,) * 6, 2))


# ----------------------------------------------------------------------------- FedFomo


def test_fedfomo_equals_a_hand_transcription() -> None:
    N, n, K, lr, M, rounds = 4, 10, 2, 0.1, 2, 3
    fed = two_groups(N, n, seed=1)
    n_val = 3  # ceil(0.3 * 10)
    alg = FedFomo(
        model=Linear(),
        loss=mean_squared_error,
        lr=lr,
        local_steps=K,
        batch_size=n - n_val,
        sampling="shuffle",  # batches of all training rows: full-gradient steps
        num_download=M,
        epsilon=0.0,
        epsilon_decay=0.0,
        val_fraction=0.3,
    )
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    start = torch.randn(N, D, generator=torch.Generator().manual_seed(3), dtype=F64)  # distinct models
    start[0] = torch.tensor([2.0, -1.0, 0.5], dtype=F64) + 0.1 * start[0]  # close to group 0's truth: a good peer
    start[1] = 6.0 * start[1]  # a bad model that gains from its peer: eq. (7) mixes
    for k in range(N):
        sim.client_states[k] = {"model": {"w": start[k].clone()}}
    sim.server_state["models"] = {"w": start.clone()}
    own, server, P = start.clone(), start.clone(), torch.zeros(N, N, dtype=F64)
    for _ in range(rounds):
        uploads, gains = {}, {}
        for i, s in enumerate(fed.clients):
            xt, yt, xv, yv = s.x[: n - n_val], s.y[: n - n_val], s.x[n - n_val :], s.y[n - n_val :]
            others = sorted((n_ for n_ in range(N) if n_ != i), key=lambda n_: (-float(P[i, n_]), n_))[:M]
            others = sorted(others)
            base = f(own[i], xv, yv)
            w = []
            for m in others:  # eq. (6)
                dist = float((server[m] - own[i]).norm())
                w.append((base - f(server[m], xv, yv)) / dist if dist > 0 else 0.0)
            pos = [max(v, 0.0) for v in w]
            theta = own[i].clone()
            if sum(pos) > 0:  # eq. (7)
                theta = own[i] + sum(p / sum(pos) * (server[m] - own[i]) for p, m in zip(pos, others))
            uploads[i] = gd(theta, xt, yt, lr, K)
            gains[i] = (others, w)
        for i in range(N):
            own[i] = server[i] = uploads[i]
            for m, v in zip(*gains[i]):
                P[i, m] += v
        sim.step()
    for k in range(N):
        torch.testing.assert_close(sim.client_states[k]["model"]["w"], own[k], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(sim.server_state["affinity"], P, rtol=1e-10, atol=1e-12)
    assert float(P[1, 0]) > 0 and bool((P < 0).any())  # gains and losses both occurred


def test_fedfomo_epsilon_greedy_downloads() -> None:
    alg = FedFomo(model=Linear(), loss=mean_squared_error, num_download=2)
    P = torch.tensor([[0.0, 1.0, 3.0, 2.0], [0.0] * 4, [0.0] * 4, [0.0] * 4])
    assert alg.choose(P, 0, 2, 0.0, torch.Generator().manual_seed(0)) == [2, 3]  # greedy: the largest gains
    picks = {tuple(alg.choose(P, 0, 2, 1.0, torch.Generator().manual_seed(s))) for s in range(30)}
    assert len(picks) > 1 and all(0 not in p for p in picks)  # random, never itself


def test_fedfomo_refusals() -> None:
    with pytest.raises(FedriskError, match=r"val_fraction = 1.0 is out of range"):
        FedFomo(model=Linear(), loss=mean_squared_error, val_fraction=1.0)
    alg = FedFomo(model=Linear(), loss=mean_squared_error, val_fraction=0.5)
    with pytest.raises(FedriskError, match=r"clients \[1\] are too small to split"):
        alg.check(FedInfo(3, (10, 1, 10), 1))
    with pytest.raises(FedriskError, match=r"fedfomo needs at least 2 clients"):
        alg.check(FedInfo(1, (10,), 1))


# ----------------------------------------------------------------------------- APPLE


def test_apple_equals_a_hand_transcription() -> None:
    N, n, K, lr, dr_lr, mu, L, rounds = 3, 10, 3, 0.05, 0.02, 0.5, 3, 4
    fed = two_groups(N, n, seed=2)
    alg = APPLE(
        model=Linear(),
        loss=mean_squared_error,
        lr=lr,
        dr_lr=dr_lr,
        local_steps=K,
        batch_size=n,
        sampling="shuffle",  # batches of all n rows: full-gradient steps
        mu=mu,
        decay_rounds=L,
    )
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    cores = torch.randn(N, D, generator=torch.Generator().manual_seed(7), dtype=F64)
    sim.server_state["cores"] = {"w": cores.clone()}
    P = torch.full((N, N), 1.0 / N, dtype=F64)
    for r in range(rounds):
        lam = (1 + math.cos(math.pi * r / L)) / 2 if r < L else 0.0
        new = cores.clone()
        for i, s in enumerate(fed.clients):
            core, p = cores[i].clone(), P[i].clone()
            for _ in range(K):
                phi = sum(p[j] * (core if j == i else cores[j]) for j in range(N))
                g = s.x.T @ (s.x @ phi - s.y) / n  # grad of ||x phi - y||^2 / (2 n)
                dots = torch.stack([g @ (core if j == i else cores[j]) for j in range(N)])
                core, p = core - lr * p[i] * g, p - dr_lr * (dots + lam * mu * (p - 1.0 / N))
            new[i], P[i] = core, p
        cores = new
        sim.step()
    torch.testing.assert_close(sim.server_state["cores"]["w"], cores, rtol=1e-10, atol=1e-12)
    for k in range(N):
        torch.testing.assert_close(sim.client_states[k]["p"], P[k], rtol=1e-10, atol=1e-12)
        personal = alg.personal_params(sim.server_state, sim.client_states[k], k)["w"]
        torch.testing.assert_close(personal, P[k] @ cores, rtol=1e-10, atol=1e-12)
    assert float((P - 1.0 / N).abs().max()) > 1e-3  # the DR vectors moved
    torch.testing.assert_close(alg.client_weights(sim.client_states), P, rtol=1e-10, atol=1e-12)
