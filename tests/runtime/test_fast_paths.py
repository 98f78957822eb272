"""The sequential executor's fast paths equal the generic ones bit for bit."""

from __future__ import annotations

import torch

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.runtime.executor import _provably_finite, _SequentialReplies


def _replies() -> dict[int, dict]:
    g = torch.Generator().manual_seed(0)
    return {k: {"params": {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}} for k in (0, 2, 7)}


def test_sequential_replies_sum_equals_generic_sum_bitwise() -> None:
    replies = _replies()
    fast, generic = _SequentialReplies(replies), InMemoryReplies(replies)
    for weights in (None, {0: 0.2, 2: 0.5, 7: 0.3}):
        a, b = fast.sum("params", weights), generic.sum("params", weights)
        assert all(torch.equal(a[k], b[k]) for k in ("w", "b"))
        a, b = fast.mean("params", weights), generic.mean("params", weights)
        assert all(torch.equal(a[k], b[k]) for k in ("w", "b"))
    assert fast.nbytes() == generic.nbytes() == {0: 72, 2: 72, 7: 72}


def test_provably_finite_detects_nan_and_inf() -> None:
    trees = [r["params"] for r in _replies().values()]
    assert _provably_finite(trees)
    for bad in (float("nan"), float("inf")):
        broken = [dict(t) for t in trees]
        broken[1]["b"] = broken[1]["b"].clone()
        broken[1]["b"][0] = bad
        assert not _provably_finite(broken)
    big = torch.zeros(2**21)
    big[-1] = float("nan")
    assert not _provably_finite([{"x": big}])
