"""Robust aggregation rules: pure functions on an ``(n, d)`` tensor and ``gather``-kind aggregators.

Each rule is first a pure function ``rule(x, ...) -> (d,)`` over the stacked replies ``x``
(one row per client), then an :class:`~fedrisk.aggregators.base.Aggregator` of ``gather`` kind
that flattens every client's reply tree to a row, applies the rule and unflattens the result.

=====================  ======================================================  ===================
rule                   output                                                  needs
=====================  ======================================================  ===================
``mean``               ``(1/n) sum_i x_i``                                     -
``coordinate_median``  per coordinate, the median (mean of the two middle       -
                       values for even n)
``trimmed_mean``       per coordinate, the mean after dropping the f largest    ``2f < n``
                       and the f smallest values
``krum``               the row with the smallest score, score_i = sum of the    ``n > 2f + 2``
                       squared distances to its ``n - f - 2`` nearest other
                       rows (Blanchard et al., 2017)
``multi_krum``         the mean of the ``m`` rows with the smallest scores      ``n > 2f + 2``
``geometric_median``   ``argmin_z sum_i ||z - x_i||`` by Weiszfeld's            -
                       iteration, distances floored at ``eps``
``centered_clipping``  ``v <- v + (1/n) sum_i clip_tau(x_i - v)`` repeated,     ``tau > 0``
                       from the coordinate median (Karimireddy et al., 2021)
=====================  ======================================================  ===================

Non-finite replies: the pure functions raise :class:`~fedrisk.errors.FedriskError` naming the
rows; the aggregator classes do the same by default (``nonfinite="raise"``) or drop those rows
first (``nonfinite="exclude"``; the count conditions are then checked on the rows that remain).
Client weights are ignored by every robust rule (a weighted median would let a Byzantine client
claim a large weight).

The docs table with breakdown points and costs is in ``docs/byzantine.md``.

Example:
    >>> import torch
    >>> x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [1e6, -1e6]])
    >>> coordinate_median(x).tolist(), trimmed_mean(x, 1).tolist()
    ([1.5, 0.5], [1.5, 0.5])
    >>> krum(torch.tensor([[0.0], [0.5], [1.0], [1.5], [9.0]]), f=1).tolist()
    [0.5]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Aggregator, Replies
from fedrisk.aggregators.preaggregation import PRE_AGGREGATIONS, pre_aggregate
from fedrisk.aggregators.rows import centred_gram, check_rows, clip_rows, medoid_gram, pairwise_sq_distances
from fedrisk.errors import FedriskError, check_int
from fedrisk.tree import Tree, tree_flatten_vector, tree_unflatten_vector

__all__ = [
    "NONFINITE_POLICIES",
    "CenteredClipping",
    "CoordinateMedian",
    "GeometricMedian",
    "Krum",
    "MultiKrum",
    "RobustAggregator",
    "TrimmedMean",
    "centered_clipping",
    "centred_gram",
    "check_rows",
    "coordinate_median",
    "geometric_median",
    "krum",
    "krum_scores",
    "mean",
    "multi_krum",
    "pairwise_sq_distances",
    "trimmed_mean",
]

NONFINITE_POLICIES = ("raise", "exclude")


# ----------------------------------------------------------------------------- input checks
def _check_f(rule: str, f: int, n: int, need: str) -> None:
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise FedriskError(
            f"{rule}: f = {f!r} is not allowed; it must be an integer >= 0 (the number of Byzantine replies)"
        )
    ok = {"2f < n": 2 * f < n, "n > 2f + 2": n > 2 * f + 2}[need]
    if not ok:
        raise FedriskError(f"{rule}: f = {f} is not allowed with n = {n} replies; it needs {need}")


# ----------------------------------------------------------------------------- pure rules
def mean(x: Tensor) -> Tensor:
    """The coordinate-wise mean (breakdown point 0: one reply moves it arbitrarily).

    Example:
        >>> mean(torch.tensor([[1.0, 2.0], [3.0, 6.0]])).tolist()
        [2.0, 4.0]
    """
    check_rows(x, "mean")
    return x.mean(dim=0)


def coordinate_median(x: Tensor) -> Tensor:
    """The coordinate-wise median; for even ``n`` the mean of the two middle values.

    Example:
        >>> coordinate_median(torch.tensor([[1.0], [5.0], [2.0], [100.0]])).tolist()
        [3.5]
    """
    check_rows(x, "coordinate_median")
    n = x.shape[0]
    s = x.sort(dim=0).values
    if n % 2:
        return s[n // 2].clone()
    return (s[n // 2 - 1] + s[n // 2]) / 2


def trimmed_mean(x: Tensor, f: int) -> Tensor:
    """Per coordinate, the mean of the values left after dropping the ``f`` largest and ``f`` smallest.

    Needs ``2f < n``; ``f = 0`` is the mean.

    Example:
        >>> trimmed_mean(torch.tensor([[1.0], [2.0], [3.0], [-50.0], [70.0]]), 1).tolist()
        [2.0]
    """
    check_rows(x, "trimmed_mean")
    n = x.shape[0]
    _check_f("trimmed_mean", f, n, "2f < n")
    if f == 0:
        return x.mean(dim=0)
    return x.sort(dim=0).values[f : n - f].mean(dim=0)


def krum_scores(x: Tensor, f: int) -> Tensor:
    """Krum's score of each row: the sum of its squared distances to its ``n - f - 2`` nearest
    other rows (Blanchard et al., 2017).  Needs ``n > 2f + 2``.

    Example:
        >>> krum_scores(torch.tensor([[0.0], [1.0], [3.0], [4.0], [10.0]]), 1).tolist()
        [10.0, 5.0, 5.0, 10.0, 85.0]
    """
    check_rows(x, "krum")
    n = x.shape[0]
    _check_f("krum", f, n, "n > 2f + 2")
    d = pairwise_sq_distances(x)
    d.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    nearest = d.topk(n - f - 2, dim=1, largest=False).values
    return nearest.sum(dim=1)


def krum(x: Tensor, f: int) -> Tensor:
    """The row with the smallest Krum score (the lowest index on ties).  Needs ``n > 2f + 2``.

    Example:
        >>> krum(torch.tensor([[0.0], [1.0], [1.5], [3.0], [1e6]]), f=1).tolist()
        [1.0]
    """
    scores = krum_scores(x, f)
    return x[int(torch.argmin(scores))].clone()


def multi_krum(x: Tensor, f: int, m: int | None = None) -> Tensor:
    """The mean of the ``m`` rows with the smallest Krum scores (``m = n - f`` by default).

    ``m = 1`` is :func:`krum`.

    Example:
        >>> multi_krum(torch.tensor([[0.0], [1.0], [2.0], [3.0], [1e6]]), f=1, m=3).tolist()
        [1.0]
    """
    scores = krum_scores(x, f)
    n = x.shape[0]
    m = n - f if m is None else m
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= n:
        raise FedriskError(f"multi_krum: m = {m!r} is not allowed with n = {n} replies; it needs 1 <= m <= n")
    order = torch.sort(scores, stable=True).indices[:m]
    return x[order].mean(dim=0)


def geometric_median(x: Tensor, tol: float = 1e-7, max_iter: int = 1000, eps: float = 1e-8) -> Tensor:
    """``argmin_z sum_i ||z - x_i||`` by Weiszfeld's iteration, started at the mean::

        z <- sum_i x_i / max(eps, ||x_i - z||)  /  sum_i 1 / max(eps, ||x_i - z||)

    The floor ``eps`` keeps the weights finite when ``z`` meets a reply (smoothed Weiszfeld).
    The loop stops when a step moves ``z`` by at most ``tol * max(1, ||z||)`` or after
    ``max_iter`` steps.  Breakdown point 1/2.

    Every iterate is a convex combination ``z = sum_i a_i x_i`` of the replies, so the
    iteration runs on the weights ``a``: with the float64 Gram matrix ``G`` of the rows centred
    at a central row ``x_m`` (:func:`centred_gram`), ``||x_i - z||^2 = G_ii - 2 (G a)_i + a^T G a``
    and a step's length is ``sqrt(da^T G da)``.  One Gram matrix (O(n^2 d)), O(n^2) per
    iteration, and one pass ``z = a^T x`` at the end, instead of O(nd) per iteration.  Rounding
    leaves an absolute error of about 1e-8 times the replies' spread in a distance, which
    matters only for a reply that ``z`` meets, i.e. at the scale of the ``eps`` smoothing.

    Example:
        >>> x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1e6, 1e6]], dtype=torch.float64)
        >>> [round(v, 4) for v in geometric_median(x).tolist()]
        [0.5, 0.5]
    """
    check_rows(x, "geometric_median")
    _check_weiszfeld(tol, max_iter, eps)
    n = x.shape[0]
    m, g = medoid_gram(x, torch.float64)
    diag = g.diagonal()
    xm = x[m].double()
    xm_sq = float(xm @ xm)
    cross = (x @ x[m]).double() - xm_sq  # (x_i - x_m) . x_m, for ||z|| in the stopping rule
    a = torch.full((n,), 1.0 / n, dtype=torch.float64, device=g.device)
    for _ in range(max_iter):
        ga = g @ a
        dist = (diag - 2 * ga + a @ ga).clamp_min(0).sqrt().clamp_min(eps)
        w = 1.0 / dist
        new = w / w.sum()
        da = new - a
        step = float((da @ (g @ da)).clamp_min(0).sqrt())
        a = new
        ga = g @ a
        z_norm = max(xm_sq + 2 * float(a @ cross) + float(a @ ga), 0.0) ** 0.5
        if step <= tol * max(1.0, z_norm):
            break
    return a.to(x.dtype) @ x


def _check_weiszfeld(tol: float, max_iter: int, eps: float) -> None:
    """The options of :func:`geometric_median` (shared by the function and its aggregator)."""
    if not tol > 0 or not eps > 0:
        raise FedriskError(f"geometric_median: tol = {tol!r} and eps = {eps!r} must be > 0")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise FedriskError(f"geometric_median: max_iter = {max_iter!r} must be an integer >= 1")


def _check_clipping(tau: float, iters: int) -> None:
    """The options of :func:`centered_clipping` (shared by the function and its aggregator)."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0 or tau == float("inf"):
        raise FedriskError(f"centered_clipping: tau = {tau!r} is not allowed; it must be a finite number > 0")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise FedriskError(f"centered_clipping: iters = {iters!r} must be an integer >= 1")


