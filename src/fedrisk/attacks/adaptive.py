"""Adaptive and omniscient attacks: they see the honest replies and know the server's defence.

Each reply key (``g`` for FRPG, ``grad`` for ``robust_sgd``, ``params`` for FedAvg, ...) whose
leaves are floating is forged on its own (other keys keep the client's values), on the replies
flattened to rows: ``H`` (the round's honest replies, ``h x d``)
with mean ``mu_h`` and coordinate-wise standard deviation ``sigma_h``.  Every Byzantine client
sends the same forged row (except ``mimic``, which copies, and ``nonfinite``).

=============  =============================================================================
``max_norm``   defence-aware max-norm: ``c - r mu_h / ||mu_h||``, the largest message the defence
               admits along the negative honest direction.  ``r``: FRPG / LFRPG's ``lambda``
               (each message is projected onto the lambda-ball, paper 002 spec A5), a clipping
               radius ``tau`` (static clipping; centred clipping, from ``c`` = the honest
               coordinate median), ARC's clipping norm (Allouah et al. 2024), or ``norm`` when
               given.  The direction is IPM's (Xie, Koyejo and Gupta, UAI 2020); the size is the
               defence's own bound.  Against a rule that bounds no norm (mean, median, Krum,
               ...) ``r`` is line-searched (then it is ``opt_ipm``), or refused with
               ``unbounded = "error"``.
``opt_ipm``    ``-eps mu_h`` with ``eps`` chosen every round by a line search maximising
               ``||agg(H, forged) - mu_h||`` for the aggregator in use (ByzFL's optimised IPM,
               Allouah et al. 2023, "Fixing by mixing")
``opt_alie``   ``mu_h - z sigma_h`` (Baruch, Baruch and Goldberg, NeurIPS 2019), ``z`` by the same
               line search (ByzFL's optimised ALIE)
``mimic``      every Byzantine client copies one honest reply: the one with the largest
               component along the top principal direction of the centred honest replies
               (Karimireddy, He and Jaggi, ICLR 2022, "Byzantine-robust learning on heterogeneous
               datasets via bucketing"; computed per round from the h x h Gram matrix instead of
               their online power iteration)
``nonfinite``  every entry NaN, +inf or -inf: robust aggregators raise naming the clients or drop
               them (``nonfinite = "exclude"``); an aggregation that lets them through stops the
               run with an error naming the Byzantine clients
=============  =============================================================================

The defence: ``defence = "auto"`` (default) reads it from the algorithm when the run starts
(:meth:`Attack.prepare`, :func:`~fedrisk.attacks.defence.defence_of`); a config may name it
instead (``defence = "median"``, ``defence = { name = "krum", f = 4 }``,
``defence = { name = "frpg", lam = 1.6 }``).  The line search (:func:`line_maximize`) costs at
most ``evaluations <= 20`` aggregator evaluations per round and reply key.

Example:
    >>> import torch
    >>> from fedrisk.aggregators.base import InMemoryReplies
    >>> from fedrisk.algorithms.base import FedInfo, RoundContext
    >>> r = InMemoryReplies({k: {"g": torch.tensor([3.0, 4.0])} for k in range(4)})
    >>> ctx = RoundContext(0, FedInfo(4, (1,) * 4, 2))
    >>> MaxNorm(defence={"name": "frpg", "lam": 2.0}).apply(ctx, r, [3], torch.Generator()).as_dict()[3]["g"].tolist()
    [-1.2000000476837158, -1.600000023841858]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.attacks.base import Attack
from fedrisk.attacks.defence import Defence, defence_from_spec, defence_of
from fedrisk.attacks.standard import ReplyAttack, _finite_number
from fedrisk.errors import FedriskError
from fedrisk.tree import tensor_leaves, tree_flatten_vector, tree_unflatten_vector

__all__ = [
    "MAX_EVALUATIONS",
    "AdaptiveAttack",
    "MaxNorm",
    "Mimic",
    "NonFiniteAttack",
    "OptALIE",
    "OptIPM",
    "line_maximize",
    "mimic_index",
]

MAX_EVALUATIONS = 20
"""The most aggregator evaluations :func:`line_maximize` may spend per round (and reply key)."""

_GOLDEN = (math.sqrt(5) - 1) / 2


def line_maximize(fn: Callable[[float], float], low: float, high: float, evaluations: int = 16) -> tuple[float, float]:
    """Best-effort ``argmax_{low <= t <= high} fn(t)`` with exactly ``evaluations`` calls of ``fn``.

    A coarse grid first — ``low``, then ``low + (high - low) 2^-j`` for the ``ceil(evaluations/2)
    - 1`` scales ``j`` down to 0 (so both small and large scales are tried) — then golden-section
    refinement between the best grid point's neighbours with the remaining calls.  Returns
    ``(t, fn(t))`` of the best call.  The objective need not be unimodal; ties keep the first.

    Example:
        >>> t, v = line_maximize(lambda t: -(t - 3.0) ** 2, 0.0, 16.0, evaluations=16)
        >>> round(t, 1), v > -1e-3
        (3.0, True)
    """
    if isinstance(evaluations, bool) or not isinstance(evaluations, int) or not 3 <= evaluations <= MAX_EVALUATIONS:
        raise FedriskError(
            f"line search: evaluations = {evaluations!r} is not allowed; "
            f"it must be an integer in [3, {MAX_EVALUATIONS}]"
        )
    if not (math.isfinite(low) and math.isfinite(high)) or not 0 <= low < high:
        raise FedriskError(
            f"line search: the range [low, high] = [{low!r}, {high!r}] is empty or invalid; it needs 0 <= low < high "
            "(finite)"
        )
    best = [low, -math.inf]

    def call(t: float) -> float:
        v = fn(t)
        if v > best[1]:
            best[0], best[1] = t, v
        return v

    coarse = (evaluations + 1) // 2
    grid = [low] + [low + (high - low) * 2.0**-j for j in range(coarse - 2, -1, -1)]
    values = [call(t) for t in grid]
    i = values.index(max(values))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    x1, x2 = b - (b - a) * _GOLDEN, a + (b - a) * _GOLDEN
    f1: float | None = None
    f2: float | None = None
    for _ in range(evaluations - len(grid)):  # golden section on [a, b]
        if f1 is None:
            f1 = call(x1)
        elif f2 is None:
            f2 = call(x2)
        if f1 is not None and f2 is not None:  # both interior points known: shrink the bracket
            if f1 >= f2:
                b, x2, f2 = x2, x1, f1
                x1, f1 = b - (b - a) * _GOLDEN, None
            else:
                a, x1, f1 = x1, x2, f2
                x2, f2 = a + (b - a) * _GOLDEN, None
    return best[0], best[1]


def _floating(tree: Any) -> bool:
    leaves = tensor_leaves(tree)
    return bool(leaves) and all(t.is_floating_point() for t in leaves)


class AdaptiveAttack(Attack):
    """Base of the attacks on flattened replies: subclasses define :meth:`forge` and ``needs_defence``."""

    needs_defence: bool = False

    def __init__(self, defence: Any = "auto") -> None:
        self.defence_spec = defence
        self.defence: Defence | None = None if defence == "auto" else defence_from_spec(defence)
        self.round = 0  # the round being attacked (a defence may change over the rounds: FRPG's lam_schedule)

    def prepare(self, algorithm: Any, info: FedInfo, byzantine: Sequence[int]) -> None:
        if self.defence is None and self.needs_defence:
            self.defence = defence_of(algorithm)
        super().prepare(algorithm, info, byzantine)

    def forge(self, honest: Tensor, own: Tensor, gen: torch.Generator) -> Tensor:
        """The forged rows ``(b, d)`` from the honest rows ``(h, d)`` and the Byzantine clients' own ``(b, d)``."""
        raise NotImplementedError

    def _defence(self) -> Defence:
        if self.defence is None:
            raise FedriskError(
                f"attack {self.name!r} needs the server's defence: run it through a Simulation (which calls "
                "attack.prepare(algorithm, ...)) or give defence = an aggregator name or table"
            )
        return self.defence.in_round(self.round)

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        every = replies.as_dict()
        bad = set(int(k) for k in byzantine)
        honest_ids = [k for k in replies.clients if k not in bad]
        byz_ids = [k for k in replies.clients if k in bad]
        if not byz_ids:
            return replies
        self.round = ctx.round
        if not honest_ids:
            raise FedriskError(
                f"attack {self.name!r} needs the honest replies of the round; round {ctx.round} has none "
                f"(every one of the {len(byz_ids)} replying clients is Byzantine)"
            )
        out = {k: dict(v) for k, v in every.items()}
        for key in every[byz_ids[0]]:
            if not _floating(every[byz_ids[0]][key]):
                continue  # counters, indices: kept as the client computed them
            honest = torch.stack([tree_flatten_vector(every[k][key]) for k in honest_ids])
            own = torch.stack([tree_flatten_vector(every[k][key]) for k in byz_ids])
            forged = self.forge(honest, own, gen)
            for i, k in enumerate(byz_ids):
                out[k][key] = tree_unflatten_vector(forged[i].to(own.dtype), every[k][key])
        return InMemoryReplies(out)

    def _evaluator(self, honest: Tensor, b: int, gen: torch.Generator) -> Callable[[Tensor], float]:
        """``row -> ||agg(H, b copies of row) - mu_h||`` with one fixed aggregation generator."""
        defence = self._defence()
        mu = honest.mean(dim=0)
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))

        def distance(row: Tensor) -> float:
            rows = torch.cat([honest, row.unsqueeze(0).expand(b, -1)])
            agg = defence.aggregate(rows, torch.Generator().manual_seed(seed))
            return float(torch.linalg.vector_norm(agg - mu))

        return distance


