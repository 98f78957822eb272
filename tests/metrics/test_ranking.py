"""NDCG@k against scikit-learn's ndcg_score (linear gain) and a direct computation (exponential gain)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from fedrisk.errors import FedriskError
from fedrisk.metrics import ndcg_at_k, ndcg_per_query, parse_metric


@pytest.mark.parametrize("seed", range(3))
def test_ndcg_equals_sklearn_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(2, 10))
        scores = rng.integers(0, 4, n).astype(float)  # many ties
        rel = rng.integers(0, 4, n)
        rel[0] = max(rel[0], 1)
        for k in (None, 1, 3):
            ours = ndcg_at_k(scores, rel, np.zeros(n), k=k, gain="linear")
            assert ours == pytest.approx(ndcg_score(rel[None], scores[None], k=k), abs=1e-12)
            ours = ndcg_at_k(scores, rel, np.zeros(n), k=k)
            assert ours == pytest.approx(ndcg_score((2.0**rel - 1)[None], scores[None], k=k), abs=1e-12)


def test_ndcg_is_the_mean_over_queries_of_a_direct_computation() -> None:
    scores = [0.9, 0.1, 0.5, 0.8, 0.2, 0.3]
    rel = [0, 2, 1, 3, 0, 1]
    queries = ["a", "a", "a", "b", "b", "b"]

    def direct(s: list[float], r: list[int], k: int) -> float:
        order = sorted(range(len(s)), key=lambda i: -s[i])
        dcg = sum((2 ** r[i] - 1) / math.log2(p + 2) for p, i in enumerate(order[:k]))
        idcg = sum((2**x - 1) / math.log2(p + 2) for p, x in enumerate(sorted(r, reverse=True)[:k]))
        return dcg / idcg

    per = ndcg_per_query(scores, rel, queries, k=2)
    assert per["a"] == pytest.approx(direct(scores[:3], rel[:3], 2))
    assert per["b"] == pytest.approx(direct(scores[3:], rel[3:], 2))
    assert ndcg_at_k(scores, rel, queries, k=2) == pytest.approx((per["a"] + per["b"]) / 2)


def test_bad_input_is_named() -> None:
    with pytest.raises(FedriskError, match="query 7 has no relevant item"):
        ndcg_at_k([0.1, 0.2, 0.3], [1, 0, 0], [3, 7, 7])
    with pytest.raises(FedriskError, match=r"k = 0 is out of range"):
        ndcg_at_k([0.1], [1], [0], k=0)
    with pytest.raises(FedriskError, match="3 scores, 2 relevances and 3 query ids"):
        ndcg_at_k([0.1, 0.2, 0.3], [1, 0], [0, 0, 0])
    with pytest.raises(FedriskError, match="unknown gain 'log'"):
        ndcg_at_k([0.1], [1], [0], gain="log")
    with pytest.raises(FedriskError, match="relevance labels must be >= 0"):
        ndcg_at_k([0.1, 0.2], [1, -1], [0, 0])


def test_config_names_ndcg_at_k() -> None:
    """``run.metrics`` names: ``ndcg@k`` is the per-query NDCG@k, ``ndcg`` the whole lists; no query
    ids read as one query; bad k is one error naming the metric."""
    g = np.random.default_rng(5)
    scores, rel, queries = g.random(12), g.integers(0, 3, 12), np.repeat([4, 9, 2], 4)
    rel[[0, 4, 8]] = 2
    assert parse_metric("ndcg@3")(scores, rel, queries) == pytest.approx(ndcg_at_k(scores, rel, queries, k=3))
    assert parse_metric("ndcg")(scores, rel, queries) == pytest.approx(ndcg_at_k(scores, rel, queries, k=None))
    assert parse_metric("ndcg@2")(scores, rel) == pytest.approx(ndcg_score((2.0**rel - 1)[None], scores[None], k=2))
    for bad in ("ndcg@0", "ndcg@x", "ndcg@"):
        with pytest.raises(FedriskError, match=rf"metric '{bad}': k must be an integer >= 1"):
            parse_metric(bad)
