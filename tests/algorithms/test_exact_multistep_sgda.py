"""Exact multi-step checks of the FESS-GDA family at non-trivial parameters (issue 29 item 2).

Every test runs the public algorithm class for several rounds with K > 1 local steps, several
clients and global steps ≠ 1, and compares every round's server state with an independent hand
transcription of the algorithm box (spec 001 §2.1 Algorithm 1, §2.3 the NC-C variant, §2.5-2.6 the
baselines): a plain loop over the closed-form gradients of the NC-SC quadratic game,

    f_i(x, y) = c Σ_k cos x_k + yᵀ(A x + b_i) − (μ/2)||y||²,
    ∇_x f_i = −c sin x + Aᵀ y,   ∇_y f_i = A x + b_i − μ y.

With ``noise_std = 0`` every row of client i equals ``b_i`` (the heterogeneity makes the clients
differ), so the minibatch draw does not matter and the transcription is exact to rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from fedrisk.algorithms.fessgda import FESSGDA, FESSGDARegularized
from fedrisk.algorithms.sgda import FSGDA, SAGDA, FedNormSGDAPlus, LocalSGDAPlus, quadratic_matrix
from fedrisk.data import build_federation
from fedrisk.data.federation import Federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import tensor_leaves

F64 = torch.float64
D1, D2 = 3, 4
CURV, MU, X0 = 1.3, 0.6, 0.5


def clean_fed(num_clients: int = 3) -> Federation:
    opts = {"dim": D2, "samples_per_client": 6, "heterogeneity": 1.0, "noise_std": 0.0}
    return build_federation("nc_sc_quadratic", "by_attribute", num_clients, seed=0, dataset_options=opts)


def make(cls: type, **kw: Any) -> Any:
    base = {"game": "quadratic", "dual_dim": D2, "quadratic_mu": MU, "quadratic_curvature": CURV, "batch_size": 2}
    return cls(model=FunctionalModel(build_model("vector", (D2,), D1, init=X0)), **{**base, **kw})


def rows(fed: Federation) -> list[torch.Tensor]:
    out = []
    for c in fed.clients:
        r = c.x.to(F64)
        assert torch.equal(r, r[:1].expand_as(r))  # noise-free: every row is b_i
        out.append(r[0])
    return out


def grads(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return -CURV * torch.sin(x) + a.T @ y, a @ x + b - MU * y


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)


def simulate(alg: Any, fed: Federation, rounds: int) -> list[tuple[list[int], dict[str, Any]]]:
    sim = Simulation(alg, fed, seed=3, dtype=F64)
    return [(sim.step().clients, sim.server_state) for _ in range(rounds)]


def x_of(state: dict[str, Any], key: str = "x") -> torch.Tensor:
    return tensor_leaves(state[key])[0]


def local(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, lr: float, lr_y: float, **kw):
    """Alg. 1's client loop: K simultaneous steps; ``snap`` (the "+" variants) takes ∇_y at x̂;
    ``pull`` adds −pull (y − y0) to ∇_y (the NC-C variant)."""
    snap, pull = kw.get("snap"), kw.get("pull", 0.0)
    for _ in range(k):
        gx, gy = grads(a, b, x, y)
        if snap is not None:
            gy = grads(a, b, snap, y)[1]
        gy = gy - pull * y  # y0 = 0 on R^d
        x, y = x - lr * gx, y + lr_y * gy
    return x, y


# -- FESS-GDA: η_g ≠ 1, K > 1, the smoothing coefficient η_{x,l} η_{x,g} K p -------------------
def test_fessgda_with_global_steps_and_local_steps_matches_algorithm_1_by_hand() -> None:
    fed = clean_fed(4)
    lr, lr_y, gx_, gy_, k, p, beta = 0.07, 0.05, 1.6, 0.7, 3, 0.9, 0.3
    alg = make(FESSGDA, lr=lr, lr_dual=lr_y, global_lr=gx_, global_lr_dual=gy_, local_steps=k,
               smoothing=p, beta=beta, clients_per_round=2)  # fmt: skip
    got = simulate(alg, fed, 5)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    z = x.clone()
    assert len({tuple(c) for c, _ in got}) > 1  # the sampled set changes between rounds
    for clients, state in got:
        outs = [local(a, bs[i], x, y, k, lr, lr_y) for i in clients]
        x_bar = torch.stack([o[0] for o in outs]).mean(0)
        y_bar = torch.stack([o[1] for o in outs]).mean(0)
        x_new = x + gx_ * (x_bar - x) - lr * gx_ * k * p * (x - z)  # OLD x_t, z_t
        y = y + gy_ * (y_bar - y)
        z = z + beta * (x_new - z)  # the NEW x_{t+1}
        x = x_new
        close(x_of(state), x)
        close(state["y"], y)
        close(x_of(state, "z"), z)


def test_fessgda_regularised_dual_pull_over_rounds_matches_by_hand() -> None:
    """Theorem 3.3's f̃ = f − (ε/(4D))||y − y0||²: every local y-step adds −(ε/(2D)) (y − y0)."""
    fed = clean_fed(3)
    lr, lr_y, g, k, p, beta, eps, diam = 0.06, 0.2, 1.4, 3, 0.5, 0.4, 0.8, 0.5
    alg = make(FESSGDARegularized, lr=lr, lr_dual=lr_y, global_lr=g, local_steps=k, smoothing=p, beta=beta,
               epsilon=eps, dual_diameter=diam)  # fmt: skip
    got = simulate(alg, fed, 4)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    z = x.clone()
    pull = eps / (2 * diam)
    for clients, state in got:
        outs = [local(a, bs[i], x, y, k, lr, lr_y, pull=pull) for i in clients]
        x_bar = torch.stack([o[0] for o in outs]).mean(0)
        y_bar = torch.stack([o[1] for o in outs]).mean(0)
        x_new = x + g * (x_bar - x) - lr * g * k * p * (x - z)
        y = y + g * (y_bar - y)  # global_lr_dual defaults to global_lr
        z = z + beta * (x_new - z)
        x = x_new
        close(x_of(state), x)
        close(state["y"], y)


