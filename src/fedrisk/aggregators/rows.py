"""The stacked replies ``(n, d)`` shared by the robust rules and the pre-aggregations: the input
check, the check of ``f`` against a rule's bound, row clipping and the pairwise distances (from
one centred Gram matrix).

:mod:`fedrisk.aggregators.robust` (the rules) and :mod:`fedrisk.aggregators.preaggregation`
(bucketing, nearest-neighbour mixing, ARC) both build on this module; neither imports the other's
internals.

Example:
    >>> import torch
    >>> pairwise_sq_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]])).tolist()
    [[0.0, 25.0], [25.0, 0.0]]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedrisk.errors import FedriskError

__all__ = ["centred_gram", "check_f", "check_rows", "clip_rows", "medoid_gram", "pairwise_sq_distances"]


def check_rows(x: Tensor, rule: str) -> None:
    """``x`` must be a 2-D floating tensor with at least one row and only finite entries."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise FedriskError(f"{rule}: replies must be a floating tensor of shape (n, d); got {_describe(x)}")
    if x.shape[0] == 0:
        raise FedriskError(f"{rule}: no replies to aggregate (n = 0)")
    finite = torch.isfinite(x).all(dim=1)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten().tolist()
        raise FedriskError(
            f"{rule}: replies {bad} (row numbers) contain NaN/inf; robust rules need finite replies "
            "(the aggregator classes can drop them with nonfinite='exclude')"
        )


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


_BLOCK = 1 << 16  # columns per block of the centred Gram matrix


def centred_gram(x: Tensor, center: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``G = (x - center)(x - center)^T`` as an ``(n, n)`` tensor, one matmul per block of
    ``2^16`` columns (the centred ``(n, d)`` copy of ``x`` never exists as a whole), in
    ``dtype`` (default: ``x``'s).

    Example:
        >>> centred_gram(torch.tensor([[1.0, 2.0], [3.0, 2.0]]), torch.tensor([1.0, 2.0])).tolist()
        [[0.0, 0.0], [0.0, 4.0]]
    """
    n, d = x.shape
    dtype = x.dtype if dtype is None else dtype
    g = torch.zeros(n, n, dtype=dtype, device=x.device)
    for j in range(0, d, _BLOCK):
        b = (x[:, j : j + _BLOCK] - center[j : j + _BLOCK]).to(dtype)
        g.addmm_(b, b.T)
    return g


def _gram_sq_distances(g: Tensor) -> Tensor:
    sq = g.diagonal()
    d = (sq[:, None] + sq[None, :] - 2 * g).clamp_min(0)
    d.fill_diagonal_(0)
    return d


def medoid_gram(x: Tensor, dtype: torch.dtype | None = None) -> tuple[int, Tensor]:
    """``(m, G)``: a central row ``m`` and the Gram matrix of the rows centred at ``x_m``.

    The Gram identity ``|a|^2 + |b|^2 - 2 a.b`` cancels badly when ``|a|`` is large compared with
    ``|a - b|`` (a common offset, or rows far from the origin), so the rows are centred first.
    A first, uncentred Gram matrix (one matmul, no copy) gives rough distances; the row with the
    smallest median distance to the others is a member of the majority cluster however far the
    outliers are, and centring at it keeps the majority's distances precise.
    """
    m = int(_gram_sq_distances(x @ x.T).median(dim=1).values.argmin())
    return m, centred_gram(x, x[m], dtype)


def pairwise_sq_distances(x: Tensor) -> Tensor:
    """``D[i, j] = ||x_i - x_j||^2`` as an ``(n, n)`` tensor, from one centred Gram matrix.

    The rows are centred at a central row first (see :func:`centred_gram`): the distances do
    not change, but neither a common offset nor a far outlier then costs the inliers' distances
    their precision.  Cost: two ``(n, n, d)`` matmuls, no loop over rows or coordinates.  The
    diagonal is exactly 0 and negatives from rounding are clamped to 0.

    Example:
        >>> pairwise_sq_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]])).tolist()
        [[0.0, 25.0], [25.0, 0.0]]
    """
    return _gram_sq_distances(medoid_gram(x)[1])


def check_f(rule: str, f: Any, n: int, ok: bool, need: str) -> None:
    """``f`` must be an integer >= 0 and satisfy the rule's bound ``need`` (``ok``) for ``n`` replies."""
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise FedriskError(
            f"{rule}: f = {f!r} is not allowed; it must be an integer >= 0 (the number of Byzantine replies)"
        )
    if not ok:
        raise FedriskError(f"{rule}: f = {f} is not allowed with n = {n} replies; it needs {need}")


def clip_rows(x: Tensor, radius: Tensor | float) -> Tensor:
    """Each row scaled to norm at most ``radius`` (a scalar or one radius per row):
    ``x_i min(1, radius / ||x_i||)``, the projection of each row onto the l2 ball.

    The one row clipping of the package: FRPG's server projection of the messages (spec A5),
    centred and static clipping, ARC.

    Example:
        >>> clip_rows(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0).tolist()
        [[0.6000000238418579, 0.800000011920929], [0.30000001192092896, 0.4000000059604645]]
    """
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    r = torch.as_tensor(radius, dtype=x.dtype).reshape(-1, 1) if isinstance(radius, Tensor) else radius
    return x * torch.where(norms > r, r / norms.clamp_min(torch.finfo(x.dtype).tiny), torch.ones_like(norms))
