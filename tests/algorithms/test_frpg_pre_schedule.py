"""FRPG / LFRPG with a server pre-aggregation and a lambda schedule (``algorithm.pre``,
``algorithm.lam_schedule``; issue 26 item 4) over several rounds against hand loops.

Least squares (``∇f(w; B) = Xᵀ(Xw − y)/|B| + δ w``), float64, the minibatches are the
algorithm's own draws, one Byzantine worker sign-flips its message ×50 so the projection bites.
The transcription (spec 002 sections 2.1-2.2, with ``λ`` replaced by ``λ_k``)::

    β, α_0, α_n of slot / frame k                                          (16)-(17), (27)-(28)
    server:  u_0 = (1−β) w_0 + β v_0,  w_0 ← u_0 − δ_0 u_0 / α_0              (6a-b), (19a-b)
    worker slot:  u = (1−β) w + β v,  z = prox_{(λ_k/α_n) p}(w_0 − u + s/α_n),  w = w_0 − z
                  g = λ_k z / max(μ, ‖z‖),  v ← v − [δ (v − u) + s − g] / (δ + α_n β)
    server:  rows = pre(g_1..g_n) (m rows),  Σ = (n/m) Σ_j Π_{λ_k}(rows_j)
             v_0 ← v_0 − [δ_0 (v_0 − u_0) + δ_0 u_0 + Σ] / (δ_0 + α_0 β)         (6c), (19c)

with NNM row i = the mean of its n − f nearest rows (itself included) and bucketing = the means
of consecutive pairs of the server generator's permutation.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import FRPG, LFRPG
from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.attacks import SignFlipAttack
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator, server_generator
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, D, Linear

SEED, FLIP = 0, 50.0
LAM, MU, DELTA, DELTA0, LIP = 0.8, 1e-3, 0.05, 0.02, 4.0


def huber_prox(y: torch.Tensor, tau: float, mu: float) -> torch.Tensor:
    r = float(torch.linalg.vector_norm(y))
    return y * mu / (mu + tau) if r <= mu + tau else y * (1 - tau / r)


def nnm(rows: list[torch.Tensor], f: int) -> list[torch.Tensor]:
    out = []
    for a in rows:
        near = sorted(range(len(rows)), key=lambda j: float(torch.linalg.vector_norm(a - rows[j])))
        out.append(sum(rows[j] for j in near[: len(rows) - f]) / (len(rows) - f))
    return out


def pairs(rows: list[torch.Tensor], r: int) -> list[torch.Tensor]:
    perm = torch.randperm(len(rows), generator=server_generator(SEED, r, "aggregate")).tolist()
    return [sum(rows[j] for j in perm[i : i + 2]) / len(perm[i : i + 2]) for i in range(0, len(perm), 2)]


def hand_loop(alg: FRPG, fed, rounds: int, slots: int, lams: list[float], pre) -> list[tuple]:
    """The server's (w_0, v_0) after each round; ``pre(rows, r)`` the pre-aggregation."""
    zero = torch.zeros(D, dtype=F64)
    w0, v0 = zero.clone(), zero.clone()
    ws, vs = [zero.clone() for _ in fed.clients], [zero.clone() for _ in fed.clients]
    out, clipped = [], 0
    for r in range(rounds):
        lam = lams[r]
        beta, a0, an = 2 / (r + 3), DELTA0 / 14 * (r + 3) ** 2 + 1.5 * LIP, 3 * DELTA / 14 * (r + 3) ** 2 + LIP
        u0 = (1 - beta) * w0 + beta * v0
        w0 = u0 - DELTA0 * u0 / a0
        rows = []
        for n, s in enumerate(fed.clients):
            idx = alg.draw(RoundContext(r, fed_info(fed)), n, len(s), client_generator(SEED, round=r, client=n))
            gbar = zero.clone()
            for k in range(slots):
                u = (1 - beta) * ws[n] + beta * vs[n]
                x, y = s.x[idx["batches"][k]], s.y[idx["batches"][k]]
                grad = x.T @ (x @ u - y) / len(y) + DELTA * u
                z = huber_prox(w0 - u + grad / an, lam / an, MU)
                ws[n] = w0 - z
                g = lam * z / max(MU, float(torch.linalg.vector_norm(z)))
                vs[n] = vs[n] - (DELTA * (vs[n] - u) + grad - g) / (DELTA + an * beta)
                gbar = gbar + g / slots
            rows.append(-FLIP * gbar if n == len(fed.clients) - 1 else gbar)
        mixed = pre(rows, r)
        norms = [float(torch.linalg.vector_norm(g)) for g in mixed]
        clipped += sum(v > lam for v in norms)
        total = sum(g * min(1.0, lam / v) for g, v in zip(mixed, norms, strict=True)) * (len(rows) / len(mixed))
        v0 = v0 - (DELTA0 * (v0 - u0) + DELTA0 * u0 + total) / (DELTA0 + a0 * beta)
        out.append((w0, v0))
    assert clipped >= 1  # the projection was exercised
    return out


