"""Exact checks of PERM's estimate rounds at non-trivial settings (issue 29 item 2).

* Single-loop PERM (Deng et al. 2023, Alg. 2) with ``global_batch = M``: the global step
  ``w ← w − γ (1/N) Σ_i g_i^M`` uses each client's M-row minibatch gradient, while the
  discrepancies ``D_ij = ||∇f_i(w) − ∇f_j(w)||²`` of eq. (2) still come from the full local
  gradients; the weights are eq. (2)'s minimiser, found here by bisection on the KKT threshold
  (``α_i(j) = n_j / (2λ) max(0, τ_i − D_ij)``, ``Σ_j α_i(j) = 1``).
* PERMHetero (Sec. 3.3, the mechanism of its docstring) with three unequal widths: every client
  uploads ``m_k ⊙ ∇f_k(m_k ⊙ w)`` and the global step divides each coordinate's sum by the number
  of clients holding it (3, 2 or 1 here), as HeteroFL does.

Two epochs each (estimate, N shuffle rounds, estimate), least squares, against plain loops; the
minibatch rows are the algorithm's own draws (``alg.draw`` with the simulation's generators).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import PERM, PERMHetero, PERMShuffling, PERMTwoStage
from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.local import sample_batch, sample_batches
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator, server_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, D, Linear

SEED, N = 2, 3


def grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇ of ``mean((x w − y)²) / 2``."""
    return x.T @ (x @ w - y) / len(y)


def step_to(sim: Simulation, r: int) -> None:
    """Step to round ``r`` in a bounded loop (a mutant that stops the round counter fails here
    instead of looping until mutmut's timeout)."""
    for _ in range(r - int(sim.server_state["round"])):
        sim.step()
    assert int(sim.server_state["round"]) == r


def kkt_weights(Dm: torch.Tensor, sizes: list[int], lam: float) -> torch.Tensor:
    """Eq. (2) row by row: bisection on τ_i so that Σ_j n_j / (2λ) max(0, τ_i − D_ij) = 1."""
    n = torch.tensor(sizes, dtype=F64)
    rows = []
    for i in range(Dm.shape[0]):
        lo, hi = float(Dm[i].min()), float(Dm[i].min()) + 2 * lam / float(n.min()) + 1.0
        for _ in range(200):
            tau = (lo + hi) / 2
            lo, hi = (tau, hi) if float((n / (2 * lam) * (tau - Dm[i]).clamp(min=0)).sum()) < 1 else (lo, tau)
        rows.append(n / (2 * lam) * (tau - Dm[i]).clamp(min=0))
    return torch.stack(rows)


def test_perm_global_batch_steps_with_minibatches_and_weights_from_full_gradients() -> None:
    fed = _ls.least_squares((8, 10, 12), seed=3)
    info = fed_info(fed)
    gamma, lam, M = 0.3, 40.0, 3
    alg = PERM(model=Linear(), loss=mean_squared_error, lr=0.1, local_steps=2, batch_size=3, global_lr=gamma,
               global_batch=M, lam=lam)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w = sim.server_state["w"]["w"].clone()
    for epoch, r in enumerate((0, N + 1)):  # the two estimate rounds; the shuffle rounds between leave w alone
        step_to(sim, r)
        assert sim.step().kind == "estimate"
        full = torch.stack([grad(w, c.x, c.y) for c in fed.clients])
        mini = []
        for k, c in enumerate(fed.clients):
            ctx = RoundContext(r, info, kind="estimate")
            idx = alg.draw(ctx, k, fed.client_sizes[k], client_generator(SEED, round=r, client=k))["global_idx"]
            assert idx.shape == (M,)
            mini.append(grad(w, c.x[idx], c.y[idx]))
        w = w - gamma * torch.stack(mini).mean(0)
        torch.testing.assert_close(sim.server_state["w"]["w"], w, rtol=0, atol=1e-13)
        if epoch == 0:  # alpha^0 is uniform and nothing is estimated
            assert bool((sim.server_state["alpha"] == 1 / N).all())
            assert int(sim.server_state["estimations"]) == 0
            continue
        Dm = ((full[:, None, :] - full[None, :, :]) ** 2).sum(-1)
        torch.testing.assert_close(sim.server_state["discrepancy"], Dm, rtol=1e-12, atol=1e-12)
        alpha = kkt_weights(Dm, list(fed.client_sizes), lam)
        torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
        assert float(alpha.min()) == 0.0 and 0.1 < float(alpha[0, 1]) < 0.9  # client 0 mixes 0 and 1, not 2
    assert int(sim.server_state["estimations"]) == 1


