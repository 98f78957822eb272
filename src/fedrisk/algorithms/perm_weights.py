"""PERM's mixing weights (eq. (2) of Deng et al., NeurIPS 2023) and a rule of thumb for lam.

* :func:`mixing_weights` — eq. (2) solved exactly; :func:`mixing_weights_pgd` — the paper's
  projected GD (the test oracle); :func:`squared_distances` — ``D_ij = ||g_i - g_j||^2``.
* :func:`partner_thresholds` / :func:`lambda_guide` — where lam changes the number of partners.
  Row i of eq. (2) puts weight on its k closest clients (itself first, ``D_ii = 0``) exactly
  when ``lam_{i,k} < lam <= lam_{i,k+1}`` with (KKT, sorted ``d_1 <= d_2 <= ...`` with counts ``m``)::

      lam_{i,k} = 1/2 sum_{l <= k} m_l (d_k - d_l)

  (the condition ``d_k < tau_k`` of :func:`mixing_weights` rearranged), so below
  ``min_i lam_{i,2}`` every client trains alone and above ``max_i lam_{i,N}`` every client
  weights every client.  The thresholds scale like ``n * D``: lam must be chosen per data set,
  between these two values (docs/results/perm.md, "choosing lam").

Example:
    >>> import torch
    >>> D = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]])
    >>> partner_thresholds(D, [10, 10, 10])[0].tolist()  # client 0: a 2nd partner above 5, a 3rd above 35
    [0.0, 5.0, 35.0]
    >>> (mixing_weights(D, [10] * 3, 5.01)[0] > 0).sum().item(), (mixing_weights(D, [10] * 3, 4.99)[0] > 0).sum().item()
    (2, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedrisk.errors import FedriskError, check_range
from fedrisk.objectives.minimax import project_simplex


def _check_weight_inputs(sq_distances: Any, counts: Any, lam: float) -> tuple[Tensor, Tensor]:
    if not (isinstance(lam, (int, float)) and lam > 0 and lam != float("inf")):
        raise FedriskError(f"lam = {lam!r} must be a finite number > 0 (the regulariser of PERM's eq. (2))")
    D = torch.as_tensor(sq_distances, dtype=torch.float64)
    n = torch.as_tensor(counts, dtype=torch.float64, device=D.device)
    if D.dim() != 2 or D.shape[0] != D.shape[1] or n.shape != (D.shape[0],):
        raise FedriskError(
            f"mixing_weights needs an N x N matrix of squared distances and N counts; got {tuple(D.shape)} "
            f"and {tuple(n.shape)}"
        )
    if not bool(torch.isfinite(D).all()) or bool((D < 0).any()):
        raise FedriskError("squared distances must be finite and >= 0")
    if bool((n <= 0).any()):
        empty = torch.nonzero(n <= 0).flatten().tolist()
        raise FedriskError(f"clients {empty} have no data (n_j = 0); PERM's weights need n_j >= 1 for every client")
    return D, n


def mixing_weights(sq_distances: Any, counts: Sequence[int] | Tensor, lam: float) -> Tensor:
    """The N x N mixing weights of eq. (2), exactly; row i is client i's alpha_i on the simplex.

    For row i with ``D_ij = ||grad f_i(w) - grad f_j(w)||^2`` the KKT conditions of
    ``min_{alpha in Delta_N} sum_j alpha(j) D_ij + lam sum_j alpha(j)^2 / n_j`` give
    ``alpha(j) = n_j / (2 lam) * max(0, tau_i - D_ij)`` (spec §1.2); tau_i is found by sorting
    ``D_i`` and taking the largest active set ``{j : D_ij < tau}`` consistent with
    ``sum_j alpha(j) = 1``.  lam -> 0 gives e_i (local training), lam -> inf gives n_j / n (FedAvg).

    Example:
        >>> D = torch.tensor([[0.0, 9.0], [9.0, 0.0]])
        >>> mixing_weights(D, [1, 1], lam=1e-3).tolist(), mixing_weights(D, [1, 3], lam=1e6).round(decimals=4).tolist()
        ([[1.0, 0.0], [0.0, 1.0]], [[0.25, 0.75], [0.25, 0.75]])
    """
    D, n = _check_weight_inputs(sq_distances, counts, lam)
    N = D.shape[0]
    order = D.argsort(dim=1, stable=True)
    d = D.gather(1, order)
    m = n[order]
    tau_k = (2.0 * lam + (m * d).cumsum(1)) / m.cumsum(1)  # tau if the first k sorted entries are active
    active = d < tau_k  # true on a prefix (k = 1 always)
    k = (active * torch.arange(1, N + 1, dtype=torch.float64, device=D.device)).argmax(dim=1, keepdim=True)
    tau = tau_k.gather(1, k)
    alpha = n / (2.0 * lam) * (tau - D).clamp_min(0.0)
    return alpha / alpha.sum(1, keepdim=True)


def mixing_weights_pgd(
    sq_distances: Any, counts: Sequence[int] | Tensor, lam: float, steps: int = 300, init: Tensor | None = None
) -> Tensor:
    """eq. (2) by the paper's T_alpha steps of projected GD (step 1/L_g, L_g = 2 lam / n_min),
    started at uniform weights (or ``init``, a warm start).  The test oracle of :func:`mixing_weights`.

    Example:
        >>> D = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]])
        >>> gap = mixing_weights_pgd(D, [10, 10, 10], 10.0) - mixing_weights(D, [10, 10, 10], 10.0)
        >>> bool(gap.abs().max() < 1e-12)
        True
    """
    D, n = _check_weight_inputs(sq_distances, counts, lam)
    check_range("steps", steps, 1)
    N = D.shape[0]
    alpha = torch.full((N, N), 1.0 / N, dtype=torch.float64, device=D.device) if init is None else init.to(D).clone()
    step = float(n.min()) / (2.0 * lam)
    for _ in range(steps):
        alpha = project_simplex(alpha - step * (D + 2.0 * lam * alpha / n))
    return alpha


def squared_distances(grads: Tensor) -> Tensor:
    """``D_ij = ||g_i - g_j||^2`` of the rows of ``grads`` [N, d] by the Gram trick
    ``||g_i||^2 + ||g_j||^2 - 2 <g_i, g_j>`` (P14), clamped at 0, symmetric, zero diagonal.

    Example:
        >>> squared_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]])).tolist()
        [[0.0, 25.0], [25.0, 0.0]]
    """
    g = grads.to(torch.float64)
    sq = (g * g).sum(1)
    D = (sq[:, None] + sq[None, :] - 2.0 * g @ g.T).clamp_min(0.0)
    D = 0.5 * (D + D.T)
    return D.fill_diagonal_(0.0)


def partner_thresholds(sq_distances: Any, counts: Sequence[int] | Tensor) -> Tensor:
    """``T[i, k-1] = lam_{i,k}``: the lam above which row i of eq. (2) has at least k non-zero
    weights (module docstring; ``T[i, 0] = 0``, non-decreasing along each row).

    Example:
        >>> partner_thresholds(torch.tensor([[0.0, 2.0], [2.0, 0.0]]), [3, 1]).tolist()
        [[0.0, 3.0], [0.0, 1.0]]
    """
    D, n = _check_weight_inputs(sq_distances, counts, 1.0)
    order = D.argsort(dim=1, stable=True)
    d = D.gather(1, order)
    m = n[order]
    return 0.5 * (d * m.cumsum(1) - (m * d).cumsum(1))


def lambda_guide(sq_distances: Any, counts: Sequence[int] | Tensor, lam: float | None = None, points: int = 7) -> str:
    """A few lines for users choosing lam: the distribution of the off-diagonal ``D_ij``, the lam
    range over which the number of partners changes (below it every client trains alone, above
    it every client weights all clients) and the mean number of non-zero weights per row on a
    log grid of lam across that range (with ``lam`` marked, when given).

    Example:
        >>> D = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]])
        >>> print(lambda_guide(D, [10, 10, 10], lam=10.0, points=3))  # doctest: +NORMALIZE_WHITESPACE
        PERM discrepancies D_ij = ||grad f_i(w) - grad f_j(w)||^2 over 6 pairs: min 1, median 4, max 4
        lam range where the number of partners changes: 5 .. 35 (lam <= 5: every client alone;
        lam > 35: every client weights all 3)
        mean partners per client at lam = 5: 1, 13.23: 1.667, 35: 3; this run's lam = 10: 1.667
    """
    D, n = _check_weight_inputs(sq_distances, counts, 1.0)
    N = D.shape[0]
    check_range("points", points, 2)
    off = D[~torch.eye(N, dtype=torch.bool, device=D.device)]
    T = partner_thresholds(D, n)
    if N < 2:
        return "PERM discrepancies: one client, nothing to weigh (lam has no effect)"
    lo, hi = float(T[:, 1].min()), float(T[:, -1].max())

    def partners(value: float) -> float:
        return float((value > T).sum(1).double().mean()) if value > 0 else 1.0

    q = off.quantile(torch.tensor([0.0, 0.5, 1.0], dtype=off.dtype, device=off.device)).tolist()
    lines = [
        f"PERM discrepancies D_ij = ||grad f_i(w) - grad f_j(w)||^2 over {off.numel()} pairs: "
        f"min {q[0]:.4g}, median {q[1]:.4g}, max {q[2]:.4g}",
        f"lam range where the number of partners changes: {lo:.4g} .. {hi:.4g}\n"
        f"(lam <= {lo:.4g}: every client alone; lam > {hi:.4g}: every client weights all {N})",
    ]
    if hi > lo > 0:
        grid = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * t / (points - 1)) for t in range(points)]
        grid[0], grid[-1] = lo, hi
    else:
        grid = [lo, hi]
    shown = ", ".join(f"{g:.4g}: {partners(g * (1 + 1e-12)) if g == hi else partners(g):.4g}" for g in grid)
    line = f"mean partners per client at lam = {shown}"
    if lam is not None:
        line += f"; this run's lam = {lam:.4g}: {partners(lam):.4g}"
    lines.append(line)
    return "\n".join(lines)
