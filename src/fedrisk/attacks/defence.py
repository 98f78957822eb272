"""What an adaptive attacker knows about the server's defence, and the breakdown check.

:func:`defence_of` reads the aggregation of an algorithm (FRPG / LFRPG's projected sum, or the
``aggregator`` of ``robust_sgd``, ``fedavg``, ...) as a :class:`Defence`: a function of the
stacked replies ``(n, d)``, the largest norm a forged reply keeps (FRPG's ``lambda``, a clipping
radius), and the number of faulty replies the rule claims to tolerate.
:func:`defence_from_spec` builds one from a config value (``"median"``,
``{name = "krum", f = 4}``, ``{name = "frpg", lam = 1.6}``).

Example:
    >>> import torch
    >>> d = defence_from_spec({"name": "static_clipping", "tau": 2.0})
    >>> d.radius(torch.ones(3, 4), 1), d.tolerates(10)
    (2.0, None)
    >>> defence_from_spec({"name": "krum", "f": 2}).tolerates(10)
    2
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedrisk.errors import FedriskError

__all__ = ["Defence", "check_breakdown", "defence_from_spec", "defence_of", "defence_of_aggregator"]

FRPG_NAMES = ("frpg", "lfrpg")
_HALF = ("median", "geometric_median", "centered_clipping")  # breakdown point 1/2, no f to declare


@dataclass(frozen=True)
class Defence:
    """The server's aggregation as the attacker models it.

    Attributes:
        name: for messages (``"frpg"``, ``"Krum(f=4, ...)"``).
        aggregate: ``(rows (n, d), generator) -> (d,)``, what the server computes from the replies
            (FRPG / LFRPG: the mean of the projected messages, i.e. their sum (6c) divided by n).
        radius: ``(honest rows, number of forged rows) -> the largest norm a forged reply keeps``
            (measured from ``centre``), or None when the defence admits replies of any norm.
        centre: ``honest rows -> the point the radius is measured from`` (None: the origin).
        tolerates: ``n -> the most faulty replies the rule claims to withstand`` (None: no claim,
            e.g. the mean, static clipping or FRPG, whose influence is bounded per reply).
        limit: the condition behind ``tolerates``, for messages.
        at: ``round -> the defence in that round`` when it changes over the rounds (FRPG / LFRPG
            with a ``lam_schedule``), else None.
    """

    name: str
    aggregate: Callable[[Tensor, torch.Generator | None], Tensor]
    radius: Callable[[Tensor, int], float | None] | None = None
    centre: Callable[[Tensor], Tensor] | None = None
    tolerates: Callable[[int], int | None] = lambda n: None
    limit: str = ""
    at: Callable[[int], Defence] | None = None

    def in_round(self, r: int) -> Defence:
        """The defence of round ``r`` (itself unless it changes over the rounds)."""
        return self if self.at is None else self.at(r)


def _frpg(lam: float, project: bool, name: str, pre: str = "none", pre_f: int = 0, bucket_size: int = 2) -> Defence:
    from fedrisk.aggregators.preaggregation import pre_aggregate
    from fedrisk.aggregators.rows import clip_rows

    def aggregate(x: Tensor, gen: torch.Generator | None) -> Tensor:
        # the server sums the (pre-aggregated, rescaled) projected messages (6c); as a mean (the
        # sum / n) it compares with the honest mean the line search measures from
        x = pre_aggregate(x, pre, pre_f, bucket_size, gen)
        return clip_rows(x, lam).mean(dim=0) if project else x.mean(dim=0)

    radius = (lambda h, b: float(lam)) if project else None
    extra = "" if pre == "none" else f", pre={pre}"
    return Defence(f"{name}(lam={lam:g}, project={project}{extra})", aggregate, radius)


def _frpg_of(algorithm: Any, name: str) -> Defence:
    """FRPG / LFRPG's defence read from the algorithm: its lambda (per round with a schedule), its
    projection and its pre-aggregation."""
    pre = {k: getattr(algorithm, k) for k in ("pre", "pre_f", "bucket_size") if hasattr(algorithm, k)}
    project = bool(algorithm.project)
    first = _frpg(float(algorithm.lam_at(1) if hasattr(algorithm, "lam_at") else algorithm.lam), project, name, **pre)
    if getattr(algorithm, "lam_schedule", "constant") == "constant":
        return first
    at = lambda r: _frpg(float(algorithm.lam_at(r + 1)), project, name, **pre)  # noqa: E731
    return dataclasses.replace(first, at=at)


def defence_of_aggregator(agg: Any) -> Defence:
    """The :class:`Defence` of an aggregator object (``Mean``, ``Krum(f=4)``, ...)."""
    from fedrisk.aggregators.base import Mean, WeightedMean
    from fedrisk.aggregators.extended import CenteredClippingMomentum, StaticClipping, arc_clip_count
    from fedrisk.aggregators.robust import CenteredClipping, RobustAggregator, coordinate_median

    if isinstance(agg, (Mean, WeightedMean)):  # the attacker does not know the weights: the plain mean
        return Defence(type(agg).__name__, lambda x, gen: x.mean(dim=0))
    if not isinstance(agg, RobustAggregator):
        raise FedriskError(
            f"adaptive attack: cannot model the aggregator {agg!r}; supported: mean, weighted_mean and the robust "
            "aggregators of fedrisk.aggregators"
        )
    opts = agg.options()
    f = opts.get("f")
    radius: Callable[[Tensor, int], float | None] | None = None
    centre = None
    if isinstance(agg, StaticClipping):
        radius = lambda h, b, tau=agg.tau: tau  # noqa: E731
    elif isinstance(agg, (CenteredClipping, CenteredClippingMomentum)):
        radius, centre = (lambda h, b, tau=agg.tau: tau), coordinate_median
    if agg.pre == "arc":
        k_of = lambda n: arc_clip_count(n, int(f or 0))  # noqa: E731

        def radius(h: Tensor, b: int) -> float | None:  # the (k+1)-th largest norm once b huge rows join
            k = k_of(h.shape[0] + b)
            if b > k:
                return None  # some forged rows are not clipped
            return float(torch.linalg.vector_norm(h, dim=1).sort(descending=True).values[k - b])

        centre = None
    if isinstance(f, int) and agg.name not in _HALF:
        tolerates: Callable[[int], int | None] = lambda n, f=f: f  # noqa: E731
        limit = f"it was configured for f = {f} faulty replies"
    elif agg.name in _HALF:
        tolerates, limit = (lambda n: (n - 1) // 2), "its breakdown point is 1/2 (fewer than n/2 faulty replies)"
    else:
        tolerates, limit = (lambda n: None), ""

    def aggregate(x: Tensor, gen: torch.Generator | None) -> Tensor:
        return agg.aggregate_rows(x, gen)

    return Defence(repr(agg), aggregate, radius, centre, tolerates, limit)


def defence_of(algorithm: Any) -> Defence:
    """The :class:`Defence` of an algorithm: FRPG / LFRPG's projected sum, or its ``aggregator``.

    Example:
        >>> from fedrisk.aggregators import Krum
        >>> class Alg:
        ...     name, aggregator = "robust_sgd", Krum(f=2)
        >>> defence_of(Alg()).name
        "Krum(f=2, nonfinite='raise', pre='none')"
    """
    name = getattr(algorithm, "name", type(algorithm).__name__)
    if name in FRPG_NAMES:
        return _frpg_of(algorithm, name)
    agg = getattr(algorithm, "aggregator", None)
    if agg is not None:
        return defence_of_aggregator(agg)
    raise FedriskError(
        f"adaptive attack: cannot tell how algorithm {name!r} aggregates the replies (it has no aggregator); "
        "supported: frpg, lfrpg and algorithms with an aggregator (robust_sgd, fedavg, ...); "
        'or set the attack\'s defence explicitly, e.g. defence = { name = "median" }'
    )


def defence_from_spec(spec: Any) -> Defence:
    """A defence from a config value: an aggregator name or table, or ``{name = "frpg", lam = ...}``."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise FedriskError(f'attack defence = {spec!r} is not allowed; give "auto", an aggregator name or a table')
    options = {k: v for k, v in spec.items() if k != "name"}
    if spec["name"] in FRPG_NAMES:
        lam = options.pop("lam", 1.6)
        project = options.pop("project", True)
        pre = {k: options.pop(k) for k in ("pre", "pre_f", "bucket_size") if k in options}
        if options:
            raise FedriskError(
                f"attack defence {spec['name']!r}: unknown options {sorted(options)}; allowed: lam, project, pre, "
                "pre_f, bucket_size"
            )
        return _frpg(float(lam), bool(project), spec["name"], **pre)
    from fedrisk.aggregators import AGGREGATORS

    try:
        return defence_of_aggregator(AGGREGATORS.get(spec["name"])(**options))
    except TypeError as exc:
        raise FedriskError(f"attack defence {spec['name']!r}: {exc}") from None


def check_breakdown(defence: Defence, n: int, byzantine: Sequence[int]) -> None:
    """Refuse more faulty clients than the defence claims to tolerate with ``n`` clients."""
    limit = defence.tolerates(n)
    b = len(set(byzantine))
    if limit is not None and b > limit:
        raise FedriskError(
            f"{b} of {n} clients are Byzantine, above what {defence.name} tolerates ({limit}: {defence.limit}); "
            "lower attack.byzantine / num_byzantine or configure the aggregator for more faulty replies"
        )