def ls_loss_grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, torch.Tensor]:
    r = x @ w - y
    return 0.5 * float((r**2).mean()), x.T @ r / len(y)


def ls_steps(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, step: float):
    """SGD-Update: a step of size ``step`` on each row block ``idx[t]``; the mean of the losses
    at the iterates before each step."""
    total = 0.0
    for t in range(idx.shape[0]):
        loss, g = ls_loss_grad(w, x[idx[t]], y[idx[t]])
        total += loss
        w = w - step * g
    return w, total / idx.shape[0]


def shuffle_round(v, sigma, j, r, fed, sizes, alpha, lr, K, B, sampling="with_replacement"):
    """One round of Alg. 1's shuffle by hand: model i visits host ``sigma[(i + j + 1) % N]`` and takes
    K steps on its batches (drawn by ``sampling``), scaled by α_{i,k}; returns the new models and
    each model's mean loss."""
    n = len(sigma)
    new, losses = v.clone(), []
    for i in range(n):
        k = sigma[(i + j + 1) % n]
        idx = sample_batches(client_generator(SEED, round=r, client=k), sizes[k], K, B, sampling)
        new[i], loss = ls_steps(v[i], fed.clients[k].x, fed.clients[k].y, idx, lr * float(alpha[i, k]))
        losses.append(loss)
    return new, losses


@pytest.mark.parametrize("weights", ["samples", "uniform", "local"])
def test_perm_shuffling_with_fixed_weights_over_two_epochs_matches_alg_1(weights: str) -> None:
    """Alg. 1 with ``α_i(k) = n_k / n`` (unequal sizes), ``1 / N`` or ``[i = k]``, K = 3
    minibatch steps without replacement, two epochs: in round j model i sits at
    ``σ((i + j + 1) mod N)`` and steps by ``η N α_i(k) = lr α_i(k)``; eq. (3)'s objective Φ_i
    sums the hosts' ``α_i(k)``-weighted mean losses over the epoch."""
    sizes, lr, K, B = (6, 9, 12, 8), 0.15, 3, 4
    n_clients = len(sizes)
    fed = _ls.least_squares(sizes, seed=5)
    alg = PERMShuffling(model=Linear(), loss=mean_squared_error, lr=lr, local_steps=K, batch_size=B,
                        weights=weights, sampling="shuffle")  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    n = torch.tensor(sizes, dtype=F64)
    alpha = {
        "samples": (n / n.sum()).expand(n_clients, n_clients),
        "uniform": torch.full((n_clients, n_clients), 1 / n_clients, dtype=F64),
        "local": torch.eye(n_clients, dtype=F64),
    }[weights]
    torch.testing.assert_close(alg.weight_matrix(sim.server_state), alpha, rtol=0, atol=1e-15)
    v = sim.server_state["v"]["w"].clone()
    w0 = sim.server_state["w"]["w"].clone()
    assert bool((v == w0).all()) and alg.state_metrics(sim.server_state, fed) == {}
    r = 0
    for epoch in range(2):
        sigma = sim.server_state["sigma"].tolist()
        phi = torch.zeros(n_clients, dtype=F64)
        for j in range(n_clients):
            v, host_losses = shuffle_round(v, sigma, j, r, fed, sizes, alpha, lr, K, B, "shuffle")
            for i, loss in enumerate(host_losses):
                phi[i] += alpha[i, sigma[(i + j + 1) % n_clients]] * loss
            report = sim.step()
            r += 1
            assert report.kind == "shuffle" and report.clients == list(range(n_clients))
            assert report.train_metrics["host_loss"] == pytest.approx(sum(host_losses) / n_clients, rel=1e-12)
            torch.testing.assert_close(sim.server_state["v"]["w"], v, rtol=0, atol=1e-12)
            assert int(sim.server_state["j"]) == (j + 1) % n_clients
            if epoch == 0 and j < n_clients - 1:  # no model has completed an epoch yet
                assert alg.state_metrics(sim.server_state, fed) == {}
        torch.testing.assert_close(sim.server_state["objective"], phi, rtol=1e-12, atol=0)
        assert bool(sim.server_state["objective_seen"].all())
        assert alg.state_metrics(sim.server_state, fed)["train_loss"] == pytest.approx(float(phi.mean()), rel=1e-12)
    assert sim.server_state["sigma"].tolist() != sigma or sorted(sigma) == list(range(n_clients))
    assert alg.global_params(sim.server_state) is None and torch.equal(sim.server_state["w"]["w"], w0)


