"""Exact multi-round check of CODASCA at non-trivial parameters (issue 29 item 2).

CODASCA (Yuan et al. 2021, Alg. 4 = DSGSCA+, spec 000 §2.5) with a global step ``η_g ∉ {1}``
(extrapolating and damping), ``I = 3`` local steps per window, three clients of unequal sizes and
class mixes, a proximal term, over four rounds of one endless stage, against a plain loop written
from the algorithm box: the AUC min-max objective eq. (2) of a linear scorer ``h(w; x) = xᵀw``
differentiated by hand (batch means, masked terms included), the corrected local steps
``v ← v − η_l (g_v − c_v^k + c_v)``, ``α ← α + η_l (g_α − c_α^k + c_α)``, the control variates of
eq. (6) (with the *old* global ``c``) or eq. (7) (the window's mean direction, prox included), the
global ``c = mean_k c^k`` and the server extrapolation ``v_r = v_{r−1} + η_g (v̂_r − v_{r−1})``.
The minibatches are the algorithm's own draws (``alg.draw`` with the simulation's generators);
the arithmetic is the hand loop's.
"""

from __future__ import annotations

import pytest
import torch

from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.codasca import CODASCA
from fedrisk.data.federation import Federation, Samples
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

F64 = torch.float64
D, SEED, ROUNDS, WINDOW = 3, 0, 4, 3
W0 = (0.2, -0.1, 0.3)