# -- FSGDA: η_g ≠ 1 over several rounds, partial participation ---------------------------------
def test_fsgda_with_global_steps_over_rounds_matches_by_hand() -> None:
    fed = clean_fed(4)
    lr, lr_y, gx_, gy_, k = 0.08, 0.04, 1.7, 1.3, 4
    alg = make(FSGDA, lr=lr, lr_dual=lr_y, global_lr=gx_, global_lr_dual=gy_, local_steps=k, clients_per_round=3)
    got = simulate(alg, fed, 4)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    for clients, state in got:
        outs = [local(a, bs[i], x, y, k, lr, lr_y) for i in clients]
        x = x + gx_ * (torch.stack([o[0] for o in outs]).mean(0) - x)
        y = y + gy_ * (torch.stack([o[1] for o in outs]).mean(0) - y)
        close(x_of(state), x)
        close(state["y"], y)


# -- the "+" variants: K > 1, snapshot period S > 1 --------------------------------------------
def test_local_sgda_plus_with_snapshot_period_two_matches_by_hand() -> None:
    fed = clean_fed(3)
    lr, lr_y, k, s = 0.09, 0.15, 3, 2
    got = simulate(make(LocalSGDAPlus, lr=lr, lr_dual=lr_y, local_steps=k, snapshot_period=s), fed, 5)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    snap = x.clone()
    for t, (clients, state) in enumerate(got):
        outs = [local(a, bs[i], x, y, k, lr, lr_y, snap=snap) for i in clients]
        x = torch.stack([o[0] for o in outs]).mean(0)
        y = torch.stack([o[1] for o in outs]).mean(0)
        if (t + 1) % s == 0:
            snap = x.clone()
        close(x_of(state), x)
        close(state["y"], y)
        close(x_of(state, "snapshot"), snap)


def test_fed_norm_sgda_plus_with_unequal_clients_and_snapshot_period_two_matches_by_hand() -> None:
    """Fed-Norm-SGDA+: h_i = Δ_i / (η_l K), the server steps −K η_g η_l Σ_i w_i h_i with w_i ∝ n_i."""
    full = clean_fed(3)
    parts = [full.clients[0], full.clients[1].subset([0, 1]), full.clients[2].subset([0, 1, 2, 3])]
    fed = Federation("uneven", parts, full.num_classes, test=full.test)
    lr, lr_y, gx_, gy_, k, s = 0.05, 0.1, 1.5, 0.8, 3, 2
    alg = make(FedNormSGDAPlus, lr=lr, lr_dual=lr_y, global_lr=gx_, global_lr_dual=gy_, local_steps=k,
               snapshot_period=s, weighting="samples")  # fmt: skip
    got = simulate(alg, fed, 5)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    sizes = torch.tensor([len(c) for c in fed.clients], dtype=F64)
    assert sizes.tolist() == [6.0, 2.0, 4.0]
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    snap = x.clone()
    for t, (clients, state) in enumerate(got):
        w = sizes[clients] / sizes[clients].sum()
        hx = hy = 0.0
        for wi, i in zip(w, clients):
            xi, yi = local(a, bs[i], x, y, k, lr, lr_y, snap=snap)
            hx = hx + wi * (x - xi) / (lr * k)
            hy = hy + wi * (yi - y) / (lr_y * k)
        x = x - k * gx_ * lr * hx
        y = y + k * gy_ * lr_y * hy
        if (t + 1) % s == 0:
            snap = x.clone()
        close(x_of(state), x)
        close(state["y"], y)