def test_perm_alpha_batch_global_batch_and_warm_up_over_three_epochs_match_alg_2() -> None:
    """Alg. 2 with ``alpha_batch = A``, ``global_batch = M`` and a uniform warm-up of two epochs:
    every estimate round draws A rows then M rows from the client's generator; D comes from the
    A-row gradients (from the first estimate round with ``r ≥ warmup_rounds`` on), the global
    step from the M-row ones; the shuffle rounds move the personal models with the weights of
    their epoch (uniform, uniform, estimated)."""
    sizes, gamma, lam, A, M, lr, K, B = (8, 10, 12), 0.3, 40.0, 5, 3, 0.1, 2, 3
    warm = 2 * (N + 1)  # the third epoch's estimate round is the first with r >= warmup_rounds
    fed = _ls.least_squares(sizes, seed=3)
    alg = PERM(
        model=Linear(),
        loss=mean_squared_error,
        lr=lr,
        local_steps=K,
        batch_size=B,
        global_lr=gamma,
        global_batch=M,
        alpha_batch=A,
        lam=lam,
        warmup_rounds=warm,
        weights="samples",  # ignored by PERM: alpha^0 is uniform
    )
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w, v = sim.server_state["w"]["w"].clone(), sim.server_state["v"]["w"].clone()
    alpha = torch.full((N, N), 1 / N, dtype=F64)
    r = 0
    for epoch in range(3):
        g_alpha, g_step, losses = [], [], []
        for k, c in enumerate(fed.clients):
            rng = client_generator(SEED, round=r, client=k)
            rows_a, rows_m = sample_batch(rng, sizes[k], A), sample_batch(rng, sizes[k], M)
            loss, g = ls_loss_grad(w, c.x[rows_a], c.y[rows_a])
            g_alpha.append(g)
            losses.append(loss)
            g_step.append(ls_loss_grad(w, c.x[rows_m], c.y[rows_m])[1])
        if r >= warm:
            ga = torch.stack(g_alpha)
            alpha = kkt_weights(((ga[:, None, :] - ga[None, :, :]) ** 2).sum(-1), list(sizes), lam)
            assert 0.05 < float(alpha[0, 1]) < 0.95  # a real mixture
        w = w - gamma * torch.stack(g_step).mean(0)
        report = sim.step()
        r += 1
        assert report.kind == "estimate"
        assert report.train_metrics["global_loss"] == pytest.approx(sum(losses) / N, rel=1e-12)
        torch.testing.assert_close(sim.server_state["w"]["w"], w, rtol=0, atol=1e-13)
        torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
        assert int(sim.server_state["estimations"]) == (epoch == 2)
        w_now = sim.server_state["w"]["w"].clone()
        sigma = sim.server_state["sigma"].tolist()
        for j in range(N):
            v, _ = shuffle_round(v, sigma, j, r, fed, sizes, alpha, lr, K, B)
            assert sim.step().kind == "shuffle"
            r += 1
            torch.testing.assert_close(sim.server_state["v"]["w"], v, rtol=0, atol=1e-12)
            assert torch.equal(sim.server_state["w"]["w"], w_now)  # the shuffle rounds leave w alone
    assert alg.global_params(sim.server_state) is sim.server_state["w"]


