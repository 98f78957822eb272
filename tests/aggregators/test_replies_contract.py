"""Exact checks of the replies contract (``aggregators/base.py``) that kill the mutants that
survived ``tests/aggregators`` and ``tests/runtime/test_fast_paths.py`` (docs/reliability.md,
mutation testing): the weighted sums and means, the fast stacked reduction and when it applies,
its chunking, the slow path for trees that differ, and the registered mean aggregators."""

from __future__ import annotations

import pytest
import torch

import fedrisk.aggregators.base as base
from fedrisk.aggregators.base import InMemoryReplies, Mean, WeightedMean, stacked_weighted_sum, weights_for


def _replies() -> InMemoryReplies:
    return InMemoryReplies({k: {"p": {"w": torch.tensor([float(k), 2.0 * k + 1])}} for k in (3, 1, 2)})


def test_sum_and_mean_pinned() -> None:
    r = _replies()
    assert r.clients == [1, 2, 3]
    assert r.sum("p")["w"].tolist() == [6.0, 15.0]
    assert r.sum("p", {1: 1.0, 2: 0.5, 3: 2.0})["w"].tolist() == [8.0, 19.5]
    assert r.mean("p")["w"].tolist() == [2.0, 5.0]
    assert r.mean("p", {1: 1.0, 2: 0.5, 3: 2.0})["w"].tolist() == pytest.approx([8.0 / 3.5, 19.5 / 3.5], rel=1e-6)
    assert Mean()(r, "p", {1: 9.0, 2: 0.0, 3: 0.0})["w"].tolist() == [2.0, 5.0]  # weights ignored
    assert WeightedMean()(r, "p", {1: 0.0, 2: 0.0, 3: 1.0})["w"].tolist() == [3.0, 7.0]
    with pytest.raises(ValueError, match=r"^weights of the replying clients sum to zero$"):
        r.mean("p", {1: 0.0, 2: 0.0, 3: 0.0})
    with pytest.raises(ValueError, match=r"^no replies to aggregate$"):
        InMemoryReplies({}).sum("p")
    assert weights_for([0, 2], [5, 6, 7]) == {0: 5.0, 2: 7.0}
    assert r.stacked("p")["w"].tolist() == [[1.0, 3.0], [2.0, 5.0], [3.0, 7.0]]
    assert r.nbytes() == {1: 8, 2: 8, 3: 8}


def test_fast_reduction_applies_only_to_alike_float_dicts() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(1.0)}
    b = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor(2.0)}
    out = stacked_weighted_sum([a, b], [0.5, 2.0])
    assert out is not None and out["w"].tolist() == [6.5, 9.0] and out["b"].item() == 4.5
    assert stacked_weighted_sum([a, b])["w"].tolist() == [4.0, 6.0]
    for other in (
        {"w": torch.tensor([3.0, 4.0])},  # other keys
        {"w": torch.tensor([3, 4]), "b": torch.tensor(2.0)},  # an integer leaf
        {"w": torch.tensor([3.0, 4.0, 5.0]), "b": torch.tensor(2.0)},  # another shape
        {"w": torch.tensor([3.0, 4.0], dtype=torch.float64), "b": torch.tensor(2.0)},  # another dtype
        [torch.tensor([3.0, 4.0])],  # not a dict
    ):
        assert stacked_weighted_sum([a, other]) is None
    assert stacked_weighted_sum([]) is None and stacked_weighted_sum([{}]) is None
    assert stacked_weighted_sum([[torch.ones(1)]]) is None


def test_fast_reduction_in_chunks_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    trees = [{"w": torch.tensor([float(i), 1.0])} for i in range(7)]
    weights = [0.5 * (i + 1) for i in range(7)]
    whole = stacked_weighted_sum(trees, weights)
    monkeypatch.setattr(base, "STACK_BYTES", 8 * 3)  # three trees (8 bytes each) per chunk
    chunked = stacked_weighted_sum(trees, weights)
    assert chunked["w"].tolist() == whole["w"].tolist() == [sum(w * i for i, w in enumerate(weights)), sum(weights)]
    assert stacked_weighted_sum(trees)["w"].tolist() == [21.0, 7.0]


def test_trees_that_differ_are_summed_one_by_one() -> None:
    t = torch.tensor
    r = InMemoryReplies({0: {"x": (t([1.0]), t(2))}, 1: {"x": (t([3.0]), t(4))}})
    plain = r.sum("x")
    assert plain[0].tolist() == [4.0] and plain[1].item() == 6 and not plain[1].is_floating_point()
    weighted = r.sum("x", {0: 1.0, 1: 0.5})
    assert weighted[0].tolist() == [2.5] and weighted[1].item() == 4.0
    assert r.mean("x", {0: 1.0, 1: 1.0})[0].tolist() == [2.0]


def test_float64_replies_reduce_in_float64() -> None:
    f64 = torch.float64
    trees = [{"w": torch.tensor([1.0, 1e-17], dtype=f64)}, {"w": torch.tensor([2.0, 0.0], dtype=f64)}]
    out = stacked_weighted_sum(trees, [1.0, 0.1])
    assert out["w"].dtype == torch.float64 and out["w"].tolist() == [1.0 + 0.1 * 2.0, 1e-17]
    assert stacked_weighted_sum([{"n": torch.tensor([1])}, {"n": torch.tensor([2])}]) is None  # integer leaves