# -- SAGDA: K > 1, several sampled clients, the control variate --------------------------------
def test_sagda_with_local_steps_and_sampled_clients_matches_by_hand() -> None:
    """Estimate rounds: v = mean over S of ∇f_i(w_t); train rounds (a fresh S'): K steps along
    ∇f_i(w) − ∇f_i(w_t) + v, then the FSGDA server step."""
    fed = clean_fed(4)
    lr, lr_y, gx_, gy_, k = 0.06, 0.09, 1.5, 1.2, 3
    alg = make(SAGDA, lr=lr, lr_dual=lr_y, global_lr=gx_, global_lr_dual=gy_, local_steps=k, clients_per_round=2)
    got = simulate(alg, fed, 6)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    vx = vy = None
    assert any(set(got[t][0]) != set(got[t + 1][0]) for t in range(0, 6, 2))  # S' differs from S somewhere
    for t, (clients, state) in enumerate(got):
        if t % 2 == 0:
            g = [grads(a, bs[i], x, y) for i in clients]
            vx, vy = torch.stack([u[0] for u in g]).mean(0), torch.stack([u[1] for u in g]).mean(0)
            close(x_of(state, "v_x"), vx)
            close(state["v_y"], vy)
            continue
        outs = []
        for i in clients:
            rx, ry = grads(a, bs[i], x, y)
            xi, yi = x.clone(), y.clone()
            for _ in range(k):
                gx, gy = grads(a, bs[i], xi, yi)
                xi, yi = xi - lr * (gx - rx + vx), yi + lr_y * (gy - ry + vy)
            outs.append((xi, yi))
        x = x + gx_ * (torch.stack([o[0] for o in outs]).mean(0) - x)
        y = y + gy_ * (torch.stack([o[1] for o in outs]).mean(0) - y)
        close(x_of(state), x)
        close(state["y"], y)


# -- P_Y after every local ascent step and after the server's extrapolation (a box Y) -----------
def test_fessgda_on_a_box_projects_every_local_step_and_the_server_step_by_hand() -> None:
    """y ← P_Y(y + η_{y,l} ∇_y f) at every local step and y_{t+1} = P_Y(y_t + η_{y,g}(ȳ − y_t)):
    with η_{y,g} > 1 the extrapolation leaves the box, so both projections are exercised."""
    fed = clean_fed(4)
    lr, lr_y, gx_, gy_, k, p, beta, low, high = 0.07, 0.3, 1.4, 1.9, 3, 0.5, 0.3, -0.15, 0.25
    alg = make(FESSGDA, lr=lr, lr_dual=lr_y, global_lr=gx_, global_lr_dual=gy_, local_steps=k, smoothing=p,
               beta=beta, clients_per_round=3, dual_set="box", dual_low=low, dual_high=high)  # fmt: skip
    got = simulate(alg, fed, 4)
    a, bs = quadratic_matrix(0, D2, D1, F64), rows(fed)
    x, y = torch.full((D1,), X0, dtype=F64), torch.zeros(D2, dtype=F64)
    z = x.clone()
    clipped = {"local": 0, "server": 0}
    for clients, state in got:
        outs = []
        for i in clients:
            xi, yi = x, y
            for _ in range(k):
                gx, gy = grads(a, bs[i], xi, yi)
                step = yi + lr_y * gy
                clipped["local"] += int(not torch.equal(step, step.clamp(low, high)))
                xi, yi = xi - lr * gx, step.clamp(low, high)
            outs.append((xi, yi))
        x_bar = torch.stack([o[0] for o in outs]).mean(0)
        y_bar = torch.stack([o[1] for o in outs]).mean(0)
        x_new = x + gx_ * (x_bar - x) - lr * gx_ * k * p * (x - z)
        step = y + gy_ * (y_bar - y)
        clipped["server"] += int(not torch.equal(step, step.clamp(low, high)))
        y = step.clamp(low, high)
        z = z + beta * (x_new - z)
        x = x_new
        close(x_of(state), x)
        close(state["y"], y)
        close(x_of(state, "z"), z)
    assert clipped["local"] > 0 and clipped["server"] > 0, clipped