def centered_clipping(x: Tensor, tau: float = 1.0, iters: int = 3, center: Tensor | None = None) -> Tensor:
    """Centred clipping (Karimireddy, He and Jaggi, 2021): ``iters`` times
    ``v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||)``, from ``center`` (default: the
    coordinate median, since a pure function has no previous aggregate to start from).

    Example:
        >>> centered_clipping(torch.tensor([[0.0], [1.0], [2.0], [1e6]]), tau=1.0, iters=1).tolist()
        [1.5]
    """
    check_rows(x, "centered_clipping")
    _check_clipping(tau, iters)
    v = coordinate_median(x) if center is None else center.to(x.dtype)
    for _ in range(iters):
        v = v + clip_rows(x - v, tau).mean(dim=0)  # clip_tau(x_i - v): each difference onto the tau-ball
    return v


# ----------------------------------------------------------------------------- aggregators
class RobustAggregator(Aggregator):
    """A ``gather``-kind aggregator applying a pure rule to the replies flattened to ``(n, d)``.

    Args:
        nonfinite: ``"raise"`` (a NaN/inf reply stops the round with an error naming the
            client) or ``"exclude"`` (such replies are dropped before the rule runs).
        pre: optional pre-aggregation, ``"none"``, ``"bucketing"`` (means of random buckets of
            ``bucket_size`` replies, Karimireddy et al. 2022) or ``"nnm"`` (nearest-neighbour
            mixing, Allouah et al. 2023; uses the rule's ``f``) or ``"arc"`` (adaptive robust
            clipping, Allouah et al. 2024: the ``floor(2 f (n - f) / n)`` largest replies clipped
            to the next one's norm; uses the rule's ``f``, 0 for rules without one).
        bucket_size: replies per bucket for ``pre = "bucketing"``.
        seed: seed of the bucketing permutation when the caller hands over no generator (the
            built-in algorithms — ``robust_sgd``, ``frpg``, ``fedavg`` — pass the round's server
            generator, so the buckets change every round; a direct call without ``gen`` gets the
            same permutation every time).
        Client weights are not used: every rule treats the replies alike.
    """

    kind = "gather"
    name = "robust"
    rule: ClassVar[Callable[..., Tensor]]

    def __init__(self, nonfinite: str = "raise", pre: str = "none", bucket_size: int = 2, seed: int = 0) -> None:
        if nonfinite not in NONFINITE_POLICIES:
            raise FedriskError(
                f"nonfinite = {nonfinite!r} is not allowed; valid choices: {', '.join(NONFINITE_POLICIES)}"
            )
        if pre not in PRE_AGGREGATIONS:
            raise FedriskError(f"pre = {pre!r} is not allowed; valid choices: {', '.join(PRE_AGGREGATIONS)}")
        if not isinstance(bucket_size, int) or bucket_size < 1:
            raise FedriskError(f"bucket_size = {bucket_size!r} is not allowed; it must be an integer >= 1")
        self.nonfinite, self.pre, self.bucket_size, self.seed = nonfinite, pre, bucket_size, int(seed)

    def options(self) -> dict[str, Any]:
        """The rule's own options (``f``, ``tol``, ...)."""
        return {}

    def __repr__(self) -> str:
        opts = {**self.options(), "nonfinite": self.nonfinite, "pre": self.pre}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in opts.items())})"

    def rows(self, replies: Replies, key: str) -> tuple[Tensor, Tree]:
        """The replies' ``key`` as an ``(n, d)`` tensor (non-finite rows handled) and a template tree."""
        trees = replies.gather(key)
        if not trees:
            raise FedriskError(f"{self.name}: no replies to aggregate")
        x = torch.stack([tree_flatten_vector(t) for t in trees])
        finite = torch.isfinite(x).all(dim=1)
        if not bool(finite.all()):
            bad = [replies.clients[i] for i in (~finite).nonzero().flatten().tolist()]
            if self.nonfinite == "raise":
                raise FedriskError(
                    f"{self.name}: the replies of clients {bad} contain NaN/inf "
                    "(set nonfinite = 'exclude' to drop them instead)"
                )
            x = x[finite]
            if x.shape[0] == 0:
                raise FedriskError(f"{self.name}: every reply contains NaN/inf; nothing left to aggregate")
        return x, trees[0]

    def aggregate_rows(self, x: Tensor, gen: torch.Generator | None = None) -> Tensor:
        """Pre-aggregation (if any) followed by the rule."""
        if gen is None and self.pre == "bucketing":
            gen = torch.Generator().manual_seed(self.seed)
        x = pre_aggregate(
            x, self.pre, int(self.options().get("f", 0) or 0), self.bucket_size, gen
        )  # nnm, arc: the rule's f
        return type(self).rule(x, **self.options())

    def __call__(
        self, replies: Replies, key: str, weights: Mapping[int, float] | None = None, gen: torch.Generator | None = None
    ) -> Tree:
        x, like = self.rows(replies, key)
        return tree_unflatten_vector(self.aggregate_rows(x, gen), like)


