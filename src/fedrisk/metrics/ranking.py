"""Ranking metrics for multi-query data: NDCG@k.

``ndcg_at_k(scores, relevance, queries, k)`` ranks each query's items by score and averages the
per-query ``DCG@k / IDCG@k`` with ``DCG@k = Σ_{p ≤ k} gain(r_(p)) / log2(p + 1)``; ``gain`` is
``2^r − 1`` (``"exponential"``, the usual learning-to-rank definition and LibAUC's / SONG's) or
``r`` (``"linear"``, scikit-learn's ``ndcg_score``).  Tied scores get the average gain of their
tie group at each of the group's positions (scikit-learn's ``ignore_ties=False``), so the value
does not depend on the order of tied items.  Every query needs a relevant item (an error names
the first one without).  In configs: ``run.metrics = ["ndcg@10"]`` (:func:`parse_ndcg`; the
split's ``attrs["query"]`` are the query ids).

Example:
    >>> round(ndcg_at_k([0.9, 0.1, 0.8, 0.2, 0.3], [0, 1, 2, 0, 1], [0, 0, 1, 1, 1], k=2), 6)  # (1/log2(3) + 1)/2
    0.815465
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from fedrisk.errors import FedriskError, check_range
from fedrisk.metrics.classification import ArrayLike

__all__ = ["GAINS", "is_ranking_metric", "ndcg_at_k", "ndcg_metric", "ndcg_per_query", "parse_ndcg"]

GAINS = ("exponential", "linear")


def _arrays(scores: ArrayLike, relevance: ArrayLike, queries: ArrayLike) -> tuple[np.ndarray, ...]:
    arrays = []
    for name, value in (("scores", scores), ("relevance", relevance), ("queries", queries)):
        arr = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.ndim != 1:
            raise FedriskError(f"ndcg_at_k: {name} must be one value per item; got shape {arr.shape}")
        arrays.append(arr)
    s, r, q = arrays
    if not (len(s) == len(r) == len(q)):
        raise FedriskError(f"ndcg_at_k: {len(s)} scores, {len(r)} relevances and {len(q)} query ids differ in length")
    if len(s) == 0:
        raise FedriskError("ndcg_at_k: no items")
    if not np.all(np.isfinite(s.astype(np.float64))):
        raise FedriskError("ndcg_at_k: scores must be finite")
    r = r.astype(np.float64)
    if np.any(r < 0):
        raise FedriskError(f"ndcg_at_k: relevance labels must be >= 0; got {r.min()}")
    return s.astype(np.float64), r, q


def _dcg(s: np.ndarray, gains: np.ndarray, k: int) -> float:
    order = np.argsort(-s, kind="mergesort")
    s, gains = s[order], gains[order]
    discount = 1.0 / np.log2(np.arange(2, len(s) + 2))
    discount[k:] = 0.0
    starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1]
    ends = np.r_[starts[1:], len(s)]
    total = 0.0
    for a, b in zip(starts, ends):  # a tie group shares its mean gain over its positions
        total += gains[a:b].mean() * discount[a:b].sum()
    return total


def ndcg_per_query(
    scores: ArrayLike, relevance: ArrayLike, queries: ArrayLike, k: int | None = None, *, gain: str = "exponential"
) -> dict[object, float]:
    """``{query id: NDCG@k}`` (``k = None``: the whole list).  See :func:`ndcg_at_k`."""
    if gain not in GAINS:
        raise FedriskError(f"ndcg_at_k: unknown gain {gain!r}; allowed: {', '.join(GAINS)}")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise FedriskError(f"ndcg_at_k: k must be an integer >= 1 or None; got {k!r}")
        check_range("ndcg_at_k: k", int(k), 1)
    s, r, q = _arrays(scores, relevance, queries)
    out: dict[object, float] = {}
    for query in np.unique(q):
        rows = q == query
        g = 2.0 ** r[rows] - 1 if gain == "exponential" else r[rows]
        cut = int(rows.sum()) if k is None else int(k)
        ideal = np.sort(g)[::-1][:cut]
        idcg = float(np.sum(ideal / np.log2(np.arange(2, len(ideal) + 2))))
        if idcg <= 0:
            raise FedriskError(
                f"ndcg_at_k: query {query.item() if hasattr(query, 'item') else query} has no relevant item "
                "(every relevance is 0); NDCG is undefined for it. Drop the query or give it a relevant item"
            )
        out[query.item() if hasattr(query, "item") else query] = _dcg(s[rows], g, cut) / idcg
    return out


def ndcg_at_k(
    scores: ArrayLike, relevance: ArrayLike, queries: ArrayLike, k: int | None = 10, *, gain: str = "exponential"
) -> float:
    """The mean over queries of NDCG@k (module docstring); ``k = None`` ranks the whole list.

    Example (linear gain equals scikit-learn's ``ndcg_score`` on the per-query rows):
        >>> ndcg_at_k([0.3, 0.2, 0.1], [1, 2, 0], [5, 5, 5], k=None, gain="linear") < 1.0
        True
    """
    return float(np.mean(list(ndcg_per_query(scores, relevance, queries, k, gain=gain).values())))


def is_ranking_metric(name: str) -> bool:
    """Whether the config metric ``name`` (``"ndcg"``, ``"ndcg@<k>"``) needs the split's query ids.

    Example:
        >>> is_ranking_metric("ndcg@5"), is_ranking_metric("auroc")
        (True, False)
    """
    return name == "ndcg" or name.startswith("ndcg@")


def ndcg_metric(scores: ArrayLike, relevance: ArrayLike, queries: ArrayLike | None = None, *, k: int | None) -> float:
    """:func:`ndcg_at_k` with ``queries = None`` read as one query (the whole list ranked)."""
    if queries is None:
        queries = np.zeros(len(np.asarray(relevance.detach().cpu() if hasattr(relevance, "detach") else relevance)))
    return ndcg_at_k(scores, relevance, queries, k)


def parse_ndcg(name: str) -> Callable[..., float]:
    """The metric ``f(scores, relevance, queries=None)`` named ``"ndcg"`` (whole lists) or
    ``"ndcg@<k>"`` (exponential gain; the query ids are the split's ``attrs["query"]``).

    Example:
        >>> parse_ndcg("ndcg@1")([0.9, 0.1, 0.2, 0.8], [0, 1, 1, 0], [0, 0, 1, 1])   # query 1: 0 / 1
        0.0
        >>> parse_ndcg("ndcg@0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: metric 'ndcg@0': k must be an integer >= 1; allowed forms: ndcg, ndcg@<k> ...
    """
    if name == "ndcg":
        return functools.partial(ndcg_metric, k=None)
    text = name.removeprefix("ndcg@")
    if not text.isdigit() or int(text) < 1:
        raise FedriskError(f"metric {name!r}: k must be an integer >= 1; allowed forms: ndcg, ndcg@<k> (e.g. ndcg@10)")
    return functools.partial(ndcg_metric, k=int(text))