class MaxNorm(AdaptiveAttack):
    """Defence-aware max-norm: ``c - r mu_h / ||mu_h||`` (see the module docstring).

    Args:
        norm: the message norm ``r``; 0 (default) takes the defence's own bound (FRPG's lambda, the
            clipping radius).
        unbounded: what to do against a defence that bounds no norm (mean, median, Krum, ...):
            ``"line_search"`` (default) chooses ``r`` in ``[0, high ||mu_h||]`` by
            :func:`line_maximize` (``evaluations`` calls, as ``opt_ipm``: along this direction
            the two attacks coincide), ``"error"`` refuses.
        defence: ``"auto"`` or an aggregator name / table (see the module docstring).

    Example:
        >>> h = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
        >>> MaxNorm(norm=5.0, defence="mean").forge(h, h[:1], torch.Generator()).tolist()
        [[-5.0, 0.0]]
    """

    name = "max_norm"
    UNBOUNDED = ("line_search", "error")

    def __init__(
        self,
        norm: float = 0.0,
        unbounded: str = "line_search",
        high: float = 64.0,
        evaluations: int = 16,
        defence: Any = "auto",
    ) -> None:
        super().__init__(defence)
        self.norm = _finite_number("max_norm: norm", norm)
        if self.norm < 0:
            raise FedriskError(f"max_norm: norm = {norm!r} is not allowed; it must be >= 0 (0: the defence's bound)")
        if unbounded not in self.UNBOUNDED:
            raise FedriskError(
                f"max_norm: unbounded = {unbounded!r} is not allowed; valid choices: {', '.join(self.UNBOUNDED)}"
            )
        self.unbounded = unbounded
        self._search = OptIPM(high=high, evaluations=evaluations, defence=defence)
        self._search.name = self.name
        self.needs_defence = self.norm == 0

    def prepare(self, algorithm: Any, info: FedInfo, byzantine: Sequence[int]) -> None:
        super().prepare(algorithm, info, byzantine)
        self._search.defence = self.defence

    def forge(self, honest: Tensor, own: Tensor, gen: torch.Generator) -> Tensor:
        b = own.shape[0]
        centre = torch.zeros_like(honest[0])
        if self.norm > 0:
            r: float | None = self.norm
        else:
            defence = self._defence()
            r = defence.radius(honest, b) if defence.radius is not None else None
            if r is None and self.unbounded == "error":
                raise FedriskError(
                    f"attack 'max_norm': the defence {defence.name} admits replies of any norm, so there is no "
                    "largest message to send; set unbounded = 'line_search' or use opt_ipm / opt_alie"
                )
            if r is None:  # -eps mu_h with eps line-searched: the same direction, the most harmful norm
                self._search.defence = defence
                return self._search.forge(honest, own, gen)
            if defence.centre is not None:
                centre = defence.centre(honest)
        mu = honest.mean(dim=0)
        norm = float(torch.linalg.vector_norm(mu))
        direction = mu / norm if norm > 0 else torch.zeros_like(mu)
        return (centre - r * direction).unsqueeze(0).expand(b, -1).clone()


