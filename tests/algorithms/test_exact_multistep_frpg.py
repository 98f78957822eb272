"""LFRPG with T = 3 slots in both readings of eq. (21a), and FRPG worker slots inside the prox
ball, over several rounds against hand loops of paper 002's Algorithms 1-2 (issue 29 item 2).

Least squares (``∇f(w; B) = Xᵀ(Xw − y)/|B| + δ w``), float64, the minibatches are the
algorithm's own draws.  The transcription (spec 002 sections 2.1-2.2)::

    β = 2/(i+2),  α_0 = δ_0/14 (i+2)² + 1.5 L_0,  α_n = 3δ/14 (i+2)² + L           (16)-(17), (27)-(28)
    server:  u_0 = (1−β) w_0 + β v_0,  w_0 ← u_0 − δ_0 u_0 / α_0                    (19a-b)
    worker, slot k:  u = (1−β) w_prev + β v                                         (21a)
             y = w_0 − u + s/α_n,  τ = λ/α_n,  z = prox_{τ p}(y),  w = w_0 − z      (21b)
             g = λ z / max(μ, ‖z‖)                                                  (20)
             v ← v − [δ (v − u) + s − g] / (δ + α_n β)                              (21c)
    upload ḡ = mean_k g;  server:  v_0 ← v_0 − [δ_0 (v_0 − u_0) + δ_0 u_0 + Σ_n Π(ḡ_n)] / (δ_0 + α_0 β)   (19c)

with ``Π`` the projection onto the ball of radius λ (spec A5), ``w_prev`` the previous slot's
model (``seq``) or slot k of the previous frame (``lit``, eq. (21a) as printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import FRPG, LFRPG
from fedrisk.algorithms.base import RoundContext
from fedrisk.attacks import SignFlipAttack
from fedrisk.data.federation import Federation
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, D, Linear

SEED, T = 0, 3


def least_squares(sizes: tuple[int, ...], seed: int) -> Federation:
    return _ls.least_squares(sizes, seed, shift=0.3, scale=1.0)


def huber_prox(y: torch.Tensor, tau: float, mu: float) -> tuple[torch.Tensor, bool]:
    """``prox_{τ p}(y)`` of the Huber penalty (30), and whether ``y`` lies inside the ball ``μ + τ``."""
    r = float(torch.linalg.vector_norm(y))
    if r <= mu + tau:
        return y * mu / (mu + tau), True
    return y * (1 - tau / r), False


def schedule(i: int, d0: float, d: float, lip: float) -> tuple[float, float, float]:
    return 2 / (i + 2), d0 / 14 * (i + 2) ** 2 + 1.5 * lip, 3 * d / 14 * (i + 2) ** 2 + lip


@pytest.mark.parametrize("variant", ["seq", "lit"])
def test_lfrpg_three_slots_over_three_frames_matches_the_hand_loop(variant: str) -> None:
    """Four workers, worker 3 Byzantine (its ḡ sign-flipped ×50, so the server's projection
    bites); the Byzantine worker's own state stays honest."""
    fed = least_squares((8, 10, 12, 9), seed=4)
    lam, mu, d, d0, lip, flip = 0.8, 1e-3, 0.05, 0.02, 4.0, 50.0
    alg = LFRPG(
        model=Linear(),
        loss=mean_squared_error,
        lam=lam,
        mu=mu,
        delta=d,
        delta_server=d0,
        lipschitz=lip,
        batch_size=4,
        local_slots_per_round=T,
        variant=variant,
    )
    sim = Simulation(alg, fed, seed=SEED, dtype=F64, attack=SignFlipAttack(flip), byzantine=[3])
    zero = torch.zeros(D, dtype=F64)
    w0, v0 = zero.clone(), zero.clone()  # zero_init
    ws = [[zero.clone() for _ in range(T)] for _ in fed.clients]  # lit: w_{n,k}^{i-1}; seq: ws[n][-1]
    vs = [zero.clone() for _ in fed.clients]
    clipped = 0
    for r in range(3):
        report = sim.step()
        beta, a0, an = schedule(r + 1, d0, d, lip)
        u0 = (1 - beta) * w0 + beta * v0
        w0 = u0 - d0 * u0 / a0  # (19a-b), fixed for the frame
        received, losses = [], []
        for n, s in enumerate(fed.clients):
            batches = alg.draw(RoundContext(r, fed_info(fed)), n, len(s), client_generator(SEED, round=r, client=n))
            w, v, gbar, slots = ws[n][-1], vs[n], zero.clone(), []
            for k in range(T):
                w_prev = ws[n][k] if variant == "lit" else w
                u = (1 - beta) * w_prev + beta * v  # (21a)
                x, y = s.x[batches["batches"][k]], s.y[batches["batches"][k]]
                grad = x.T @ (x @ u - y) / len(y) + d * u
                losses.append(float(0.5 * ((x @ u - y) ** 2).mean()) / (T * len(fed.clients)))  # at u, no ridge
                z, _ = huber_prox(w0 - u + grad / an, lam / an, mu)
                w = w0 - z  # (21b)
                g = lam * z / max(mu, float(torch.linalg.vector_norm(z)))  # (20)
                v = v - (d * (v - u) + grad - g) / (d + an * beta)  # (21c)
                gbar = gbar + g / T
                slots.append(w)
            ws[n], vs[n] = slots, v
            state = sim.client_states[n]
            got_w = state["w_slots"]["w"] if variant == "lit" else state["w"]["w"]
            torch.testing.assert_close(got_w, torch.stack(slots) if variant == "lit" else w, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(state["v"]["w"], v, rtol=1e-12, atol=1e-12)
            if n == 3:  # sign flip ×50, then the server's projection onto the λ ball
                gbar = -flip * gbar
            norm = float(torch.linalg.vector_norm(gbar))
            clipped += norm > lam
            received.append(gbar * min(1.0, lam / norm))
        v0 = v0 - (d0 * (v0 - u0) + d0 * u0 + sum(received)) / (d0 + a0 * beta)  # (19c)
        torch.testing.assert_close(sim.server_state["w"]["w"], w0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(sim.server_state["v"]["w"], v0, rtol=1e-12, atol=1e-12)
        assert report.train_metrics["loss"] == pytest.approx(sum(losses), rel=1e-12)  # mean over slots, workers
    assert clipped >= 1  # the projection was exercised
    if variant == "lit":  # the readings differ: slot k of frame i starts from slot k of frame i - 1
        assert not torch.allclose(ws[0][0], ws[0][1])


def test_frpg_worker_slots_inside_the_prox_ball_match_the_hand_loop() -> None:
    """A wide Huber zone (μ = 2): every slot's ``y`` satisfies ``‖y‖ < μ + τ``, so the prox is the
    shrink ``y μ/(μ + τ)`` and the penalty gradient ``λ z/μ`` is below its clip λ; three rounds."""
    fed = least_squares((8, 10, 12), seed=5)
    lam, mu, d, d0, lip = 1.5, 2.0, 0.05, 0.02, 4.0
    alg = FRPG(
        model=Linear(),
        loss=mean_squared_error,
        lam=lam,
        mu=mu,
        delta=d,
        delta_server=d0,
        lipschitz=lip,
        batch_size=4,
    )
    sim = Simulation(alg, fed, seed=SEED, dtype=F64)
    zero = torch.zeros(D, dtype=F64)
    w0, v0 = zero.clone(), zero.clone()
    ws = [zero.clone() for _ in fed.clients]
    vs = [zero.clone() for _ in fed.clients]
    g_norms = []
    for r in range(3):
        sim.step()
        beta, a0, an = schedule(r + 1, d0, d, lip)
        u0 = (1 - beta) * w0 + beta * v0
        w0 = u0 - d0 * u0 / a0  # (6a-b)
        g_sum = zero.clone()
        for n, s in enumerate(fed.clients):
            idx = alg.draw(RoundContext(r, fed_info(fed)), n, len(s), client_generator(SEED, round=r, client=n))
            x, y = s.x[idx["batches"][0]], s.y[idx["batches"][0]]
            u = (1 - beta) * ws[n] + beta * vs[n]  # (8a)
            grad = x.T @ (x @ u - y) / len(y) + d * u
            z, inside = huber_prox(w0 - u + grad / an, lam / an, mu)
            assert inside
            ws[n] = w0 - z  # (8b)
            g = lam * z / mu  # (7), inside the Huber zone: ‖z‖ < μ
            vs[n] = vs[n] - (d * (vs[n] - u) + grad - g) / (d + an * beta)  # (8c)
            g_sum = g_sum + g  # ‖g‖ < λ: the projection leaves it
            g_norms.append(float(torch.linalg.vector_norm(g)))
            torch.testing.assert_close(sim.client_states[n]["w"]["w"], ws[n], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(sim.client_states[n]["v"]["w"], vs[n], rtol=1e-12, atol=1e-12)
        v0 = v0 - (d0 * (v0 - u0) + d0 * u0 + g_sum) / (d0 + a0 * beta)  # (6c)
        torch.testing.assert_close(sim.server_state["w"]["w"], w0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(sim.server_state["v"]["w"], v0, rtol=1e-12, atol=1e-12)
    assert 0.05 * lam < max(g_norms) < lam  # not at its clip, and not negligible