def common(**kw) -> dict:
    return dict(model=Linear(), loss=mean_squared_error, lam=LAM, mu=MU, delta=DELTA, delta_server=DELTA0,
                lipschitz=LIP, batch_size=4, **kw)  # fmt: skip


def run(alg: FRPG, fed, rounds: int) -> list[tuple]:
    sim = Simulation(alg, fed, seed=SEED, dtype=F64, attack=SignFlipAttack(FLIP), byzantine=[len(fed.clients) - 1])
    states = []
    for _ in range(rounds):
        sim.step()
        states.append((sim.server_state["w"]["w"].clone(), sim.server_state["v"]["w"].clone()))
    return states


def assert_same(got: list[tuple], want: list[tuple]) -> None:
    for (gw, gv), (ww, wv) in zip(got, want, strict=True):
        torch.testing.assert_close(gw, ww, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gv, wv, rtol=1e-12, atol=1e-12)


def test_frpg_with_nnm_and_a_geometric_lambda_matches_the_hand_loop() -> None:
    """Four rounds, five workers, NNM with f = 1 and lambda_k = 0.8 * 0.6^(k-1)."""
    fed = _ls.least_squares((8, 10, 12, 9, 11), 4, shift=0.3, scale=1.0)
    alg = FRPG(**common(pre="nnm", pre_f=1, lam_schedule="geometric", lam_decay=0.6))
    lams = [LAM * 0.6**r for r in range(4)]
    want = hand_loop(alg, fed, 4, 1, lams, lambda rows, r: nnm(rows, 1))
    assert_same(run(alg, fed, 4), want)
    plain = hand_loop(FRPG(**common()), fed, 4, 1, [LAM] * 4, lambda rows, r: rows)
    assert not torch.allclose(plain[-1][1], want[-1][1], rtol=1e-3)  # the new keys change the run


@pytest.mark.parametrize(
    ("schedule", "lams"), [("list", [0.9, 0.5, 1.3, 1.3]), ("sqrt", [0.4 * math.sqrt(k) for k in (1, 2, 3, 4)])]
)
def test_lfrpg_three_slots_with_bucketing_and_a_lambda_schedule_matches_the_hand_loop(schedule, lams) -> None:
    """Four frames of T = 3 slots (seq), five workers in buckets of 2 (m = 3 rows, Σ scaled by
    5/3); lambda_k from a list (the last value kept past its end) or 0.4 sqrt(k)."""
    fed = _ls.least_squares((8, 10, 12, 9, 11), 6, shift=0.3, scale=1.0)
    extra = {"lam_values": (0.9, 0.5, 1.3)} if schedule == "list" else {"lam": 0.4}
    alg = LFRPG(**{**common(pre="bucketing", bucket_size=2, lam_schedule=schedule), **extra}, local_slots_per_round=3)
    want = hand_loop(alg, fed, 4, 3, lams, pairs)
    assert_same(run(alg, fed, 4), want)


