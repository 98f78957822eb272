"""The vectorised executor writes the blocks' replies into one preallocated stack."""

from __future__ import annotations

import torch

from fedrisk.runtime.vectorized import StackedReplies, _assemble_replies, _Chunk, _ReplyStack


def _chunk(clients: list[int], width: int = 3) -> _Chunk:
    rows = torch.tensor([[float(k)] * width for k in clients]).reshape(len(clients), width)
    return _Chunk(
        list(clients), None, {"params": {"w": rows, "b": rows[:, 0] * 2}}, [{}] * len(clients), [{}] * len(clients)
    )


def _place_all(total: int, chunks: list[_Chunk]) -> _ReplyStack:
    stack = _ReplyStack(total)
    for c in chunks:
        stack.place(c)
    return stack


def test_blocks_fill_one_buffer_in_client_order() -> None:
    chunks = [_chunk([0, 1]), _chunk([]), _chunk([2, 4]), _chunk([5])]
    expected = _assemble_replies([_chunk([0, 1]), _chunk([2, 4]), _chunk([5])])
    stack = _place_all(6, chunks)  # 6 clients planned, client 3 dropped (failed)
    got = stack.replies(chunks)
    assert isinstance(got, StackedReplies) and got.clients == [0, 1, 2, 4, 5]
    w = got.stacked("params")["w"]
    assert w.shape == (5, 3) and any(
        w.data_ptr() == buf.data_ptr() for buf in stack.buffers
    )  # the buffer itself, no copy
    assert torch.equal(w, expected.stacked("params")["w"]) and torch.equal(got.sum("params")["b"], torch.tensor(24.0))
    # every chunk now holds views of the buffer (its own stacked tensor is freed)
    assert chunks[2].stacked["params"]["w"].data_ptr() == w[2:].data_ptr()


def test_cases_left_to_the_concatenation() -> None:
    one = [_chunk([0, 1, 2])]
    assert _place_all(3, one).replies(one) is None  # one block: its stack is used as it is
    unsorted = [_chunk([2, 3]), _chunk([0, 1])]
    assert _place_all(4, unsorted).replies(unsorted) is None
    assert _assemble_replies(unsorted).clients == [0, 1, 2, 3]
    mixed = [_chunk([0]), _chunk([1], width=2)]
    assert _place_all(2, mixed).replies(mixed) is None
    fallback = [_chunk([0]), _Chunk([1], [{"params": {"w": torch.ones(3), "b": torch.ones(())}}], None, [{}], [{}])]
    assert _place_all(2, fallback).replies(fallback) is None
    assert _assemble_replies(fallback).clients == [0, 1]
