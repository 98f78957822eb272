"""Pre-aggregation steps that run before a robust rule on the stacked replies ``(n, d)``.

* :func:`bucketing` (Karimireddy, He and Jaggi, 2022): shuffle the rows and average them in
  buckets of ``s``; the robust rule then sees ``ceil(n / s)`` bucket means, which are closer to
  each other under heterogeneity (at the price of multiplying the Byzantine fraction by up to s).
* :func:`nearest_neighbor_mixing` (Allouah et al., 2023): replace each row by the mean of its
  ``n - f`` nearest rows (itself included).
* :func:`arc` (adaptive robust clipping, Allouah et al., 2024): the ``floor(2 (f/n)(n - f))``
  rows of largest norm clipped to the norm of the next one.

Example:
    >>> import torch
    >>> x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    >>> bucketing(x, 2, torch.Generator().manual_seed(0)).shape
    torch.Size([2, 1])
    >>> nearest_neighbor_mixing(torch.tensor([[0.0], [1.0], [2.0], [100.0]]), f=1).flatten().tolist()
    [1.0, 1.0, 1.0, 34.333335876464844]
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrisk.aggregators.rows import check_f, check_rows, clip_rows, pairwise_sq_distances
from fedrisk.errors import FedriskError

__all__ = [
    "ARC_NAME",
    "PRE_AGGREGATIONS",
    "arc",
    "arc_clip_count",
    "bucketing",
    "nearest_neighbor_mixing",
    "pre_aggregate",
]

ARC_NAME = "arc"
PRE_AGGREGATIONS = ("none", "bucketing", "nnm", ARC_NAME)


def bucketing(x: Tensor, s: int, gen: torch.Generator) -> Tensor:
    """Means of ``ceil(n / s)`` buckets of a random permutation of the rows (the last may be smaller).

    Example:
        >>> x = torch.arange(6.0).reshape(6, 1)
        >>> sorted(bucketing(x, 3, torch.Generator().manual_seed(1)).flatten().tolist()) != []
        True
    """
    check_rows(x, "bucketing")
    if not isinstance(s, int) or isinstance(s, bool) or s < 1:
        raise FedriskError(f"bucketing: bucket size s = {s!r} is not allowed; it must be an integer >= 1")
    n = x.shape[0]
    perm = torch.randperm(n, generator=gen)
    shuffled = x[perm.to(x.device)]
    return torch.stack([shuffled[i : i + s].mean(dim=0) for i in range(0, n, s)])


def nearest_neighbor_mixing(x: Tensor, f: int) -> Tensor:
    """Row ``i`` becomes the mean of its ``n - f`` nearest rows in l2 (itself included).  Needs ``2f < n``.

    Example:
        >>> nearest_neighbor_mixing(torch.tensor([[0.0], [2.0], [10.0]]), f=1).flatten().tolist()
        [1.0, 1.0, 6.0]
    """
    check_rows(x, "nearest_neighbor_mixing")
    n = x.shape[0]
    if not isinstance(f, int) or isinstance(f, bool) or f < 0 or 2 * f >= n:
        raise FedriskError(
            f"nearest_neighbor_mixing: f = {f!r} is not allowed with n = {n} replies; it needs 0 <= 2f < n"
        )
    d = pairwise_sq_distances(x)
    d.fill_diagonal_(-1.0)  # itself first
    idx = d.topk(n - f, dim=1, largest=False).indices
    mix = torch.zeros(n, n, dtype=x.dtype, device=x.device)
    mix.scatter_(1, idx, 1.0 / (n - f))  # row i: weight 1/(n - f) on each of its n - f neighbours
    return mix @ x


def arc_clip_count(n: int, f: int) -> int:
    """ARC's number of clipped rows, ``k = floor(2 (f / n) (n - f))``.

    Example:
        >>> arc_clip_count(20, 4)
        6
    """
    return int(2 * f * (n - f) // n)


def arc(x: Tensor, f: int) -> Tensor:
    """Adaptive robust clipping (Allouah et al., NeurIPS 2024, "Boosting robustness by clipping
    gradients in distributed learning"), a pre-aggregation returning ``(n, d)``: the
    ``k = floor(2 (f/n)(n - f))`` rows of largest norm are clipped to the norm of the
    ``(k + 1)``-th largest; the others are unchanged (ties by row order).

    Example:
        >>> arc(torch.tensor([[1.0], [2.0], [-3.0], [100.0]]), 1).flatten().tolist()
        [1.0, 2.0, -3.0, 3.0]
    """
    check_rows(x, ARC_NAME)
    n = x.shape[0]
    check_f(ARC_NAME, f, n, 2 * f < n, "2f < n")
    k = arc_clip_count(n, f)
    if k == 0:
        return x.clone()
    norms = torch.linalg.vector_norm(x, dim=1)
    order = torch.sort(norms, descending=True, stable=True).indices
    radius = norms[order[k]]
    out = x.clone()
    out[order[:k]] = clip_rows(x[order[:k]], radius)
    return out


def pre_aggregate(x: Tensor, pre: str, f: int = 0, bucket_size: int = 2, gen: torch.Generator | None = None) -> Tensor:
    """The pre-aggregation ``pre`` of :data:`PRE_AGGREGATIONS` on the rows ``(n, d)``: ``"none"``
    (``x`` itself), ``"bucketing"`` (``bucket_size``; ``gen`` draws the permutation), ``"nnm"`` or
    ``"arc"`` (both with ``f``).  Shared by the robust aggregators and FRPG / LFRPG's server.

    Example:
        >>> pre_aggregate(torch.tensor([[0.0], [2.0], [10.0]]), "nnm", f=1).flatten().tolist()
        [1.0, 1.0, 6.0]
    """
    if pre == "none":
        return x
    if pre == "bucketing":
        return bucketing(x, bucket_size, gen if gen is not None else torch.Generator().manual_seed(0))
    if pre == "nnm":
        return nearest_neighbor_mixing(x, f)
    if pre == ARC_NAME:
        return arc(x, f)
    raise FedriskError(f"pre = {pre!r} is not allowed; valid choices: {', '.join(PRE_AGGREGATIONS)}")