def test_max_norm_reads_the_round_lambda_and_the_pre_aggregation() -> None:
    """The defence-aware attacker sends norm lambda_k in round k (lam_schedule) and models the
    server's pre-aggregation in the aggregate it line-searches against."""
    from fedrisk.attacks import MaxNorm
    from fedrisk.attacks.defence import defence_of

    alg = FRPG(**common(lam_schedule="list", lam_values=(0.5, 2.0), pre="nnm", pre_f=1))
    attack = MaxNorm()
    attack.prepare(alg, FedInfo(4, (5,) * 4, 1), [3])
    honest = torch.tensor([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [1.0, -1.0, 0.0]], dtype=F64)
    for r, lam in ((0, 0.5), (1, 2.0), (5, 2.0)):
        attack.round = r
        forged = attack.forge(honest, honest[:1], torch.Generator())
        assert float(torch.linalg.vector_norm(forged)) == pytest.approx(lam)
    rows = torch.cat([honest, forged])
    mixed = nnm(list(rows), 1)
    expected = torch.stack([g * min(1.0, 2.0 / float(torch.linalg.vector_norm(g))) for g in mixed]).mean(0)
    torch.testing.assert_close(defence_of(alg).in_round(1).aggregate(rows, None), expected)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"pre": "median"}, r"unknown pre-aggregation \(algorithm.pre\) 'median'"),
        ({"pre_f": 2}, r"^algorithm.pre_f = 2 is used only with pre = 'nnm' or 'arc'"),
        ({"lam_decay": 0.5}, r"^algorithm.lam_decay = 0.5 is used only with lam_schedule = 'geometric'"),
        ({"lam_schedule": "list"}, r"^algorithm.lam_values \(one lambda per round\) is needed with"),
        ({"lam_values": (1.0,)}, r"^algorithm.lam_values .* only then \(lam_schedule = 'constant'"),
        ({"lam_schedule": "list", "lam_values": (1.0, 0.0)}, r"^algorithm.lam_values\[1\] = 0.0 is not allowed"),
        ({"lam_schedule": "cosine"}, r"unknown lam_schedule 'cosine'"),
        ({"nonfinite": "keep"}, r"^algorithm.nonfinite = 'keep' is not allowed; valid choices: raise, exclude$"),
    ],
)
def test_bad_pre_aggregation_and_schedule_keys_are_named(kw, msg) -> None:
    with pytest.raises(FedriskError, match=msg):
        FRPG(**common(**kw))


def test_nnm_f_above_half_the_workers_is_refused_before_round_0() -> None:
    fed = _ls.least_squares((8, 10, 12, 9), 1)
    with pytest.raises(FedriskError, match=r"^algorithm.pre_f = 2 is not allowed with 4 workers: pre = 'nnm' needs"):
        Simulation(FRPG(**common(pre="nnm", pre_f=2)), fed, seed=SEED, dtype=F64)


@pytest.mark.parametrize("bucket_size", [2, 3])
def test_bucketed_message_sum_is_rescaled_by_workers_over_buckets(bucket_size: int) -> None:
    """(6c)'s sum after bucketing four width-4 messages: the m bucket means, each projected on the
    λ-ball, summed and scaled by n / m (a width equal to the worker count, so a rescale that read
    the messages' width instead of their count would go unnoticed elsewhere; pinned by mutation
    testing, frpg scope)."""
    from fedrisk.aggregators import InMemoryReplies

    rows = [
        torch.tensor(v, dtype=F64)
        for v in ([1.0, 0.0, 2.0, 0.5], [0.2, -1.0, 0.0, 0.3], [0.0, 0.4, -0.6, 1.0], [3.0, 1.0, 0.0, -2.0])
    ]
    replies = InMemoryReplies({k: {"g": g} for k, g in enumerate(rows)})
    lam = 1.1
    alg = FRPG(**common(pre="bucketing", bucket_size=bucket_size))
    got = alg.message_sum(replies, lam, torch.Generator().manual_seed(7))
    perm = torch.randperm(4, generator=torch.Generator().manual_seed(7)).tolist()
    buckets = [perm[i : i + bucket_size] for i in range(0, 4, bucket_size)]
    means = [sum(rows[j] for j in b) / len(b) for b in buckets]
    projected = [g * min(1.0, lam / float(torch.linalg.vector_norm(g))) for g in means]
    assert any(float(torch.linalg.vector_norm(g)) > lam for g in means)  # the projection acted
    torch.testing.assert_close(got, sum(projected) * (4 / len(buckets)), rtol=1e-12, atol=1e-12)