class _LineSearchAttack(AdaptiveAttack):
    needs_defence = True
    default_high = 64.0

    def __init__(self, low: float = 0.0, high: float = 0.0, evaluations: int = 16, defence: Any = "auto") -> None:
        super().__init__(defence)
        self.low = _finite_number(f"{self.name}: low", low)
        self.high = _finite_number(f"{self.name}: high", high) if high else self.default_high
        if not 0 <= self.low < self.high:
            raise FedriskError(
                f"{self.name}: the line-search range [low, high] = [{self.low:g}, {self.high:g}] is empty; "
                "it needs 0 <= low < high"
            )
        if isinstance(evaluations, bool) or not isinstance(evaluations, int) or not 3 <= evaluations <= MAX_EVALUATIONS:
            raise FedriskError(
                f"{self.name}: evaluations = {evaluations!r} is not allowed; it must be an integer in "
                f"[3, {MAX_EVALUATIONS}] (aggregator evaluations per round)"
            )
        self.evaluations = evaluations
        self.last_scale: float | None = None

    def row(self, honest: Tensor, scale: float) -> Tensor:
        raise NotImplementedError

    def forge(self, honest: Tensor, own: Tensor, gen: torch.Generator) -> Tensor:
        distance = self._evaluator(honest, own.shape[0], gen)
        scale, _ = line_maximize(lambda t: distance(self.row(honest, t)), self.low, self.high, self.evaluations)
        self.last_scale = scale
        return self.row(honest, scale).unsqueeze(0).expand(own.shape[0], -1).clone()


