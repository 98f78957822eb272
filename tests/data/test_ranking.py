"""The generated ranking set: registered, seeded, graded, split by client with whole queries."""

from __future__ import annotations

import pytest
import torch

from fedrisk.data.loaders import DATASETS
from fedrisk.data.sources.ranking import synthetic_ranking_data, synthetic_ranking_federation
from fedrisk.errors import FedriskError


def test_registered_seeded_and_graded() -> None:
    assert "synthetic_ranking" in DATASETS.names()
    a = synthetic_ranking_data(seed=3, num_clients=2, queries_per_client=4, items_per_query=10, dim=3)
    b = synthetic_ranking_data(seed=3, num_clients=2, queries_per_client=4, items_per_query=10, dim=3)
    c = synthetic_ranking_data(seed=4, num_clients=2, queries_per_client=4, items_per_query=10, dim=3)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert not torch.equal(a.train.x, c.train.x)
    q = a.train.attrs["query"]
    for query in torch.unique(q):
        grades = sorted(a.train.y[q == query].tolist(), reverse=True)
        assert grades[:3] == [3, 2, 1] and grades[3:] == [0] * 7  # one 3, one 2, round(0.1 * 10) = 1 one
    assert set(a.test.attrs["query"].tolist()).isdisjoint(q.tolist())  # fresh test queries
    # the relevance follows the hidden direction: within a query, grade-3 items score higher on w*
    w = torch.tensor(a.meta.notes["w_star"])
    top = a.train.x[a.train.y == 3] @ w
    rest = a.train.x[a.train.y == 0] @ w
    assert float(top.mean()) > float(rest.mean())


def test_federation_keeps_whole_queries_per_client() -> None:
    fed = synthetic_ranking_federation(3, queries_per_client=2, items_per_query=5, dim=2, test_queries_per_client=1)
    for k, client in enumerate(fed.clients):
        assert set(client.attrs["client"].tolist()) == {k}
        assert all(int((client.attrs["query"] == q).sum()) == 5 for q in torch.unique(client.attrs["query"]))
    assert len(fed.test) == 15


@pytest.mark.parametrize(("key", "value"), [("items_per_query", 3), ("num_clients", 0), ("noise", -1.0)])
def test_bad_options_are_named(key: str, value: object) -> None:
    with pytest.raises(FedriskError, match=f"synthetic_ranking: {key}"):
        synthetic_ranking_data(**{key: value})