def test_perm_two_stage_with_alpha_batch_matches_alg_3_then_alg_1() -> None:
    """Two-stage PERM: R = 2 FedAvg rounds (K steps of size γ, uniform averaging over unequal
    sizes), one estimate round (A-row gradients at w^R: D, α̂ = eq. (2), every v_i = w^R), then
    two epochs of Alg. 1 with the fixed α̂, starting at the schedule's round 0."""
    sizes, gamma, lam, A, lr, K, B, R = (8, 10, 12), 0.2, 40.0, 6, 0.1, 2, 3, 2
    fed = _ls.least_squares(sizes, seed=6)
    alg = PERMTwoStage(model=Linear(), loss=mean_squared_error, lr=lr, local_steps=K, batch_size=B, global_lr=gamma,
                       alpha_batch=A, lam=lam, fedavg_rounds=R)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w = sim.server_state["w"]["w"].clone()
    for r in range(R):
        local, losses = [], []
        for k, c in enumerate(fed.clients):
            idx = sample_batches(client_generator(SEED, round=r, client=k), sizes[k], K, B)
            w_k, loss = ls_steps(w, c.x, c.y, idx, gamma)
            local.append(w_k)
            losses.append(loss)
        w = torch.stack(local).mean(0)  # uniform, not by size
        report = sim.step()
        assert report.kind == "fedavg"
        assert report.train_metrics["global_loss"] == pytest.approx(sum(losses) / N, rel=1e-12)
        torch.testing.assert_close(sim.server_state["w"]["w"], w, rtol=0, atol=1e-13)
    w = sim.server_state["w"]["w"].clone()  # w^R, to check that every v_i starts at it bit for bit
    grads, losses = [], []
    for k, c in enumerate(fed.clients):
        rows = sample_batch(client_generator(SEED, round=R, client=k), sizes[k], A)
        loss, g = ls_loss_grad(w, c.x[rows], c.y[rows])
        grads.append(g)
        losses.append(loss)
    g = torch.stack(grads)
    Dm = ((g[:, None, :] - g[None, :, :]) ** 2).sum(-1)
    alpha = kkt_weights(Dm, list(sizes), lam)
    assert 0.05 < float(alpha[0, 1]) < 0.95  # a real mixture
    report = sim.step()
    assert report.kind == "estimate"
    assert report.train_metrics["global_loss"] == pytest.approx(sum(losses) / N, rel=1e-12)
    torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
    torch.testing.assert_close(sim.server_state["discrepancy"], Dm, rtol=1e-12, atol=1e-12)
    assert int(sim.server_state["estimations"]) == 1
    v = w.expand(N, -1).clone()
    assert torch.equal(sim.server_state["v"]["w"], v) and torch.equal(sim.server_state["w"]["w"], w)
    r = R + 1
    for _ in range(2):
        sigma = sim.server_state["sigma"].tolist()
        for j in range(N):
            v, _ = shuffle_round(v, sigma, j, r, fed, sizes, alpha, lr, K, B)
            assert sim.step().kind == "shuffle"
            r += 1
            torch.testing.assert_close(sim.server_state["v"]["w"], v, rtol=0, atol=1e-12)
    assert torch.equal(sim.server_state["alpha"], alg.weight_matrix(sim.server_state))  # α̂ stays fixed
    torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
    assert torch.equal(sim.server_state["w"]["w"], w) and int(sim.server_state["estimations"]) == 1