class OptIPM(_LineSearchAttack):
    """Inner-product manipulation ``-eps mu_h`` with ``eps`` in ``[low, high]`` (default ``[0, 64]``)
    chosen per round by :func:`line_maximize` against the defence.

    Example:
        >>> h = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
        >>> OptIPM(high=8.0, defence="mean").forge(h, h[:1], torch.Generator()).tolist()
        [[-20.0]]
    """

    name = "opt_ipm"

    def row(self, honest: Tensor, scale: float) -> Tensor:
        return -scale * honest.mean(dim=0)


class OptALIE(_LineSearchAttack):
    """ "A little is enough" ``mu_h - z sigma_h`` with ``z`` in ``[low, high]`` (default ``[0, 64]``)
    chosen per round by :func:`line_maximize` against the defence (``sigma_h`` with Bessel's
    correction; 0 for one honest reply).

    Example:
        >>> h = torch.tensor([[0.0], [2.0]])
        >>> OptALIE(high=4.0, defence="mean").forge(h, h[:1], torch.Generator()).tolist()
        [[-4.656854152679443]]
    """

    name = "opt_alie"

    def row(self, honest: Tensor, scale: float) -> Tensor:
        std = honest.std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(honest[0])
        return honest.mean(dim=0) - scale * std


def mimic_index(honest: Tensor) -> int:
    """The honest row with the largest absolute component along the top principal direction of
    the centred honest rows (from the ``h x h`` Gram matrix: O(h^2 d)).

    Example:
        >>> mimic_index(torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 0.1], [-0.1, 0.0]]))
        2
    """
    dev = (honest - honest.mean(dim=0)).double()
    gram = dev @ dev.T
    _, vecs = torch.linalg.eigh(gram)
    top = vecs[:, -1]  # dev @ z is proportional to this eigenvector for z = dev^T top
    return int(torch.argmax(top.abs()))


class Mimic(AdaptiveAttack):
    """Every Byzantine client copies the honest reply chosen by :func:`mimic_index` (its floating
    keys; the others keep the client's own values).

    Example:
        >>> from fedrisk.algorithms.base import FedInfo, RoundContext
        >>> r = InMemoryReplies({k: {"w": torch.tensor([float(k) ** 3])} for k in range(5)})
        >>> ctx = RoundContext(0, FedInfo(5, (1,) * 5, 2))
        >>> Mimic().apply(ctx, r, [0], torch.Generator()).as_dict()[0]["w"].tolist()
        [64.0]
    """

    name = "mimic"

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        every = replies.as_dict()
        bad = set(int(k) for k in byzantine)
        honest_ids = [k for k in replies.clients if k not in bad]
        if not honest_ids and any(k in bad for k in replies.clients):
            raise FedriskError(
                f"attack 'mimic' needs the honest replies of the round; round {ctx.round} has none "
                "(every replying client is Byzantine)"
            )
        if not honest_ids:
            return replies
        keys = [key for key in sorted(every[honest_ids[0]]) if _floating(every[honest_ids[0]][key])]
        rows = torch.stack(
            [torch.cat([tree_flatten_vector(every[k][key]).double() for key in keys]) for k in honest_ids]
        )
        source = every[honest_ids[mimic_index(rows)]]
        copy = lambda own: {key: (source[key] if key in keys else value) for key, value in own.items()}  # noqa: E731
        out = {k: (copy(v) if k in bad else v) for k, v in every.items()}
        return InMemoryReplies(out)


class NonFiniteAttack(ReplyAttack):
    """Every entry of every Byzantine reply is ``value``: ``"nan"``, ``"inf"`` or ``"-inf"``.

    Example:
        >>> NonFiniteAttack("inf").forge_leaf(torch.zeros(2), None, torch.Generator()).tolist()
        [inf, inf]
    """

    name = "nonfinite"
    VALUES = ("nan", "inf", "-inf")

    def __init__(self, value: str = "nan") -> None:
        if value not in self.VALUES:
            raise FedriskError(f"nonfinite: value = {value!r} is not allowed; valid choices: {', '.join(self.VALUES)}")
        self.value = value

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        return torch.full_like(own, float(self.value))
