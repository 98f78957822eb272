"""More robust rules: Bulyan, MDA, Meamed, MoNNA, static clipping, ARC, centred clipping with momentum.

Pure functions on the stacked replies ``x`` of shape ``(n, d)`` (one row per client), like those
of :mod:`fedrisk.aggregators.robust`, and their ``gather``-kind aggregator classes.

=============================  ==================================================  =================
rule                           output                                              needs
=============================  ==================================================  =================
``bulyan(x, f)``               El Mhamdi, Guerraoui and Rouault (2018): select      ``n >= 4f + 3``
                               ``theta = n - 2f`` rows by repeated Krum, then per
                               coordinate the mean of the ``beta = theta - 2f``
                               selected values closest to their median
``mda(x, f)``                  minimum-diameter averaging (El Mhamdi et al.        ``2f < n``
                               2018): the mean of the ``n - f`` rows whose
                               largest pairwise distance is smallest; exact by
                               enumeration up to ``max_subsets`` candidate
                               subsets, a greedy approximation beyond
``meamed(x, f)``               mean around the median (Xie, Koyejo and Gupta        ``2f < n``
                               2018): per coordinate, the mean of the ``n - f``
                               values closest to the median
``monna(x, f)``                the mean of the ``n - f`` rows nearest to a pivot    ``2f < n``
                               (the coordinate median; Farhadkhani et al. 2023)
``static_clipping(x, tau)``    the mean of the rows clipped to norm ``tau``         ``tau > 0``
``arc(x, f)``                  adaptive robust clipping (Allouah et al. 2024), a    ``2f < n``
                               pre-aggregation: the ``k = floor(2 (f/n)(n - f))``
                               largest rows are clipped to the norm of the
                               ``(k + 1)``-th largest; returns ``(n, d)``
``centered_clipping_momentum`` Karimireddy, He and Jaggi (2021): workers' momenta    ``tau > 0``
                               ``m_i <- (1 - beta) x_i + beta m_i``, then centred
                               clipping from the previous aggregate
=============================  ==================================================  =================

Example:
    >>> import torch
    >>> x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [1e6]])
    >>> 0 <= bulyan(x[:7], 1).item() <= 6, meamed(x, 1).tolist()
    (True, [3.0])
    >>> mda(x, 1).tolist()
    [3.0]
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.aggregators.preaggregation import ARC_NAME, arc, arc_clip_count
from fedrisk.aggregators.robust import RobustAggregator, _FaultTolerant, coordinate_median
from fedrisk.aggregators.rows import check_f, check_rows, clip_rows, pairwise_sq_distances
from fedrisk.errors import FedriskError, check_int

__all__ = [
    "ARC_NAME",
    "MDA",
    "MDA_MAX_SUBSETS",
    "Bulyan",
    "CenteredClippingMomentum",
    "Meamed",
    "MoNNA",
    "StaticClipping",
    "arc",
    "arc_clip_count",
    "bulyan",
    "centered_clipping_momentum",
    "mda",
    "meamed",
    "monna",
    "static_clipping",
]

MDA_MAX_SUBSETS = 200_000
"""The most candidate subsets ``C(n, f)`` :func:`mda` enumerates exactly (about a second on one core)."""


def _tau_ok(rule: str, tau: Any) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < float("inf"):
        raise FedriskError(f"{rule}: tau = {tau!r} is not allowed; it must be a finite number > 0")
    return float(tau)


# ----------------------------------------------------------------------------- Bulyan
def bulyan(x: Tensor, f: int) -> Tensor:
    """Bulyan over Krum (El Mhamdi, Guerraoui and Rouault, ICML 2018, Algorithm 1).

    Selection: ``theta = n - 2f`` times, the row of the remaining set ``R`` with the smallest Krum
    score (the sum of squared distances to its ``max(|R| - f - 2, 1)`` nearest other rows of
    ``R``) moves from ``R`` to the selection ``S``.  Ties — frequent once ``|R| - f - 2 <= 1``,
    where two mutual nearest neighbours score alike — go to the row with the smaller sum of
    squared distances to all of ``R``, then to the lower index, so the output does not depend on
    the order of the replies unless that sum ties too.  Aggregation: per
    coordinate, the mean of the ``beta = theta - 2f`` values of ``S`` closest to their median.
    One distance matrix (O(n^2 d)), then O(n^3) for the selection and O(theta d log theta).

    Example:
        >>> bulyan(torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [1e9]]), 1).tolist()
        [2.0]
    """
    check_rows(x, "bulyan")
    n = x.shape[0]
    check_f("bulyan", f, n, n >= 4 * f + 3, "n >= 4f + 3")
    theta, beta = n - 2 * f, n - 4 * f
    dist = pairwise_sq_distances(x).double()
    dist.fill_diagonal_(float("inf"))
    remaining = list(range(n))
    chosen: list[int] = []
    for _ in range(theta):
        sub = dist[remaining][:, remaining]
        if len(remaining) == 1:
            chosen.append(remaining.pop())
            break
        k = min(max(len(remaining) - f - 2, 1), len(remaining) - 1)
        scores = sub.topk(k, dim=1, largest=False).values.sum(dim=1)
        tied = scores <= scores.min() * (1 + 1e-12)  # e.g. two mutual nearest neighbours when k = 1
        totals = torch.where(tied, sub.masked_fill(torch.isinf(sub), 0).sum(dim=1), torch.inf)
        best = remaining[int(torch.argmin(totals))]
        chosen.append(best)
        remaining.remove(best)
    return _mean_around_median(x[chosen], beta)


def _mean_around_median(s: Tensor, keep: int) -> Tensor:
    """Per coordinate, the mean of the ``keep`` values of ``s`` closest to their median."""
    med = coordinate_median(s)
    idx = (s - med).abs().topk(keep, dim=0, largest=False).indices
    return s.gather(0, idx).mean(dim=0)


# ----------------------------------------------------------------------------- Meamed
def meamed(x: Tensor, f: int) -> Tensor:
    """Mean around the median (Xie, Koyejo and Gupta, 2018, "Generalized Byzantine-tolerant SGD"):
    per coordinate, the mean of the ``n - f`` values closest to the coordinate median.

    Example:
        >>> meamed(torch.tensor([[0.0], [1.0], [2.0], [100.0]]), 1).tolist()
        [1.0]
    """
    check_rows(x, "meamed")
    n = x.shape[0]
    check_f("meamed", f, n, 2 * f < n, "2f < n")
    return _mean_around_median(x, n - f)


# ----------------------------------------------------------------------------- MDA
def mda(x: Tensor, f: int, exact: bool | None = None, max_subsets: int = MDA_MAX_SUBSETS) -> Tensor:
    """Minimum-diameter averaging (El Mhamdi, Guerraoui and Rouault, 2018): the mean of the
    ``n - f`` rows whose diameter (largest pairwise distance) is smallest.

    Exact search enumerates the ``C(n, f)`` sets of rows left out (vectorised in chunks over one
    distance matrix).  ``exact=None`` (default) searches exactly when ``C(n, f) <= max_subsets``
    and otherwise runs a greedy approximation: ``f`` times, drop one of the two rows realising the
    current diameter, the one whose removal leaves the smaller diameter (at most twice the
    optimal diameter is not guaranteed; the result is a feasible ``n - f`` subset).
    ``exact=True`` refuses (``FedriskError`` naming the limit) when ``C(n, f) > max_subsets``;
    ``exact=False`` always runs the greedy search.  Ties in the diameter (frequent: the diameter
    is one pair, which many subsets share) go to the subset with the smaller sum of squared
    pairwise distances, so the output does not depend on the order of the replies.

    Example:
        >>> mda(torch.tensor([[0.0], [1.0], [2.0], [50.0], [-60.0]]), 2).tolist()
        [1.0]
    """
    check_rows(x, "mda")
    n = x.shape[0]
    check_f("mda", f, n, 2 * f < n, "2f < n")
    check_int("mda: max_subsets", max_subsets, 1)
    count = math.comb(n, f)
    if exact is None:
        exact = count <= max_subsets
    elif exact and count > max_subsets:
        raise FedriskError(
            f"mda: the exact search over C(n, f) = C({n}, {f}) = {count} subsets is refused above max_subsets = "
            f"{max_subsets}; pass exact=None or False for the greedy approximation, or raise max_subsets"
        )
    if f == 0:
        return x.mean(dim=0)
    dist = pairwise_sq_distances(x).double()
    keep = _mda_exact(dist, f) if exact else _mda_greedy(dist, f)
    return x[keep].mean(dim=0)


def _mda_exact(dist: Tensor, f: int, chunk: int = 4096) -> Tensor:
    """The kept rows of the smallest diameter; ties (several subsets share the diameter's pair)
    go to the smaller sum of squared pairwise distances, then to the first in enumeration order."""
    n = dist.shape[0]
    best: tuple[float, float] = (math.inf, math.inf)
    best_mask = None
    combos = itertools.combinations(range(n), f)
    zero = torch.zeros((), dtype=dist.dtype)
    while True:
        block = list(itertools.islice(combos, chunk))
        if not block:
            break
        keep = torch.ones(len(block), n, dtype=torch.bool, device=dist.device)
        keep.scatter_(1, torch.tensor(block, dtype=torch.long, device=dist.device), False)
        inside = torch.where(keep[:, :, None] & keep[:, None, :], dist, zero).flatten(1)
        diam, total = inside.max(dim=1).values, inside.sum(dim=1)
        low = diam.min()
        total = torch.where(diam <= low * (1 + 1e-12), total, torch.inf)
        i = int(torch.argmin(total))
        key = (float(diam[i]), float(total[i]))
        if key[0] < best[0] * (1 - 1e-12) or (key[0] <= best[0] * (1 + 1e-12) and key[1] < best[1]):
            best, best_mask = key, keep[i]
    assert best_mask is not None
    return best_mask.nonzero().flatten()


def _mda_greedy(dist: Tensor, f: int) -> Tensor:
    keep = list(range(dist.shape[0]))
    for _ in range(f):
        sub = dist[keep][:, keep]
        flat = int(torch.argmax(sub))
        ends = (keep[flat // len(keep)], keep[flat % len(keep)])
        options = []
        for e in ends:
            rest = [k for k in keep if k != e]
            options.append((float(dist[rest][:, rest].max()), e))
        keep.remove(min(options)[1])
    return torch.tensor(keep, dtype=torch.long)


# ----------------------------------------------------------------------------- MoNNA
def monna(x: Tensor, f: int, pivot: Tensor | None = None) -> Tensor:
    """MoNNA (Farhadkhani et al., ICML 2023, "Robust collaborative learning with linear gradient
    overhead"): the mean of the ``n - f`` rows nearest (in l2) to a pivot vector.

    In the paper the pivot is a trusted (honest) worker's own vector.  A server has none, so the
    default pivot is the coordinate median of the rows (inside the honest range per coordinate
    while ``2f < n``).  Nearest-neighbour mixing *followed by the plain mean* would not be robust:
    a far reply's own mixed row keeps ``1/(n - f)`` of it.

    Example:
        >>> monna(torch.tensor([[0.0], [2.0], [4.0], [1e3]]), 1).tolist()
        [2.0]
    """
    check_rows(x, "monna")
    n = x.shape[0]
    check_f("monna", f, n, 2 * f < n, "2f < n")
    centre = coordinate_median(x) if pivot is None else pivot.to(x.dtype)
    if centre.shape != x.shape[1:]:
        raise FedriskError(f"monna: pivot must have shape {tuple(x.shape[1:])}; got {tuple(centre.shape)}")
    dist = torch.linalg.vector_norm(x - centre, dim=1)
    idx = torch.sort(dist, stable=True).indices[: n - f]
    return x[idx].mean(dim=0)


# ----------------------------------------------------------------------------- clipping
def static_clipping(x: Tensor, tau: float = 1.0) -> Tensor:
    """Static norm clipping: ``(1/n) sum_i x_i min(1, tau / ||x_i||)``.

    Each reply moves the output by at most ``tau / n``: ``f`` faulty replies by ``f tau / n``.

    Example:
        >>> static_clipping(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), tau=1.0).tolist()
        [0.45000001788139343, 0.6000000238418579]
    """
    check_rows(x, "static_clipping")
    return clip_rows(x, _tau_ok("static_clipping", tau)).mean(dim=0)


def centered_clipping_momentum(
    x: Tensor, momentum: Tensor, previous: Tensor, beta: float = 0.9, tau: float = 1.0, iters: int = 1
) -> tuple[Tensor, Tensor]:
    """Centred clipping with worker momentum (Karimireddy, He and Jaggi, ICML 2021, Algorithm 2):

        m_i <- (1 - beta) x_i + beta m_i          (the workers' momenta; ``momentum`` is ``(n, d)``)
        v <- previous;  iters times  v <- v + (1/n) sum_i clip_tau(m_i - v)

    Returns ``(v, new momenta)``.  ``beta = 0`` with ``previous`` = the median is
    :func:`~fedrisk.aggregators.robust.centered_clipping`.

    Example:
        >>> x = torch.tensor([[1.0], [1.0], [1e6]])
        >>> v, m = centered_clipping_momentum(x, torch.zeros(3, 1), torch.zeros(1), beta=0.5, tau=1.0)
        >>> v.tolist(), m.flatten().tolist()
        ([0.6666666865348816], [0.5, 0.5, 500000.0])
    """
    check_rows(x, "centered_clipping_momentum")
    tau = _tau_ok("centered_clipping_momentum", tau)
    if not 0 <= beta < 1:
        raise FedriskError(f"centered_clipping_momentum: beta = {beta!r} is not allowed; it needs 0 <= beta < 1")
    check_int("centered_clipping_momentum: iters", iters, 1)
    if momentum.shape != x.shape or previous.shape != x.shape[1:]:
        raise FedriskError(
            f"centered_clipping_momentum: momentum must be {tuple(x.shape)} and previous {tuple(x.shape[1:])}; "
            f"got {tuple(momentum.shape)} and {tuple(previous.shape)}"
        )
    m = (1 - beta) * x + beta * momentum.to(x.dtype)
    v = previous.to(x.dtype)
    for _ in range(iters):
        v = v + clip_rows(m - v, tau).mean(dim=0)
    return v, m


# ----------------------------------------------------------------------------- aggregators
class Bulyan(_FaultTolerant):
    """Bulyan over Krum (:func:`bulyan`); needs ``n >= 4f + 3``."""

    name = "bulyan"
    rule = staticmethod(bulyan)


class Meamed(_FaultTolerant):
    """Mean around the median (:func:`meamed`)."""

    name = "meamed"
    rule = staticmethod(meamed)


class MoNNA(_FaultTolerant):
    """The mean of the ``n - f`` replies nearest to the coordinate median (:func:`monna`)."""

    name = "monna"
    rule = staticmethod(monna)


class MDA(_FaultTolerant):
    """Minimum-diameter averaging (:func:`mda`): exact up to ``max_subsets`` subsets, greedy beyond."""

    name = "mda"
    rule = staticmethod(mda)

    def __init__(self, f: int = 1, max_subsets: int = MDA_MAX_SUBSETS, **kw: Any) -> None:
        super().__init__(f, **kw)
        check_int("max_subsets", max_subsets, 1)
        self.max_subsets = max_subsets

    def options(self) -> dict[str, Any]:
        return {"f": self.f, "max_subsets": self.max_subsets}


class StaticClipping(RobustAggregator):
    """The mean of the replies clipped to norm ``tau`` (:func:`static_clipping`)."""

    name = "static_clipping"
    rule = staticmethod(static_clipping)

    def __init__(self, tau: float = 1.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.tau = _tau_ok("static_clipping", tau)

    def options(self) -> dict[str, Any]:
        return {"tau": self.tau}


class CenteredClippingMomentum(RobustAggregator):
    """Centred clipping from the previous aggregate over the workers' momenta
    (:func:`centered_clipping_momentum`).

    The momenta (one per client id) and the previous aggregate are kept in the aggregator object
    between rounds (the first round starts from the coordinate median of the momenta).  They are
    not part of a checkpoint: a resumed run restarts them.  Pre-aggregation is not supported (the
    momenta belong to clients, not to buckets).
    """

    name = "centered_clipping_momentum"

    def __init__(self, tau: float = 1.0, beta: float = 0.9, iters: int = 1, **kw: Any) -> None:
        super().__init__(**kw)
        if self.pre != "none":
            raise FedriskError("centered_clipping_momentum: pre-aggregation is not supported (pre must be 'none')")
        self.tau = _tau_ok("centered_clipping_momentum", tau)
        if not 0 <= beta < 1:
            raise FedriskError(f"centered_clipping_momentum: beta = {beta!r} is not allowed; it needs 0 <= beta < 1")
        check_int("iters", iters, 1)
        self.beta, self.iters = float(beta), iters
        self._momenta: dict[tuple[int, str], Tensor] = {}
        self._previous: dict[str, Tensor] = {}

    def options(self) -> dict[str, Any]:
        return {"tau": self.tau, "beta": self.beta, "iters": self.iters}

    def aggregate_rows(self, x: Tensor, gen: torch.Generator | None = None) -> Tensor:
        """A stateless evaluation (used by adaptive attacks): momenta = rows, start = median."""
        check_rows(x, self.name)
        return centered_clipping_momentum(x, x, coordinate_median(x), 0.0, self.tau, self.iters)[0]

    def __call__(self, replies: Replies, key: str, weights: Any = None, gen: torch.Generator | None = None) -> Any:
        from fedrisk.tree import tree_unflatten_vector

        x, like = self.rows(replies, key)
        clients = list(replies.clients)
        if x.shape[0] != len(clients):  # nonfinite = "exclude" dropped some rows
            finite = [k for k, t in zip(clients, replies.gather(key), strict=True) if _finite_tree(t)]
            clients = finite
        old = torch.stack([self._momenta.get((k, key), x[i]) for i, k in enumerate(clients)])
        prev = self._previous.get(key)
        if prev is None:
            prev = coordinate_median(old)
        v, m = centered_clipping_momentum(x, old, prev, self.beta, self.tau, self.iters)
        for i, k in enumerate(clients):
            self._momenta[(k, key)] = m[i]
        self._previous[key] = v
        return tree_unflatten_vector(v, like)


def _finite_tree(t: Any) -> bool:
    from fedrisk.tree import tree_flatten_vector

    return bool(torch.isfinite(tree_flatten_vector(t)).all())
