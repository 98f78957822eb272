"""The u-table update keeps a duplicate draw's last value on every device (a CUDA ``scatter``
picks another winner among duplicate indices than the CPU's loop)."""

from __future__ import annotations

import torch

from fedrisk.algorithms.pairwise import last_occurrence, scatter_last


def test_last_occurrence_points_every_duplicate_at_its_last_position() -> None:
    rows = torch.tensor([3, 1, 3, 0, 1, 3])
    assert last_occurrence(rows).tolist() == [5, 4, 5, 3, 4, 5]
    assert last_occurrence(torch.tensor([4, 2])).tolist() == [0, 1]  # no duplicates: itself


def test_scatter_last_writes_one_value_per_row_whatever_the_order() -> None:
    table = torch.zeros(4, 2)
    rows = torch.tensor([1, 3, 1, 1])
    values = torch.arange(8.0).reshape(4, 2)
    expected = table.clone()
    for j in range(4):  # the update in draw order: the last draw of a row wins
        expected[rows[j]] = values[j]
    assert torch.equal(scatter_last(table, rows, values), expected)
    # every duplicate carries the same value, so a scatter in the reverse order agrees
    kept = values[last_occurrence(rows)]
    reverse = table.scatter(0, rows.flip(0)[:, None].expand(4, 2), kept.flip(0))
    assert torch.equal(reverse, expected)