class CoordinateMedian(RobustAggregator):
    """Coordinate-wise median (:func:`coordinate_median`).

    Example:
        >>> from fedrisk.aggregators.base import InMemoryReplies
        >>> r = InMemoryReplies({k: {"w": torch.tensor([float(k)])} for k in range(3)})
        >>> CoordinateMedian()(r, "w").tolist()
        [1.0]
    """

    name = "median"
    rule = staticmethod(coordinate_median)


class _FaultTolerant(RobustAggregator):
    """A rule parameterised by the number ``f`` of Byzantine replies it tolerates."""

    def __init__(self, f: int = 1, **kw: Any) -> None:
        super().__init__(**kw)
        check_int("f", f, 0)
        self.f = f

    def options(self) -> dict[str, Any]:
        return {"f": self.f}


class TrimmedMean(_FaultTolerant):
    """Coordinate-wise trimmed mean dropping ``f`` values at each end (:func:`trimmed_mean`)."""

    name = "trimmed_mean"
    rule = staticmethod(trimmed_mean)


class Krum(_FaultTolerant):
    """Krum: the reply with the smallest score over its ``n - f - 2`` nearest others (:func:`krum`)."""

    name = "krum"
    rule = staticmethod(krum)


class MultiKrum(_FaultTolerant):
    """Multi-Krum: the mean of the ``m`` best-scored replies (``m = 0``: ``n - f``) (:func:`multi_krum`)."""

    name = "multi_krum"
    rule = staticmethod(multi_krum)

    def __init__(self, f: int = 1, m: int = 0, **kw: Any) -> None:
        super().__init__(f, **kw)
        check_int("m", m, 0)
        self.m = m

    def options(self) -> dict[str, Any]:
        return {"f": self.f, "m": self.m or None}


class GeometricMedian(RobustAggregator):
    """Geometric median by smoothed Weiszfeld (:func:`geometric_median`)."""

    name = "geometric_median"
    rule = staticmethod(geometric_median)

    def __init__(self, tol: float = 1e-7, max_iter: int = 1000, eps: float = 1e-8, **kw: Any) -> None:
        super().__init__(**kw)
        _check_weiszfeld(tol, max_iter, eps)
        self.tol, self.max_iter, self.eps = tol, max_iter, eps

    def options(self) -> dict[str, Any]:
        return {"tol": self.tol, "max_iter": self.max_iter, "eps": self.eps}


class CenteredClipping(RobustAggregator):
    """Centred clipping around the coordinate median (:func:`centered_clipping`)."""

    name = "centered_clipping"
    rule = staticmethod(centered_clipping)

    def __init__(self, tau: float = 1.0, iters: int = 3, **kw: Any) -> None:
        super().__init__(**kw)
        _check_clipping(tau, iters)
        self.tau, self.iters = float(tau), iters

    def options(self) -> dict[str, Any]:
        return {"tau": self.tau, "iters": self.iters}
