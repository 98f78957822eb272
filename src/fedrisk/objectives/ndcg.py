r"""NDCG for multi-query ranking as an X-risk: the SONG listwise surrogate with per-query u.

Qiu, Hu, Zhang, Zhou & Yang, *Large-scale Stochastic Optimization of NDCG Surrogates for Deep
Learning with Provable Convergence*, ICML 2022 (SONG); FeDXL (Guo et al., ICML 2023) lists NDCG
among the X-risks of eq. (1).  For a query ``q`` with items ``S_q`` and graded relevances
``r ∈ {0, 1, ...}``, the rank of a relevant item ``i`` is ``Σ_{j ∈ S_q} 1[h_j ≥ h_i]``; replacing the
indicator by a surrogate ``ℓ(h_i, h_j)`` of ``1[h_j ≥ h_i]`` gives the compositional risk::

    R(w) = (1/|S|) Σ_{(q, i) ∈ S} f_{q,i}( g(w; i, S_q) ),     g(w; i, S_q) = mean_{j ∈ S_q} ℓ(h_i, h_j)
    f_{q,i}(g) = −(2^{r_i} − 1) / (Z_q log2(1 + N g))

with ``S`` the relevant (query, item) pairs, ``Z_q`` the ideal DCG of ``q`` and ``N`` the number of
items (``N g`` estimates the rank; LibAUC uses one ``N`` for every query).  The state is one
``u_{q,i}`` per relevant pair — per query, never shared between queries — updated by
``u ← (1 − γ) u + γ ĝ`` (SONG line 5); the gradient is ``mean ∇f(u) ∇ĝ`` with

    ∇f(u) = (2^r − 1) N / (Z_q ln 2 · log2(1 + N u)² · (1 + N u)).

:func:`song_surrogate` is one minibatch of LibAUC's ``NDCGLoss`` (``topk = -1``, SONG) in value,
gradient and state; :func:`ndcg_risk` the exact surrogate risk; the metric NDCG@k is
:func:`fedrisk.metrics.ranking.ndcg_at_k`.

Example (a query whose relevant item is ranked first has a tiny rank estimate):
    >>> import torch
    >>> h = torch.tensor([[3.0, 0.0, -1.0]])       # item 0 relevant, then two sampled items
    >>> loss, u = song_surrogate(h, torch.tensor([[2]]), torch.ones(1, 1), num_items=3,
    ...                          num_relevant=torch.tensor([1.0]), ideal_dcg=torch.tensor([3.0]), gamma=1.0)
    >>> round(float(u[0, 0]), 4)                   # mean_j (1 − (h_0 − h_j))_+² = (1 + 0 + 0)/3
    0.3333
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedrisk.errors import FedriskError, check_range
from fedrisk.objectives.xrisk import PAIRWISE_LOSSES, pairwise_loss

__all__ = ["check_queries", "ideal_dcg", "ndcg_grad_weight", "ndcg_risk", "song_surrogate"]


def ideal_dcg(relevance: Tensor, k: int | None = None) -> Tensor:
    """``Z = Σ_{p ≤ k} (2^{r_(p)} − 1) / log2(p + 1)`` over the relevances sorted decreasingly.

    Example:
        >>> round(float(ideal_dcg(torch.tensor([0, 2, 1]))), 6)   # 3/log2(2) + 1/log2(3)
        3.63093
    """
    r = torch.sort(relevance.to(torch.float64), descending=True).values
    if k is not None:
        r = r[:k]
    positions = torch.arange(2, r.shape[0] + 2, dtype=torch.float64, device=r.device)
    return ((2.0**r - 1) / torch.log2(positions)).sum()


def check_queries(relevance: Tensor, queries: Tensor, where: str = "data") -> None:
    """Every query needs a relevant item (``r > 0``): NDCG is 0/0 otherwise.  Raises naming the
    first such query.

    Example:
        >>> check_queries(torch.tensor([1, 0, 0, 0]), torch.tensor([0, 0, 7, 7]), "train")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: train: query 7 has no relevant item (every relevance is 0); NDCG is ...
    """
    if relevance.shape != queries.shape:
        raise FedriskError(f"{where}: {relevance.shape[0]} relevances but {queries.shape[0]} query ids")
    if torch.any(relevance < 0):
        raise FedriskError(f"{where}: relevance labels must be >= 0; got {int(relevance.min())}")
    ids = torch.unique(queries)
    best = torch.zeros(ids.shape[0], dtype=relevance.dtype, device=relevance.device).scatter_reduce(
        0, torch.searchsorted(ids, queries), relevance, reduce="amax", include_self=True
    )
    empty = ids[best <= 0]
    if empty.numel():
        raise FedriskError(
            f"{where}: query {int(empty[0])} has no relevant item (every relevance is 0); NDCG is undefined for it. "
            "Drop the query or give it a relevant item"
        )


def ndcg_grad_weight(u: Tensor, relevance: Tensor, num_items: int, ideal: Tensor) -> Tensor:
    """``∇f(u) = (2^r − 1) N / (Z ln 2 log2(1 + N u)² (1 + N u))`` (module docstring), elementwise;
    ``ideal`` broadcasts against ``u`` (one ``Z_q`` per query row)."""
    gain = 2.0 ** relevance.to(u.dtype) - 1
    nu = num_items * u
    return gain * num_items / (torch.log2(1 + nu) ** 2 * (1 + nu) * math.log(2)) / ideal


def song_surrogate(
    scores: Tensor,
    relevance: Tensor,
    u: Tensor,
    *,
    num_items: int,
    num_relevant: Tensor,
    ideal_dcg: Tensor,
    gamma: float,
    margin: float = 1.0,
    surrogate: str = "squared_hinge",
) -> tuple[Tensor, Tensor]:
    """One SONG minibatch: ``(loss, u_new)``, LibAUC's ``NDCGLoss`` (``topk = -1``).

    Args:
        scores: ``[Q, m]`` scores of ``Q`` sampled queries' ``m`` sampled items, the first ``P``
            of each row the sampled relevant items (the anchors), the rest any items of the query.
        relevance: ``[Q, P]`` the anchors' relevances.
        u: ``[Q, P]`` the anchors' stored estimates ``u_{q,i}``.
        num_items: ``N`` of the rank estimate ``N g``.
        num_relevant: ``[Q]`` number of relevant items of each query (``|S_q^+|``).
        ideal_dcg: ``[Q]`` ``Z_q``.
        gamma: the moving-average weight of ``u``.

    The loss is ``mean_q |S_q^+| mean_i ∇f(u_new) ĝ_{q,i}`` with ``∇f`` constant, so its gradient
    is the SONG gradient (through both sides of every pair).
    """
    P = relevance.shape[1]
    anchors = scores[:, :P]
    if surrogate not in PAIRWISE_LOSSES:
        raise FedriskError(f"unknown surrogate {surrogate!r}; allowed: {', '.join(PAIRWISE_LOSSES)}")
    # [Q, P, m]: anchor i of query q against the sampled items of q only
    g = PAIRWISE_LOSSES[surrogate](anchors[:, :, None], scores[:, None, :], margin).mean(-1)
    u_new = (1 - gamma) * u + gamma * g.detach()
    weight = ndcg_grad_weight(u_new, relevance, num_items, ideal_dcg.to(scores.dtype)[:, None]).detach()
    loss = (num_relevant.to(scores.dtype) * (weight * g).mean(-1)).mean()
    return loss, u_new


def ndcg_risk(
    scores: Tensor,
    relevance: Tensor,
    queries: Tensor,
    *,
    num_items: int | None = None,
    margin: float = 1.0,
    surrogate: str = "squared_hinge",
) -> Tensor:
    """The exact SONG risk ``mean_{(q,i) relevant} −(2^r − 1) / (Z_q log2(1 + N g))`` on full lists
    (``N`` = the largest query's size unless given; ``g`` over every item of the query).

    Example (the risk is −1 per query for a perfect, margin-separated ranking with N g = 1):
        >>> h, r, q = torch.tensor([5.0, 0.0, 9.0, 1.0]), torch.tensor([1, 0, 1, 0]), torch.tensor([0, 0, 1, 1])
        >>> round(float(ndcg_risk(h, r, q, num_items=2)), 6)
        -1.0
    """
    if surrogate not in PAIRWISE_LOSSES:
        raise FedriskError(f"unknown surrogate {surrogate!r}; allowed: {', '.join(PAIRWISE_LOSSES)}")
    check_queries(relevance, queries, "ndcg_risk")
    ids = torch.unique(queries)
    n = num_items or int(max(int((queries == q).sum()) for q in ids))
    check_range("num_items", n, 1)
    terms = []
    for q in ids:
        rows = queries == q
        h, r = scores[rows], relevance[rows]
        rel = r > 0
        g = pairwise_loss(surrogate, h[rel], h, margin).mean(1)
        terms.append(-(2.0 ** r[rel].to(h.dtype) - 1) / (ideal_dcg(r).to(h.dtype) * torch.log2(1 + n * g)))
    return torch.cat(terms).mean()
