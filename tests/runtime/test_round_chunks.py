"""The vectorised executor moves each block's stacked replies into one round buffer as the block
finishes (``_RoundChunks``; issue 14, full-participation memory): the round's replies are never
held twice, and they are the same values in the same order as the concatenation that
``_assemble_replies`` made before, so every reduction gives the same bits."""

from __future__ import annotations

import copy

import pytest
import torch

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.runtime.stacked import StackedReplies, _assemble_replies, _Chunk, _RoundChunks


def _stacked(clients: list[int], g: torch.Generator, width: int = 3) -> dict:
    c = len(clients)
    return {"d": torch.randn(c, width, generator=g, dtype=torch.float64), "e": {"m": torch.randn(c, 2, 2, generator=g)}}


def _chunk(clients: list[int], g: torch.Generator, width: int = 3, stacked: bool = True) -> _Chunk:
    s = _stacked(clients, g, width)
    states, metrics = [{} for _ in clients], [{} for _ in clients]
    if stacked:
        return _Chunk(list(clients), None, s, states, metrics)
    rows = [{"d": s["d"][i], "e": {"m": s["e"]["m"][i]}} for i in range(len(clients))]
    return _Chunk(list(clients), rows, None, states, metrics)


CASES = {
    # round clients, then each chunk: (clients in the order the executor appends them, width, stacked)
    "blocks": ([0, 2, 3, 5, 8, 9], [([0, 2], 3, True), ([3, 5], 3, True), ([8, 9], 3, True)]),
    "failed clients": ([0, 2, 3, 5, 8, 9], [([0], 3, True), ([3, 5], 3, True), ([9], 3, True)]),
    "groups out of order": ([1, 2, 3, 4, 5], [([1, 4], 3, True), ([2, 3], 3, True), ([5], 3, True)]),
    "rows out of order": ([1, 2, 3], [([3, 1], 3, True), ([2], 3, True)]),
    "one chunk": ([1, 2, 3], [([1, 2, 3], 3, True)]),
    "a fallback chunk": ([1, 2, 3, 4], [([1, 2], 3, True), ([3, 4], 3, False)]),
    "fallback first": ([1, 2, 3, 4], [([1, 2], 3, False), ([3, 4], 3, True)]),
    "ragged blocks": ([1, 2, 3, 4], [([1, 2], 3, True), ([3, 4], 5, True)]),
    "empty chunk": ([1, 2, 3, 4], [([], 3, True), ([1, 2], 3, True), ([3, 4], 3, True)]),
}


def _leaves(tree):
    return torch.utils._pytree.tree_leaves(tree)


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_buffer_gives_the_replies_of_the_concatenation_bit_for_bit(case):
    round_clients, spec = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    chunks = [_chunk(c, g, w, s) if c else _Chunk([], None, {}, [], []) for c, w, s in spec]
    want = _assemble_replies(copy.deepcopy(chunks))
    collected = _RoundChunks(round_clients)
    for c in chunks:
        collected.append(c)
    got = collected.replies()
    assert type(got) is type(want) and got.clients == want.clients
    weights = {k: 1.0 / (k + 3) for k in want.clients}
    for key in ("d", "e"):
        if case != "ragged blocks":  # rows of different widths have no sum
            for a, b in zip(_leaves(got.sum(key, weights)), _leaves(want.sum(key, weights))):
                assert torch.equal(a, b)  # same code, same machine: the same bits
        for a, b in zip(_leaves(got.gather(key)), _leaves(want.gather(key))):
            assert torch.equal(a, b)
    if isinstance(want, StackedReplies):
        for a, b in zip(_leaves(got.stacked("d")), _leaves(want.stacked("d"))):
            assert torch.equal(a, b)
    if case == "ragged blocks":
        assert isinstance(got, InMemoryReplies)


def test_empty_replies_are_not_buffered():
    chunks = [_Chunk([1, 2], None, {}, [{}, {}], [{}, {}]), _Chunk([3], None, {}, [{}], [{}])]
    collected = _RoundChunks([1, 2, 3])
    for c in chunks:
        collected.append(c)
    assert collected.buffer is None and collected.replies().clients == [1, 2, 3]


def test_a_blocks_replies_are_released_when_it_is_buffered():
    g = torch.Generator().manual_seed(0)
    collected = _RoundChunks([0, 1, 2, 3])
    first = _chunk([0, 1], g)
    block = first.stacked["d"]
    collected.append(first)
    assert first.stacked is None and block.data_ptr() not in [x.data_ptr() for x in collected.buffer]
    collected.append(_chunk([2, 3], g))
    assert torch.equal(collected.replies().stacked("d")[:2], block)


def test_each_chunks_states_are_staged_as_it_arrives():
    """``run.client_states = "disk"``: a block's new states go to the stage callback when the
    block is appended (in the block's client order) and the chunk keeps only placeholders."""
    g = torch.Generator().manual_seed(0)
    staged: list[tuple[int, dict]] = []
    collected = _RoundChunks([1, 2, 3, 4], stage=lambda k, state: staged.append((k, state)))
    first = _chunk([3, 1], g)
    first.states = [{"c": torch.tensor([3.0])}, {"c": torch.tensor([1.0])}]
    collected.append(first)
    assert [(k, s["c"].item()) for k, s in staged] == [(3, 3.0), (1, 1.0)]
    assert first.states == [{}, {}]
    second = _chunk([2, 4], g)
    second.states = [{"c": torch.tensor([2.0])}, {"c": torch.tensor([4.0])}]
    collected.append(second)
    assert [k for k, _ in staged] == [3, 1, 2, 4] and second.states == [{}, {}]
    assert collected.replies().clients == [1, 2, 3, 4]


@pytest.mark.parametrize("case", sorted(set(CASES) - {"ragged blocks"}))
def test_replies_of_one_structure_are_stacked_in_client_order(case):
    """An independent reference: the rows of each client, in client order, stacked (fallback
    chunks whose replies share the blocks' structure included)."""
    round_clients, spec = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    chunks = [_chunk(c, g, w, s) if c else _Chunk([], None, {}, [], []) for c, w, s in spec]
    rows = {}
    for c in chunks:
        for i, k in enumerate(c.clients):
            rows[k] = c.stacked["d"][i].clone() if c.stacked is not None else c.replies[i]["d"].clone()
    for got in (_assemble_replies(copy.deepcopy(chunks)), _collect(round_clients, chunks)):
        assert isinstance(got, StackedReplies) and got.clients == sorted(rows)
        assert torch.equal(got.stacked("d"), torch.stack([rows[k] for k in sorted(rows)]))


def _collect(round_clients, chunks):
    collected = _RoundChunks(round_clients)
    for c in chunks:
        collected.append(c)
    return collected.replies()
