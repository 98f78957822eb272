"""Bulyan, MDA, Meamed, MoNNA, static clipping, ARC, centred clipping with momentum: property tests
(hypothesis), independent transcriptions, bad input, the registry."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrisk.aggregators import AGGREGATORS, InMemoryReplies
from fedrisk.aggregators.extended import (
    MDA,
    Bulyan,
    CenteredClippingMomentum,
    StaticClipping,
    arc,
    arc_clip_count,
    bulyan,
    centered_clipping_momentum,
    mda,
    meamed,
    monna,
    static_clipping,
)
from fedrisk.aggregators.robust import TrimmedMean, coordinate_median
from fedrisk.errors import FedriskError

D = torch.float64
SETTINGS = settings(max_examples=20, deadline=None)

# name -> (rule(x, f), the largest f allowed with n replies)
RULES = {
    "bulyan": (bulyan, lambda n: (n - 3) // 4),
    "mda": (mda, lambda n: min((n - 1) // 2, 3)),
    "meamed": (meamed, lambda n: (n - 1) // 2),
    "monna": (monna, lambda n: (n - 1) // 2),
}


@st.composite
def replies(draw: st.DrawFn, min_n: int = 7, max_n: int = 12) -> torch.Tensor:
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, 4))
    values = draw(st.lists(st.floats(-1, 1, allow_nan=False, width=64), min_size=n * d, max_size=n * d))
    x = torch.tensor(values, dtype=D).reshape(n, d)
    jitter = torch.rand(n, d, generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))), dtype=D)
    return x + 1e-3 * jitter  # no ties between distances (selection rules may break ties by row order)


def _distinct_distances(x: torch.Tensor) -> bool:
    d = torch.cdist(x, x)
    vals = d[torch.triu_indices(len(x), len(x), 1).unbind()]
    return len(set(torch.round(vals, decimals=9).tolist())) == len(vals)


# ----------------------------------------------------------------------------- independent transcriptions
def bulyan_reference(x: torch.Tensor, f: int) -> torch.Tensor:
    """Algorithm 1 of El Mhamdi et al. (2018) as plain loops over rows and coordinates."""
    n, d = x.shape
    remaining, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        best, best_key = None, (math.inf, math.inf)
        for i in remaining:
            dists = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in remaining if j != i)
            k = min(max(len(remaining) - f - 2, 1), len(dists))
            key = (round(sum(dists[:k]), 12), sum(dists))  # ties: the smaller total distance
            if key < best_key:
                best, best_key = i, key
        chosen.append(best)
        remaining.remove(best)
    beta = n - 4 * f
    out = torch.empty(d, dtype=x.dtype)
    for c in range(d):
        vals = sorted(float(x[i, c]) for i in chosen)
        m = len(vals)
        med = vals[m // 2] if m % 2 else (vals[m // 2 - 1] + vals[m // 2]) / 2
        closest = sorted(vals, key=lambda v: abs(v - med))[:beta]
        out[c] = sum(closest) / beta
    return out


def mda_reference(x: torch.Tensor, f: int) -> list[torch.Tensor]:
    """The means of every (n - f)-subset of smallest diameter (ties: all of them)."""
    n = x.shape[0]
    diams = {}
    for keep in itertools.combinations(range(n), n - f):
        diams[keep] = max((float(torch.linalg.vector_norm(x[i] - x[j])) for i in keep for j in keep), default=0.0)
    best = min(diams.values())
    tied = [k for k, v in diams.items() if v <= best + 1e-9]
    spread = {k: sum(float(((x[i] - x[j]) ** 2).sum()) for i in k for j in k) for k in tied}
    least = min(spread.values())  # ties in the diameter: the smaller sum of squared distances
    return [x[list(k)].mean(dim=0) for k in tied if spread[k] <= least * (1 + 1e-9) + 1e-15]


def meamed_reference(x: torch.Tensor, f: int) -> torch.Tensor:
    n, d = x.shape
    out = torch.empty(d, dtype=x.dtype)
    for c in range(d):
        vals = sorted(float(v) for v in x[:, c])
        med = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
        out[c] = sum(sorted(vals, key=lambda v: abs(v - med))[: n - f]) / (n - f)
    return out


def test_bulyan_matches_the_transcription() -> None:
    gen = torch.Generator().manual_seed(0)
    for n, f in ((7, 1), (11, 2), (15, 3)):
        x = torch.randn(n, 5, generator=gen, dtype=D)
        x[-f:] = 50 + 10 * torch.randn(f, 5, generator=gen, dtype=D)
        assert torch.allclose(bulyan(x, f), bulyan_reference(x, f), atol=1e-12)


@SETTINGS
@given(x=replies(min_n=5, max_n=9), f=st.integers(1, 2))
def test_mda_exact_matches_brute_force(x: torch.Tensor, f: int) -> None:
    if 2 * f >= x.shape[0]:
        return
    out = mda(x, f, exact=True)
    assert any(torch.allclose(out, ref, atol=1e-9) for ref in mda_reference(x, f))


def test_mda_greedy_finds_the_cluster_and_exact_refusal_names_the_limit() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(50, 20, generator=gen, dtype=D)
    x[40:] += 100.0
    out = mda(x, 10)  # C(50, 10) > MDA_MAX_SUBSETS: greedy
    assert torch.allclose(out, x[:40].mean(dim=0), atol=1e-12)
    with pytest.raises(FedriskError, match=r"C\(50, 10\) = 10272278170 subsets is refused above max_subsets = 200000"):
        mda(x, 10, exact=True)
    assert torch.allclose(mda(x[:12], 2, exact=False), mda(x[:12], 2, exact=True))  # one cluster: both agree


@SETTINGS
@given(x=replies(), f=st.integers(0, 3))
def test_meamed_matches_the_transcription(x: torch.Tensor, f: int) -> None:
    if 2 * f >= x.shape[0]:
        return
    assert torch.allclose(meamed(x, f), meamed_reference(x, f), atol=1e-12)


def test_monna_static_clipping_and_arc_by_hand() -> None:
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [30.0, 40.0]], dtype=D)
    # median (0.5, 1): distances 1.118, 1.118, 1.118, ~47 -> the first three (stable order)
    assert monna(x, 1).tolist() == pytest.approx([1 / 3, 2 / 3])
    assert static_clipping(x, 1.0).tolist() == pytest.approx([(0 + 1 + 0 + 0.6) / 4, (0 + 0 + 1 + 0.8) / 4])
    # ARC with n = 4, f = 1: k = floor(2 * 1 * 3 / 4) = 1 row clipped to the 2nd largest norm (2)
    assert arc_clip_count(4, 1) == 1
    assert torch.allclose(arc(x, 1), torch.tensor([[0, 0], [1, 0], [0, 2], [1.2, 1.6]], dtype=D))
    assert arc_clip_count(20, 4) == 6 and arc_clip_count(20, 0) == 0


def test_centered_clipping_momentum_matches_a_plain_loop_over_rounds() -> None:
    gen = torch.Generator().manual_seed(2)
    rounds = [torch.randn(6, 3, generator=gen, dtype=D) for _ in range(4)]
    for r in rounds:
        r[5] = 1e3  # one faulty client
    agg = CenteredClippingMomentum(tau=0.5, beta=0.8, iters=2)
    m = None
    v = None
    for x in rounds:
        out = agg(InMemoryReplies({k: {"g": x[k]} for k in range(6)}), "g")
        # reference: momenta start at the first reply, v at the median of the first momenta
        m = x.clone() if m is None else 0.2 * x + 0.8 * m
        if v is None:
            v = coordinate_median(m)
        for _ in range(2):
            diffs = m - v
            norms = torch.linalg.vector_norm(diffs, dim=1, keepdim=True)
            v = v + (diffs * torch.clamp(0.5 / norms, max=1.0)).mean(dim=0)
        assert torch.allclose(out, v, atol=1e-12)
    assert float(torch.linalg.vector_norm(v)) < 3.0  # the faulty client moved it by at most tau / 6 per step


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(x=replies(), seed=st.integers(0, 2**16))
def test_permutation_invariance(name: str, x: torch.Tensor, seed: int) -> None:
    rule, fmax = RULES[name]
    if name in ("bulyan", "mda") and not _distinct_distances(x):
        return  # a selection among tied rows follows row order
    f = min(1, fmax(x.shape[0]))
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    assert torch.allclose(rule(x, f), rule(x[perm], f), atol=1e-9)


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(x=replies(), shift=st.lists(st.floats(-100, 100, width=64), min_size=4, max_size=4))
def test_translation_equivariance(name: str, x: torch.Tensor, shift: list) -> None:
    rule, fmax = RULES[name]
    f = min(1, fmax(x.shape[0]))
    c = torch.tensor(shift[: x.shape[1]], dtype=D)
    assert torch.allclose(rule(x, f) + c, rule(x + c, f), atol=1e-6)


@pytest.mark.parametrize("name", [*RULES, "static_clipping"])
@SETTINGS
@given(row=st.lists(st.floats(-1e3, 1e3, width=64), min_size=1, max_size=5), n=st.integers(7, 11))
def test_idempotent_on_identical_replies(name: str, row: list, n: int) -> None:
    x = torch.tensor(row, dtype=D).repeat(n, 1)
    if name == "static_clipping":  # identical replies inside the ball are returned unchanged
        tau = float(torch.linalg.vector_norm(x[0])) + 1.0
        assert torch.allclose(static_clipping(x, tau), x[0], atol=1e-9 * (1 + tau))
        return
    rule, fmax = RULES[name]
    assert torch.allclose(rule(x, fmax(n)), x[0], atol=1e-9 * (1 + max(abs(v) for v in row)))


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(x=replies(min_n=7, max_n=13), sign=st.sampled_from([1.0, -1.0]), mixed=st.booleans())
def test_bounded_output_with_f_outliers(name: str, x: torch.Tensor, sign: float, mixed: bool) -> None:
    rule, fmax = RULES[name]
    n, d = x.shape
    f = fmax(n)
    bad = torch.full((f, d), sign * 1e6, dtype=D)
    if mixed:
        bad[::2] = -bad[::2]
    honest = x[: n - f]
    out = rule(torch.cat([honest, bad]), f)
    lo, hi = honest.min(dim=0).values, honest.max(dim=0).values
    assert bool(((out >= lo - 1e-9) & (out <= hi + 1e-9)).all()), (out, lo, hi)


@SETTINGS
@given(x=replies(), tau=st.floats(0.01, 10))
def test_static_clipping_moves_at_most_tau_over_n_per_reply(x: torch.Tensor, tau: float) -> None:
    y = x.clone()
    y[0] = 1e9
    gap = float(torch.linalg.vector_norm(static_clipping(y, tau) - static_clipping(x, tau)))
    assert gap <= 2 * tau / x.shape[0] + 1e-9


@SETTINGS
@given(x=replies(min_n=5, max_n=12), f=st.integers(0, 5))
def test_arc_clips_exactly_k_rows_to_the_next_norm(x: torch.Tensor, f: int) -> None:
    n = x.shape[0]
    if 2 * f >= n:
        return
    out = arc(x, f)
    k = arc_clip_count(n, f)
    norms = torch.linalg.vector_norm(x, dim=1)
    order = torch.sort(norms, descending=True, stable=True).indices
    changed = [i for i in range(n) if not torch.equal(out[i], x[i])]
    assert set(changed) <= set(order[:k].tolist())
    if k:
        radius = float(norms[order[k]])
        assert float(torch.linalg.vector_norm(out, dim=1).max()) <= radius + 1e-9


def test_aggregator_classes_registry_and_pre_arc() -> None:
    for name in ("bulyan", "mda", "meamed", "monna", "static_clipping", "centered_clipping_momentum"):
        assert name in AGGREGATORS.names()
    x = torch.randn(11, 3, generator=torch.Generator().manual_seed(3), dtype=D)
    r = InMemoryReplies({k: {"w": x[k]} for k in range(11)})
    assert torch.allclose(Bulyan(f=2)(r, "w"), bulyan(x, 2))
    assert torch.allclose(MDA(f=2)(r, "w"), mda(x, 2))
    assert torch.allclose(StaticClipping(tau=0.5)(r, "w"), static_clipping(x, 0.5))
    assert torch.allclose(TrimmedMean(f=2, pre="arc")(r, "w"), TrimmedMean(f=2).rule(arc(x, 2), 2))


def test_bad_input_names_the_limit() -> None:
    x = torch.randn(10, 2, dtype=D)
    need = r"^bulyan: f = 2 is not allowed with n = 10 replies; it needs n >= 4f \+ 3$"
    with pytest.raises(FedriskError, match=need):
        bulyan(x, 2)
    for rule in (meamed, monna, mda, arc):
        with pytest.raises(FedriskError, match=r"f = 5 is not allowed with n = 10 replies; it needs 2f < n"):
            rule(x, 5)
    with pytest.raises(FedriskError, match="tau = 0 is not allowed"):
        static_clipping(x, 0)
    with pytest.raises(FedriskError, match=r"beta = 1\.0 is not allowed"):
        centered_clipping_momentum(x, x, x[0], beta=1.0)
    with pytest.raises(FedriskError, match="pre-aggregation is not supported"):
        CenteredClippingMomentum(pre="nnm")
    with pytest.raises(FedriskError, match=r"NaN/inf"):
        bulyan(torch.tensor([[float("nan")]] * 7), 1)


def test_bulyan_and_mda_scale() -> None:
    """A scaled-down ``benchmarks/robust_aggregators.py --n 50 --d 100000 --f 10``: no loop over
    coordinates, and MDA's greedy search (C(50, 10) ~ 1e10 subsets) instead of enumeration."""
    import time

    x = torch.randn(50, 20_000, generator=torch.Generator().manual_seed(0))
    x[40:] *= 1e4
    for rule in (lambda: bulyan(x, 10), lambda: mda(x, 10), lambda: mda(x, 3, exact=True)):
        t = time.perf_counter()
        out = rule()
        assert time.perf_counter() - t < 10.0  # generous: loaded CI machines
        assert out.shape == (20_000,)
    assert float(bulyan(x, 10).abs().max()) < 10 and float(mda(x, 10).abs().max()) < 10  # honest rows: N(0, 1)