class Linear:
    """``h(w; x) = xᵀ w`` from a fixed start (no randomness outside the minibatch draws)."""

    def init_params(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"w": torch.tensor(W0, dtype=F64)}

    def apply(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return x @ params["w"]


def federation() -> Federation:
    """Three clients, unequal sizes and positive ratios, shifted features (heterogeneous)."""
    g = torch.Generator().manual_seed(1)
    clients = []
    for k, (n, pos) in enumerate(((8, 3), (10, 6), (12, 2))):
        y = torch.zeros(n, dtype=torch.long)
        y[:pos] = 1
        x = torch.randn(n, D, generator=g, dtype=F64) + 0.4 * k + 0.8 * y[:, None].to(F64)
        clients.append(Samples(x, y))
    return Federation("auc-toy", clients, num_classes=2)


def auc_grads(w, a, b, alpha, x, y, p):
    """Eq. (2)'s batch mean for ``h = xᵀw``: (∇_w, ∂_a, ∂_b, ∂_α), by hand."""
    pos = (y == 1).to(F64)
    neg = 1.0 - pos
    h = x @ w
    dh = 2 * (1 - p) * (h - a) * pos + 2 * p * (h - b) * neg + 2 * (1 + alpha) * (p * neg - (1 - p) * pos)
    g_w = (dh[:, None] * x).mean(0)
    g_a = (-2 * (1 - p) * (h - a) * pos).mean()
    g_b = (-2 * p * (h - b) * neg).mean()
    g_alpha = (2 * h * (p * neg - (1 - p) * pos)).mean() - 2 * p * (1 - p) * alpha
    return g_w, g_a, g_b, g_alpha


def as_vec(v: dict) -> torch.Tensor:
    return torch.cat([v["model"]["w"], v["a"].reshape(1), v["b"].reshape(1)])


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("control_variate", ["difference", "gradient_mean"])
@pytest.mark.parametrize("global_lr", [1.4, 0.7])
@pytest.mark.parametrize(
    ("stage_iters", "reset"),
    [(None, False), (2 * WINDOW, False), (2 * WINDOW, True)],
    ids=["one-stage", "two-windows-per-stage", "two-windows-per-stage-reset"],
)
def test_codasca_with_global_step_and_local_windows_over_rounds_matches_algorithm_4(
    control_variate: str, global_lr: float, stage_iters: int | None, reset: bool
) -> None:
    """With ``stage_iters = 2 I`` a stage ends after every second round (Alg. 3): the next stage
    starts from the last server iterate (``stage_output = "last"``), which becomes the prox
    reference ``v_0^s``, the step is divided by ``lr_decay``, and the control variates carry on;
    with ``reset_control_variates`` (Alg. 4's box) every ``c^k`` and ``c`` restart at 0 at the
    stage's end, so the next stage's first window is a plain CODA+ window."""
    fed = federation()
    lr0, lam, bs, decay = 0.1, 0.05, 4, 3.0
    alg = CODASCA(model=Linear(), lr=lr0, window=WINDOW, stage_iters=stage_iters, prox_coef=lam, batch_size=bs,
                  lr_decay=decay, global_lr=global_lr, control_variate=control_variate,
                  stage_output="last", reset_control_variates=reset)  # fmt: skip
    kinds = [alg.schedule(r).kind for r in range(ROUNDS)]
    assert kinds == (["train"] * ROUNDS if stage_iters is None else ["train", "stage_end"] * 2)
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    got = []
    for _ in range(ROUNDS):
        assert sim.step().clients == [0, 1, 2]
        got.append(sim.server_state)

    K = len(fed.clients)
    p = sum(float((c.y == 1).to(F64).mean()) for c in fed.clients) / K  # "global": the clients' mean ratio
    # the primal v = (w, a, b) as one vector; α a scalar
    v = torch.tensor([*W0, 0.0, 0.0], dtype=F64)
    ref = v.clone()  # the stage's prox reference v_0
    alpha = torch.zeros((), dtype=F64)
    c_v, c_a = torch.zeros(D + 2, dtype=F64), torch.zeros((), dtype=F64)
    ck_v, ck_a = [c_v.clone() for _ in range(K)], [c_a.clone() for _ in range(K)]
    largest = 0.0
    for r in range(ROUNDS):
        stage = 0 if stage_iters is None else r // 2
        lr = lr0 / decay**stage
        if stage_iters is not None and r % 2 == 0:
            ref = v.clone()  # the new stage's start is its prox reference
        ctx = RoundContext(r, fed_info(fed))
        ends_v, ends_a, new_ck_v, new_ck_a = [], [], [], []
        for k, s in enumerate(fed.clients):
            idx = alg.draw(ctx, k, len(s), client_generator(SEED, round=r, client=k))["batches"]
            assert idx.shape == (WINDOW, bs)
            vk, ak = v.clone(), alpha.clone()
            sum_v, sum_a = torch.zeros_like(v), torch.zeros_like(alpha)
            for t in range(WINDOW):
                g_w, g_a, g_b, g_alpha = auc_grads(vk[:D], vk[D], vk[D + 1], ak, s.x[idx[t]], s.y[idx[t]], p)
                g_v = torch.cat([g_w, g_a[None], g_b[None]]) + lam * (vk - ref)  # ∇_v F_k^s, prox included
                sum_v, sum_a = sum_v + g_v, sum_a + g_alpha
                vk, ak = vk - lr * (g_v - ck_v[k] + c_v), ak + lr * (g_alpha - ck_a[k] + c_a)
            if control_variate == "difference":  # eq. (6), with the OLD global c
                new_ck_v.append(ck_v[k] - c_v + (v - vk) / (WINDOW * lr))
                new_ck_a.append(ck_a[k] - c_a + (ak - alpha) / (WINDOW * lr))
            else:  # eq. (7): the mean of the window's uncorrected directions
                new_ck_v.append(sum_v / WINDOW)
                new_ck_a.append(sum_a / WINDOW)
            ends_v.append(vk)
            ends_a.append(ak)
        ck_v, ck_a = new_ck_v, new_ck_a
        c_v, c_a = torch.stack(ck_v).mean(0), torch.stack(ck_a).mean(0)
        largest = max(largest, float(c_v.abs().max()))
        if reset and r % 2 == 1:  # the stage ends: c^k = 0 and c = 0 for the next stage
            ck_v, ck_a = [torch.zeros_like(c_v) for _ in range(K)], [torch.zeros_like(c_a) for _ in range(K)]
            c_v, c_a = torch.zeros_like(c_v), torch.zeros_like(c_a)
        v = v + global_lr * (torch.stack(ends_v).mean(0) - v)  # the server extrapolation, η_g
        alpha = alpha + global_lr * (torch.stack(ends_a).mean(0) - alpha)

        state = got[r]
        close(as_vec(state["v"]), v)
        close(state["alpha"], alpha)
        close(as_vec(state["c_v"]), c_v)
        close(state["c_alpha"], c_a)
    assert largest > 1e-3 and float(alpha.abs()) > 1e-3  # the corrections are not trivially 0
