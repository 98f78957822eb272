"""Checks that kill the mutants of ``aggregators/preaggregation.py`` that survived
``tests/aggregators/test_robust.py`` (docs/reliability.md, mutation testing): booleans are not
counts, ``f = 0`` is allowed, a row is always its own neighbour, errors name the step."""

from __future__ import annotations

import pytest
import torch

from fedrisk.aggregators.preaggregation import bucketing, nearest_neighbor_mixing
from fedrisk.errors import FedriskError


def test_booleans_are_not_counts() -> None:
    x = torch.arange(4.0).reshape(4, 1)
    with pytest.raises(FedriskError, match=r"bucketing: bucket size s = True is not allowed"):
        bucketing(x, True, torch.Generator().manual_seed(0))
    with pytest.raises(FedriskError, match=r"nearest_neighbor_mixing: f = True is not allowed"):
        nearest_neighbor_mixing(x, True)


def test_nnm_with_no_byzantine_client_averages_everything() -> None:
    x = torch.tensor([[0.0], [1.0], [5.0]])
    assert nearest_neighbor_mixing(x, 0).flatten().tolist() == pytest.approx([2.0, 2.0, 2.0])


def test_nnm_keeps_each_row_among_its_neighbours() -> None:
    # rows closer than 1 to each other: a row must still count itself (distance 0), not two others
    x = torch.tensor([[0.0], [0.1], [0.3]])
    assert nearest_neighbor_mixing(x, 1).flatten().tolist() == pytest.approx([0.05, 0.05, 0.2])


@pytest.mark.parametrize("step", [bucketing, nearest_neighbor_mixing])
def test_bad_rows_name_the_step(step) -> None:
    args = (2, torch.Generator()) if step is bucketing else (0,)
    with pytest.raises(FedriskError, match=rf"^{step.__name__}\b"):
        step(torch.ones(3), *args)