def test_partial_perm_over_three_epochs_solves_the_sampled_rows_among_the_sampled() -> None:
    """m = 3 of N = 5 clients per epoch: the estimate round's repliers S solve eq. (2) among
    themselves (a replier's row puts no weight outside S), the others keep the row they had (the
    uniform α^0, or an earlier estimate); D is recorded on S × S, older entries kept; the global
    step averages the repliers' gradients; in the shuffle rounds model i of S moves among S's
    hosts with step ``lr α_i(k) / Σ_{l∈S} α_i(l)``."""
    n_clients, m, sizes, gamma, lam, lr, K, B = 5, 3, (8, 10, 12, 9, 11), 0.3, 40.0, 0.1, 2, 3
    fed = _ls.least_squares(sizes, seed=7)
    alg = PERM(model=Linear(), loss=mean_squared_error, lr=lr, local_steps=K, batch_size=B, global_lr=gamma, lam=lam,
               clients_per_round=m)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    w, v = sim.server_state["w"]["w"].clone(), sim.server_state["v"]["w"].clone()
    alpha = torch.full((n_clients, n_clients), 1 / n_clients, dtype=F64)
    known = torch.zeros(n_clients, n_clients, dtype=F64)
    r, samples = 0, []
    g = server_generator(SEED, -1, "init")  # the first epoch's S and sigma; later ones: the epoch's last round
    for epoch in range(3):
        S = sorted(torch.randperm(n_clients, generator=g)[:m].tolist())  # m clients without replacement
        sigma = torch.randperm(m, generator=g).tolist()  # then a permutation of S's positions
        assert sim.server_state["members"].tolist() == S and sim.server_state["sigma"].tolist() == sigma
        samples.append(S)
        g = torch.stack([ls_loss_grad(w, fed.clients[k].x, fed.clients[k].y)[1] for k in S])
        if epoch > 0:
            Dm = ((g[:, None, :] - g[None, :, :]) ** 2).sum(-1)
            sub = kkt_weights(Dm, [sizes[k] for k in S], lam)
            for a, i in enumerate(S):
                alpha[i] = 0.0
                for b, k in enumerate(S):
                    alpha[i, k] = sub[a, b]
                    known[i, k] = Dm[a, b]
        w = w - gamma * g.mean(0)
        report = sim.step()
        r += 1
        assert report.kind == "estimate" and report.clients == S
        torch.testing.assert_close(sim.server_state["w"]["w"], w, rtol=0, atol=1e-13)
        torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
        torch.testing.assert_close(sim.server_state["discrepancy"], known, rtol=1e-12, atol=1e-12)
        assert int(sim.server_state["estimations"]) == epoch
        for j in range(m):
            new = v.clone()
            for p, i in enumerate(S):
                k = S[sigma[(p + j + 1) % m]]
                idx = sample_batches(client_generator(SEED, round=r, client=k), sizes[k], K, B)
                step = lr * float(alpha[i, k] / alpha[i, S].sum())
                new[i] = ls_steps(v[i], fed.clients[k].x, fed.clients[k].y, idx, step)[0]
            v = new
            assert sim.step().clients == S
            r += 1
            torch.testing.assert_close(sim.server_state["v"]["w"], v, rtol=0, atol=1e-12)
        g = server_generator(SEED, r - 1, "aggregate")
    kept = sorted(set(samples[1]) - set(samples[2]))
    assert kept and all(float(alpha[i].max()) > 1 / n_clients + 0.05 for i in kept)  # an earlier estimate, kept


# ----------------------------------------------------------------------------- heterogeneous widths

NAMES = ("layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias")
UNITS = (4, 2, 1)  # widths (1.0, 0.5, 0.25) of the 4 hidden units


def hetero_masks() -> list[dict[str, torch.Tensor]]:
    masks = []
    for u in UNITS:  # hidden unit h is held by the clients with at least h + 1 units
        m0 = torch.zeros(4, D, dtype=F64)
        m0[:u] = 1.0
        b0 = (torch.arange(4) < u).to(F64)
        masks.append({"layers.0.weight": m0, "layers.0.bias": b0, "layers.2.weight": b0[None, :].clone(),
                      "layers.2.bias": torch.ones(1, dtype=F64)})  # fmt: skip
    return masks


