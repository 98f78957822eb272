"""Robust aggregators: pinned values, property tests (hypothesis), bad input, the registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrisk.aggregators import AGGREGATORS, InMemoryReplies
from fedrisk.aggregators.preaggregation import bucketing, nearest_neighbor_mixing
from fedrisk.aggregators.robust import (
    CenteredClipping,
    GeometricMedian,
    Krum,
    MultiKrum,
    TrimmedMean,
    centered_clipping,
    centred_gram,
    coordinate_median,
    geometric_median,
    krum,
    krum_scores,
    mean,
    multi_krum,
    pairwise_sq_distances,
    trimmed_mean,
)
from fedrisk.errors import FedriskError

D = torch.float64
SETTINGS = settings(max_examples=40, deadline=None)


def max_f(n: int, need: str) -> int:
    """The largest f the rule allows with n replies."""
    return (n - 1) // 2 if need == "2f < n" else max(0, (n - 3) // 2)


# rule name -> (callable(x, f) , condition on f, translation equivariant)
RULES = {
    "mean": (lambda x, f: mean(x), None),
    "median": (lambda x, f: coordinate_median(x), "2f < n"),
    "trimmed_mean": (lambda x, f: trimmed_mean(x, f), "2f < n"),
    "krum": (lambda x, f: krum(x, f), "n > 2f + 2"),
    "multi_krum": (lambda x, f: multi_krum(x, f), "n > 2f + 2"),
    "geometric_median": (lambda x, f: geometric_median(x, tol=1e-12, max_iter=5000), "2f < n"),
    "centered_clipping": (lambda x, f: centered_clipping(x, tau=0.5, iters=3), "2f < n"),
}


@st.composite
def replies(draw: st.DrawFn, min_n: int = 3, max_n: int = 11) -> torch.Tensor:
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, 4))
    values = draw(st.lists(st.floats(-1, 1, allow_nan=False, width=64), min_size=n * d, max_size=n * d))
    return torch.tensor(values, dtype=D).reshape(n, d)


def _f(x: torch.Tensor, need: str | None) -> int:
    return 0 if need is None else min(1, max_f(x.shape[0], need))


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(x=replies(min_n=5), seed=st.integers(0, 2**16))
def test_permutation_invariance(name: str, x: torch.Tensor, seed: int) -> None:
    rule, need = RULES[name]
    f = _f(x, need)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    a, b = rule(x, f), rule(x[perm], f)
    if name in ("krum", "multi_krum"):  # ties in the scores may pick another row of equal score
        scores = krum_scores(x, f)
        if name == "krum":
            assert float(krum_scores(x[perm], f).min()) == pytest.approx(float(scores.min()), abs=1e-9)
            assert any(torch.allclose(b, row, atol=1e-12) for row in x)
            return
        if len(set(torch.round(scores, decimals=9).tolist())) < x.shape[0]:
            return
    # the geometric median's distances come from a Gram matrix: a reply that z meets gets its weight
    # from rounding (about 1e-8 x the spread) rather than from the eps = 1e-8 floor
    atol = 1e-7 * (1 + float(x.abs().max())) if name == "geometric_median" else 1e-9
    assert torch.allclose(a, b, atol=atol), (a, b)


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(x=replies(min_n=5), shift=st.lists(st.floats(-100, 100, width=64), min_size=4, max_size=4))
def test_translation_equivariance(name: str, x: torch.Tensor, shift: list) -> None:
    rule, need = RULES[name]
    f = _f(x, need)
    c = torch.tensor(shift[: x.shape[1]], dtype=D)
    a, b = rule(x, f) + c, rule(x + c, f)
    if name == "krum":
        scores = krum_scores(x, f)
        best = scores.min()
        ties = [i for i in range(len(scores)) if abs(float(scores[i] - best)) <= 1e-7 * (1 + float(best))]
        assert any(torch.allclose(b, x[i] + c, atol=1e-7) for i in ties)
        return
    if name == "multi_krum" and len(set(torch.round(krum_scores(x, f), decimals=6).tolist())) < x.shape[0]:
        return
    assert torch.allclose(a, b, atol=1e-6), (a, b)


@pytest.mark.parametrize("name", list(RULES))
@SETTINGS
@given(row=st.lists(st.floats(-1e3, 1e3, width=64), min_size=1, max_size=5), n=st.integers(5, 9))
def test_idempotent_on_identical_replies(name: str, row: list, n: int) -> None:
    rule, need = RULES[name]
    x = torch.tensor(row, dtype=D).repeat(n, 1)
    assert torch.allclose(rule(x, _f(x, need)), x[0], atol=1e-9 * (1 + max(abs(v) for v in row)))


@pytest.mark.parametrize("name", [k for k in RULES if k != "mean"])
@SETTINGS
@given(x=replies(min_n=7, max_n=13), sign=st.sampled_from([1.0, -1.0]), mixed=st.booleans())
def test_bounded_output_with_f_outliers(name: str, x: torch.Tensor, sign: float, mixed: bool) -> None:
    rule, need = RULES[name]
    n, d = x.shape
    f = max_f(n, need)
    bad = torch.full((f, d), sign * 1e6, dtype=D)
    if mixed:
        bad[::2] = -bad[::2]
    honest = x[: n - f]
    out = rule(torch.cat([honest, bad]), f)
    lo, hi = honest.min(dim=0).values, honest.max(dim=0).values
    if name in ("median", "trimmed_mean", "krum", "multi_krum"):
        assert bool(((out >= lo - 1e-9) & (out <= hi + 1e-9)).all()), (out, lo, hi)
    elif name == "centered_clipping":  # the median stays in the honest range, 3 steps of at most tau = 0.5
        assert bool(((out >= lo - 1.5 - 1e-9) & (out <= hi + 1.5 + 1e-9)).all())
    else:  # geometric median: within C * (honest diameter) of the honest points, C = 2(n - f) / (n - 2f) + 1
        h = n - f
        c = 2 * h / (h - f) + 1
        diam = 2 * math.sqrt(d)
        assert float(torch.linalg.vector_norm(out - honest.mean(dim=0))) <= c * diam + 1e-6


def test_mean_breaks_with_one_outlier() -> None:
    x = torch.tensor([[0.0], [0.0], [0.0], [1e6]], dtype=D)
    assert float(mean(x)) == 2.5e5
    assert float(coordinate_median(x)) == 0.0


def test_pinned_values() -> None:
    x = torch.tensor([[0.0, 10.0], [1.0, 11.0], [2.0, 9.0], [3.0, 12.0], [100.0, -100.0]], dtype=D)
    assert coordinate_median(x).tolist() == [2.0, 10.0]
    assert coordinate_median(x[:4]).tolist() == [1.5, 10.5]
    assert trimmed_mean(x, 1).tolist() == pytest.approx([2.0, 10.0])
    assert trimmed_mean(x, 2).tolist() == pytest.approx([2.0, 10.0])
    # Krum with f = 1 (n - f - 2 = 2 neighbours): scores by hand
    y = torch.tensor([[0.0], [1.0], [3.0], [4.0], [10.0]], dtype=D)
    assert krum_scores(y, 1).tolist() == pytest.approx([10.0, 5.0, 5.0, 10.0, 85.0])
    assert krum(y, 1).tolist() == [1.0]  # lowest index among the ties 1 and 3
    assert multi_krum(y, 1, 2).tolist() == [2.0]
    assert multi_krum(y, 1, 1).tolist() == krum(y, 1).tolist()
    # geometric median of a symmetric configuration plus a far point: the centre of the square
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1e6, 1e6]], dtype=D)
    assert geometric_median(z, tol=1e-12).tolist() == pytest.approx([0.5, 0.5], abs=1e-6)


def test_geometric_median_minimises_sum_of_distances() -> None:
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0), dtype=D)
    z = geometric_median(x, tol=1e-12, max_iter=10000)
    cost = lambda p: float(torch.linalg.vector_norm(x - p, dim=1).sum())  # noqa: E731
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        assert cost(z) <= cost(z + 1e-3 * torch.randn(3, generator=gen, dtype=D)) + 1e-12
    # a reply exactly at the optimum (zero distance) is handled by the eps floor
    at = torch.tensor([[0.0], [0.0], [0.0], [5.0]], dtype=D)
    assert geometric_median(at).tolist() == pytest.approx([0.0], abs=1e-6)


def test_distances_survive_a_far_outlier_in_float32() -> None:
    x = torch.tensor([[0.0], [1.0], [1.5], [3.0], [1e6]])
    d = pairwise_sq_distances(x)
    assert d[1, 2].item() == pytest.approx(0.25, rel=1e-6)
    assert krum(x, 1).tolist() == [1.0]


def _weiszfeld_reference(x: torch.Tensor, tol: float, max_iter: int, eps: float) -> torch.Tensor:
    """The textbook iteration on the replies themselves, O(nd) per step (what the Gram version replaces)."""
    z = x.mean(dim=0)
    for _ in range(max_iter):
        w = 1.0 / torch.linalg.vector_norm(x - z, dim=1).clamp_min(eps)
        new = (w @ x) / w.sum()
        step, z = float(torch.linalg.vector_norm(new - z)), new
        if step <= tol * max(1.0, float(torch.linalg.vector_norm(z))):
            break
    return z


@pytest.mark.parametrize("scale, offset", [(1.0, 0.0), (1e4, 0.0), (1e8, 0.0), (1.0, 1e3)])
def test_gram_based_rules_match_the_direct_formulas(scale: float, offset: float) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(25, 40, generator=gen, dtype=D) + offset
    x[20:] = x[20:] * scale + 5.0
    direct = torch.cdist(x, x) ** 2
    assert torch.allclose(pairwise_sq_distances(x), direct, rtol=1e-9, atol=1e-9 * (1 + offset**2))
    for tol, max_iter in ((1e-7, 1000), (1e-12, 5000), (1e-3, 3)):
        ref = _weiszfeld_reference(x, tol, max_iter, 1e-8)
        assert torch.allclose(geometric_median(x, tol=tol, max_iter=max_iter), ref, rtol=1e-9, atol=1e-9)


def test_centred_gram_over_several_column_blocks() -> None:
    x = torch.randn(4, 70_000, generator=torch.Generator().manual_seed(0), dtype=D)  # > 2^16 columns
    c = x[1]
    assert torch.allclose(centred_gram(x, c), (x - c) @ (x - c).T, rtol=1e-12, atol=1e-9)


def test_distances_survive_a_common_offset_in_float32() -> None:
    gen = torch.Generator().manual_seed(1)
    x = 1e4 + torch.randn(10, 1000, generator=gen)  # float32; the offset's square is 1e8 per coordinate
    direct = torch.cdist(x.double() - 1e4, x.double() - 1e4) ** 2
    assert torch.allclose(pairwise_sq_distances(x).double(), direct, rtol=1e-3)
    gm = geometric_median(x).double()
    assert torch.allclose(gm, _weiszfeld_reference(x.double(), 1e-7, 1000, 1e-8), rtol=0, atol=3e-3)  # ulp(1e4) = 1e-3


def test_preaggregation() -> None:
    x = torch.arange(6.0, dtype=D).reshape(6, 1)
    b = bucketing(x, 2, torch.Generator().manual_seed(0))
    assert b.shape == (3, 1) and float(b.mean()) == pytest.approx(2.5)
    assert bucketing(x, 4, torch.Generator().manual_seed(0)).shape == (2, 1)  # the last bucket is smaller
    mixed = nearest_neighbor_mixing(torch.tensor([[0.0], [2.0], [10.0]], dtype=D), 1)
    assert mixed.flatten().tolist() == [1.0, 1.0, 6.0]


# ----------------------------------------------------------------------------- NaN / inf
@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_rows_raise_naming_them(name: str, bad: float) -> None:
    x = torch.zeros(7, 2, dtype=D)
    x[3, 1] = bad
    with pytest.raises(FedriskError, match=r"\[3\].*NaN/inf"):
        RULES[name][0](x, 1)


def test_aggregator_excludes_or_raises_on_nonfinite_client() -> None:
    r = InMemoryReplies({k: {"w": torch.tensor([float(k), 1.0] if k < 5 else [float("nan"), 0.0])} for k in range(6)})
    with pytest.raises(FedriskError, match=r"clients \[5\]"):
        Krum(f=1)(r, "w")
    assert Krum(f=1, nonfinite="exclude")(r, "w").tolist() in ([1.0, 1.0], [2.0, 1.0], [3.0, 1.0])
    assert AGGREGATORS.get("median")(nonfinite="exclude")(r, "w").tolist() == [2.0, 1.0]


# ----------------------------------------------------------------------------- bad input
def test_bad_counts_raise() -> None:
    x = torch.zeros(6, 2, dtype=D)
    with pytest.raises(FedriskError, match="needs 2f < n"):
        trimmed_mean(x, 3)
    with pytest.raises(FedriskError, match=r"needs n > 2f \+ 2"):
        krum(x, 2)  # n = 6 <= 2f + 2
    with pytest.raises(FedriskError, match=r"needs n > 2f \+ 2"):
        multi_krum(x, 2)
    with pytest.raises(FedriskError, match="1 <= m <= n"):
        multi_krum(torch.zeros(7, 1), 1, 8)
    with pytest.raises(FedriskError, match="integer >= 0"):
        krum(torch.zeros(7, 1), -1)
    with pytest.raises(FedriskError, match="2f < n"):
        nearest_neighbor_mixing(x, 3)
    with pytest.raises(FedriskError, match="bucket size"):
        bucketing(x, 0, torch.Generator())
    with pytest.raises(FedriskError, match="tau"):
        centered_clipping(x, tau=0.0)
    with pytest.raises(FedriskError, match="tol"):
        geometric_median(x, tol=0.0)
    with pytest.raises(FedriskError, match=r"shape \(n, d\)"):
        krum(torch.zeros(3), 0)
    with pytest.raises(FedriskError, match="n = 0"):
        coordinate_median(torch.zeros(0, 2))


def test_bad_aggregator_options_raise() -> None:
    with pytest.raises(FedriskError, match="f = -1"):
        TrimmedMean(f=-1)
    with pytest.raises(FedriskError, match="nonfinite"):
        Krum(nonfinite="ignore")
    with pytest.raises(FedriskError, match="pre"):
        MultiKrum(pre="sorting")
    with pytest.raises(FedriskError, match="tau"):
        CenteredClipping(tau=-1.0)
    with pytest.raises(FedriskError, match="tol"):
        GeometricMedian(tol=-1.0)
    r = InMemoryReplies({k: {"w": torch.tensor([float(k)])} for k in range(4)})
    with pytest.raises(FedriskError, match=r"n = 4 replies; it needs n > 2f \+ 2"):
        Krum(f=1)(r, "w")


def test_registered_aggregators_are_gather_kind_and_work_on_trees() -> None:
    for name in ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "centered_clipping"):
        agg = AGGREGATORS.get(name)()
        assert agg.kind == "gather" and agg.name == name
    r = InMemoryReplies({k: {"p": {"a": torch.tensor([[float(k)]]), "b": torch.tensor([2.0 * k])}} for k in range(5)})
    out = AGGREGATORS.get("median")()(r, "p")
    assert out["a"].shape == (1, 1) and out["a"].item() == 2.0 and out["b"].tolist() == [4.0]
    bucketed = AGGREGATORS.get("median")(pre="bucketing", bucket_size=1)(r, "p")
    assert bucketed["b"].tolist() == [4.0]
    rows = torch.tensor([[float(k), 2.0 * k] for k in range(5)])
    expected = trimmed_mean(nearest_neighbor_mixing(rows, 1), 1)
    assert AGGREGATORS.get("trimmed_mean")(f=1, pre="nnm")(r, "p")["b"].tolist() == pytest.approx([expected[1].item()])


def test_robust_aggregator_from_a_config() -> None:
    from fedrisk.experiment.config import resolve_config

    base = {"data": {"dataset": "wine", "num_clients": 7}, "model": {"name": "logreg"}}
    cfg = resolve_config({**base, "algorithm": {"name": "robust_sgd", "aggregator": {"name": "krum", "f": 2}}})
    assert cfg["algorithm.aggregator"] == {"name": "krum", "f": 2}
    with pytest.raises(FedriskError, match="f = -2"):
        from fedrisk.experiment.runner import build_simulation

        bad = {"name": "robust_sgd", "aggregator": {"name": "krum", "f": -2}}
        build_simulation(resolve_config({**base, "algorithm": bad}))


def test_bucketing_uses_the_callers_generator() -> None:
    r = InMemoryReplies({k: {"w": torch.tensor([float(k) ** 2])} for k in range(6)})
    agg = AGGREGATORS.get("median")(pre="bucketing", bucket_size=2)
    fixed = [agg(r, "w").item() for _ in range(3)]
    assert len(set(fixed)) == 1  # no generator: the same buckets every call
    drawn = {agg(r, "w", gen=torch.Generator().manual_seed(s)).item() for s in range(20)}
    assert len(drawn) > 1


# ----------------------------------------------------------------------------- pinned by mutation testing
# Each test below failed on a mutant of `scripts/mutation.py algorithms` that the tests above
# let survive (docs/reliability.md, "The algorithms scope").
PURE_RULES = {
    "mean": mean,
    "coordinate_median": coordinate_median,
    "trimmed_mean": lambda x: trimmed_mean(x, 0),
    "krum": lambda x: krum(x, 0),
    "geometric_median": geometric_median,
    "centered_clipping": centered_clipping,
}


@pytest.mark.parametrize("rule", PURE_RULES)
def test_bad_rows_errors_name_the_rule_and_what_came(rule: str) -> None:
    with pytest.raises(FedriskError, match=rf"^{rule}: replies must be a floating tensor of shape \(n, d\); got list$"):
        PURE_RULES[rule]([[1.0]])
    with pytest.raises(FedriskError, match=rf"^{rule}: replies \[1\] \(row numbers\) contain NaN/inf.*"
                       r"nonfinite='exclude'\)$"):  # fmt: skip
        PURE_RULES[rule](torch.tensor([[0.0], [math.nan], [1.0], [2.0]]))


@pytest.mark.parametrize("rule,call", [("trimmed_mean", lambda f: trimmed_mean(torch.zeros(5, 1), f)),
                                       ("krum", lambda f: krum(torch.zeros(5, 1), f))])  # fmt: skip
def test_f_errors_name_the_rule(rule: str, call) -> None:
    for bad in (-1, True, 1.0):
        with pytest.raises(FedriskError, match=rf"^{rule}: f = {bad!r} is not allowed; it must be an integer >= 0"):
            call(bad)


def test_f_zero_is_allowed_and_trimmed_mean_zero_is_the_mean() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0], [8.0, -1.0]], dtype=D)
    assert trimmed_mean(x, 0).tolist() == [4.0, 7.0 / 3.0]
    assert krum(x, 0).tolist() == [1.0, 2.0]  # n - 2 = 1 neighbour: scores 20, 20, 58; the lower index
    assert TrimmedMean(f=0).f == 0 and Krum(f=0).f == 0


def test_multi_krum_m_bounds() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [1e6]], dtype=D)
    assert multi_krum(x, 1, 5).tolist() == [(6.0 + 1e6) / 5]  # m = n is allowed
    for bad in (0, 6, True):
        with pytest.raises(FedriskError, match=rf"^multi_krum: m = {bad!r} is not allowed with n = 5 replies"):
            multi_krum(x, 1, bad)


def test_weiszfeld_and_clipping_option_checks() -> None:
    x = torch.tensor([[0.0], [1.0], [5.0]], dtype=D)
    # one Weiszfeld step from the mean 2: weights 1/2, 1, 1/3 -> (1 + 5/3) / (11/6) = 16/11
    assert geometric_median(x, max_iter=1).tolist() == pytest.approx([16 / 11], abs=1e-12)
    assert centered_clipping(x, iters=1).tolist() == [1.0 + (0.0 - 1.0 + 0.0 + 1.0) / 3]
    for bad in (0, 1.5, True):
        with pytest.raises(FedriskError, match=rf"^geometric_median: max_iter = {bad!r} must be an integer >= 1$"):
            geometric_median(x, max_iter=bad)
        with pytest.raises(FedriskError, match=rf"^centered_clipping: iters = {bad!r} must be an integer >= 1$"):
            centered_clipping(x, iters=bad)
    with pytest.raises(FedriskError, match=r"eps = 0\.0 must be > 0"):
        geometric_median(x, eps=0.0)
    for bad in (True, "1", math.inf):
        with pytest.raises(FedriskError, match=r"^centered_clipping: tau = .* it must be a finite number > 0$"):
            centered_clipping(x, tau=bad)


def test_centered_clipping_pinned_values() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]], dtype=D)
    # from the median 1.5: differences -1.5, -0.5, 0.5, 8.5 clipped to [-1, 1]: mean 0 -> 1.5, then stays
    assert centered_clipping(x).tolist() == [1.5]
    # from 0: +(0 + 1 + 1 + 1) / 4 = 0.75, then (-0.75, 0.25, 1, 1) / 4 = 0.375 -> 1.125
    assert centered_clipping(x, tau=1.0, iters=2, center=torch.zeros(1)).tolist() == [1.125]
    assert centered_clipping(x, tau=2.0, iters=1, center=torch.zeros(1)).tolist() == [1.25]
    assert centered_clipping(x, center=torch.zeros(1, dtype=torch.float32)).dtype == D
    # in 2-d the differences are clipped onto a ball (not per coordinate) and averaged per coordinate
    y = torch.tensor([[0.0, 0.0], [4.0, 0.0], [4.0, 0.0], [3.0, 4.0]], dtype=D)
    got = centered_clipping(y, iters=1, center=torch.zeros(2, dtype=D))
    assert got.tolist() == pytest.approx([(1.0 + 1.0 + 0.6) / 4, 0.8 / 4], abs=1e-15)


def test_aggregator_classes_pass_their_options_to_the_rule() -> None:
    rows = [[0.0, 1.0], [1.0, 3.0], [2.0, -1.0], [4.0, 0.5], [40.0, 9.0], [5.0, 5.0], [-3.0, 2.0]]
    rows = torch.tensor(rows, dtype=D)
    r = InMemoryReplies({k: {"w": rows[k]} for k in range(7)})
    cases = [
        (TrimmedMean(), trimmed_mean(rows, 1)),
        (TrimmedMean(f=2), trimmed_mean(rows, 2)),
        (Krum(), krum(rows, 1)),
        (MultiKrum(), multi_krum(rows, 1)),
        (MultiKrum(f=2), multi_krum(rows, 2)),
        (MultiKrum(f=1, m=2), multi_krum(rows, 1, 2)),
        (GeometricMedian(), geometric_median(rows)),
        (GeometricMedian(tol=1e-2, max_iter=3, eps=0.5), geometric_median(rows, tol=1e-2, max_iter=3, eps=0.5)),
        (CenteredClipping(), centered_clipping(rows)),
        (CenteredClipping(tau=0.25, iters=5), centered_clipping(rows, tau=0.25, iters=5)),
    ]
    for agg, expected in cases:
        assert torch.equal(agg(r, "w"), expected), agg
    assert not torch.equal(multi_krum(rows, 1, 2), multi_krum(rows, 1))  # the options matter here
    assert not torch.equal(geometric_median(rows, tol=1e-2, max_iter=3, eps=0.5), geometric_median(rows))
    assert repr(MultiKrum(f=2, m=3)) == "MultiKrum(f=2, m=3, nonfinite='raise', pre='none')"
    defaults = "tol=1e-07, max_iter=1000, eps=1e-08, nonfinite='raise', pre='none'"
    assert repr(GeometricMedian()) == f"GeometricMedian({defaults})"
    assert repr(CenteredClipping(tau=2)) == "CenteredClipping(tau=2.0, iters=3, nonfinite='raise', pre='none')"
    with pytest.raises(FedriskError, match=r"^m = -1 is out of range; allowed: \[0, inf\)$"):
        MultiKrum(m=-1)
    with pytest.raises(FedriskError, match=r"^f = -1 is out of range; allowed: \[0, inf\)$"):
        MultiKrum(f=-1)


def test_aggregator_defaults_and_row_handling() -> None:
    agg = TrimmedMean()
    assert (agg.f, agg.nonfinite, agg.pre, agg.bucket_size, agg.seed) == (1, "raise", "none", 2, 0)
    with pytest.raises(FedriskError, match=r"^nonfinite = 'ignore' is not allowed; valid choices: raise, exclude$"):
        Krum(nonfinite="ignore")
    with pytest.raises(FedriskError, match=r"^pre = 'x' is not allowed; valid choices: none, bucketing, nnm, arc$"):
        Krum(pre="x")
    for bad in (0, 1.5):
        with pytest.raises(FedriskError, match=rf"^bucket_size = {bad!r} is not allowed; it must be an integer >= 1$"):
            Krum(bucket_size=bad)
    one = InMemoryReplies({3: {"w": {"a": torch.tensor([2.0, 1.0])}}})
    assert AGGREGATORS.get("median")()(one, "w")["a"].tolist() == [2.0, 1.0]  # a single reply
    mixed = InMemoryReplies({0: {"w": torch.tensor([math.nan])}, 1: {"w": torch.tensor([4.0])}})
    assert AGGREGATORS.get("median")(nonfinite="exclude")(mixed, "w").tolist() == [4.0]
    with pytest.raises(FedriskError, match=r"^median: the replies of clients \[0\] contain NaN/inf \(set nonfinite"):
        AGGREGATORS.get("median")()(mixed, "w")
    nan_only = InMemoryReplies({0: {"w": torch.tensor([math.nan])}})
    with pytest.raises(FedriskError, match=r"^median: every reply contains NaN/inf; nothing left to aggregate$"):
        AGGREGATORS.get("median")(nonfinite="exclude")(nan_only, "w")
    with pytest.raises(FedriskError, match=r"^median: no replies to aggregate$"):
        AGGREGATORS.get("median")()(InMemoryReplies({}), "w")
    # default bucketing seed 0, and nnm with a rule that has no f mixes with f = 0 (all n rows)
    rows = torch.tensor([[float(k) ** 2] for k in range(6)], dtype=D)
    r = InMemoryReplies({k: {"w": rows[k]} for k in range(6)})
    bucketed = coordinate_median(bucketing(rows, 2, torch.Generator().manual_seed(0)))
    assert torch.equal(AGGREGATORS.get("median")(pre="bucketing")(r, "w"), bucketed)
    mixed_all = coordinate_median(nearest_neighbor_mixing(rows, 0))
    assert torch.equal(AGGREGATORS.get("median")(pre="nnm")(r, "w"), mixed_all)
    assert not torch.equal(mixed_all, coordinate_median(nearest_neighbor_mixing(rows, 1)))