def mlp_grad(p: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss ``mean((relu(x W0ᵀ + b0) W2ᵀ + b2 − y)²) / 2`` and its gradient."""
    q = {n: p[n].detach().requires_grad_() for n in NAMES}
    out = torch.relu(x @ q["layers.0.weight"].T + q["layers.0.bias"]) @ q["layers.2.weight"].T + q["layers.2.bias"]
    loss = 0.5 * ((out[:, 0] - y) ** 2).mean()
    return float(loss.detach()), dict(zip(NAMES, torch.autograd.grad(loss, [q[n] for n in NAMES])))


@pytest.mark.parametrize(("global_batch", "warmup_rounds"), [(None, 0), (3, N + 1)])
def test_perm_hetero_two_epochs_with_unequal_widths_match_a_hand_transcription(
    global_batch: int | None, warmup_rounds: int
) -> None:
    """PERMHetero (Sec. 3.3, the mechanism of its docstring) with widths 1, 1/2 and 1/4: client k
    uploads ``m_k ⊙ ∇f_k(m_k ⊙ w)`` (full data for D; M rows for the global step when
    ``global_batch = M``), the global step divides each coordinate's sum by its holders (3, 2 or
    1: HeteroFL), and in a shuffle round host k trains model i on ``m_i ⊙ m_k`` only, K steps of
    ``lr α_i(k)``.  The second epoch's estimate round sets α (with a warm-up, it is the first
    round with ``r ≥ warmup_rounds``)."""
    sizes, gamma, lam, lr, K, B = (8, 10, 12), 0.2, 400.0, 0.1, 2, 4
    fed = _ls.least_squares(sizes, seed=4)
    model = FunctionalModel(build_model("mlp", (D,), 1, hidden=[4]))
    alg = PERMHetero(model=model, loss=mean_squared_error, lr=lr, local_steps=K, batch_size=B, global_lr=gamma,
                     global_batch=global_batch, lam=lam, widths=(1.0, 0.5, 0.25),
                     warmup_rounds=warmup_rounds)  # fmt: skip
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    masks = hetero_masks()
    for k in range(N):
        for n in NAMES:
            assert torch.equal(sim.server_state["masks"][n][k], masks[k][n])
    holders = {n: sum(m[n] for m in masks) for n in NAMES}
    assert holders["layers.0.bias"].tolist() == [3.0, 2.0, 1.0, 1.0] and holders["layers.2.bias"].tolist() == [3.0]
    w = {n: sim.server_state["w"][n].clone() for n in NAMES}
    v = [{n: w[n] * masks[k][n] for n in NAMES} for k in range(N)]  # v_k^0 = m_k ⊙ w^0
    alpha = torch.full((N, N), 1 / N, dtype=F64)
    r = 0
    for epoch in range(2):
        grads, steps, losses = [], [], []
        for k, c in enumerate(fed.clients):
            at = {n: w[n] * masks[k][n] for n in NAMES}
            loss, g = mlp_grad(at, c.x, c.y)
            grads.append({n: g[n] * masks[k][n] for n in NAMES})
            losses.append(loss)
            if global_batch is None:
                steps.append(grads[-1])
            else:
                rows = sample_batch(client_generator(SEED, round=r, client=k), sizes[k], global_batch)
                g = mlp_grad(at, c.x[rows], c.y[rows])[1]
                steps.append({n: g[n] * masks[k][n] for n in NAMES})
        if epoch == 1:
            flat = torch.stack([torch.cat([g[n].reshape(-1) for n in NAMES]) for g in grads])
            Dm = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
            alpha = kkt_weights(Dm, list(sizes), lam)
            assert 0.05 < float(alpha[0, 1]) < 0.95  # a real mixture
        w = {n: w[n] - gamma * sum(s[n] for s in steps) / holders[n] for n in NAMES}
        report = sim.step()
        r += 1
        assert report.kind == "estimate"
        assert report.train_metrics["global_loss"] == pytest.approx(sum(losses) / N, rel=1e-12)
        for n in NAMES:
            torch.testing.assert_close(sim.server_state["w"][n], w[n], rtol=0, atol=1e-13)
        torch.testing.assert_close(sim.server_state["alpha"], alpha, rtol=0, atol=1e-10)
        if epoch == 1:
            torch.testing.assert_close(sim.server_state["discrepancy"], Dm, rtol=1e-12, atol=1e-12)
        sigma = sim.server_state["sigma"].tolist()
        phi = torch.zeros(N, dtype=F64)
        for j in range(N):
            new, host_losses = list(v), []
            for i in range(N):
                k = sigma[(i + j + 1) % N]
                both = {n: masks[i][n] * masks[k][n] for n in NAMES}
                idx = sample_batches(client_generator(SEED, round=r, client=k), sizes[k], K, B)
                p, total = dict(v[i]), 0.0
                for t in range(K):
                    x, y = fed.clients[k].x[idx[t]], fed.clients[k].y[idx[t]]
                    loss, g = mlp_grad(p, x, y)
                    total += loss
                    p = {n: p[n] - lr * float(alpha[i, k]) * g[n] * both[n] for n in NAMES}
                new[i] = p
                phi[i] += alpha[i, k] * total / K
                host_losses.append(total / K)
            v = new
            report = sim.step()
            r += 1
            assert report.kind == "shuffle"
            assert report.train_metrics["host_loss"] == pytest.approx(sum(host_losses) / N, rel=1e-12)
            for i in range(N):
                for n in NAMES:
                    torch.testing.assert_close(sim.server_state["v"][n][i], v[i][n], rtol=0, atol=1e-12)
        torch.testing.assert_close(sim.server_state["objective"], phi, rtol=1e-12, atol=0)
    # the narrow clients' gradients vanish outside their units, so the counts matter: unit 1 has 2 holders
    assert float(grads[1]["layers.0.bias"][1].abs()) > 1e-6 and float(grads[2]["layers.0.bias"][1]) == 0.0
    assert sim.client_states == {k: {} for k in range(N)}  # the clients keep no state
