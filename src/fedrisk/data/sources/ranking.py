"""A small generated multi-query ranking data set (learning to rank), offline and seeded.

``synthetic_ranking`` mimics a LETOR-style table: each row is one (query, item) pair with a
feature vector ``x`` and a graded relevance ``y ∈ {0, 1, 2, 3}``; ``attrs["query"]`` says which
query a row belongs to and ``attrs["client"]`` which client holds the row.  ``split = "queries"``
deals whole queries to clients round-robin (a client's queries share a feature shift);
``split = "items"`` deals every query's items to the clients round-robin (federated search: each
client holds part of every query's candidates, and its items carry its shift — only cross-client
comparisons can learn to rank them against each other).

Generative model (seeded by ``seed``):

* a hidden relevance direction ``w* ~ N(0, I_dim) / sqrt(dim)``, the same for every query;
* query ``q``: a mean ``μ_q = N(0, I_dim) · query_spread``, so queries differ in where their items
  lie (only the within-query order matters to NDCG);
* its ``items_per_query`` items ``x = μ_q + z + shift · k · e`` with ``z ~ N(0, I_dim)``, ``k`` the
  client holding the item and ``e`` a fixed unit vector, and a latent utility ``s = w*·z +
  noise · N(0, 1)`` (the shift does not change the relevance);
* relevance by the within-query rank of ``s``: the best item 3, the second 2, the next
  ``max(1, round(0.1 · items))`` items 1, the rest 0 — so every query has a relevant item and the
  grades are rare, as in web search.

The test set holds ``test_queries_per_client`` fresh queries of each client.

Example:
    >>> tr, te, meta = synthetic_ranking_data(num_clients=2, queries_per_client=3, items_per_query=10, dim=4)
    >>> tr.x.shape, sorted(set(tr.y.tolist())), meta.task, tr.attrs["query"][:3].tolist()
    (torch.Size([60, 4]), [0, 1, 2, 3], 'ranking', [0, 0, 0])
    >>> [int((tr.y[tr.attrs["query"] == q] > 0).sum()) for q in range(3)]
    [3, 3, 3]
"""

from __future__ import annotations

import math

import torch

from fedrisk.data.federation import Federation, Samples
from fedrisk.data.loaders import DATASETS, DatasetMeta, LoadedDataset
from fedrisk.data.partition import by_attribute
from fedrisk.data.transforms import derive_seed
from fedrisk.errors import FedriskError, check_range

__all__ = ["RELEVANCE_GRADES", "SPLITS", "synthetic_ranking_data", "synthetic_ranking_federation"]

SPLITS = ("queries", "items")

RELEVANCE_GRADES = 4
"""Relevance labels are ``0 .. 3``."""


def _check_int(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FedriskError(f"synthetic_ranking: {name} must be an integer >= {low}; got {value!r}")
    check_range(f"synthetic_ranking: {name}", value, low)


@DATASETS.register(
    "synthetic_ranking",
    "generated learning-to-rank table: queries of graded items 0-3, per-client shift (attrs 'query', 'client')",
)
def synthetic_ranking_data(
    *,
    seed: int = 0,
    num_clients: int = 4,
    queries_per_client: int = 25,
    items_per_query: int = 20,
    test_queries_per_client: int = 10,
    dim: int = 16,
    shift: float = 0.5,
    query_spread: float = 1.0,
    noise: float = 0.3,
    split: str = "queries",
) -> LoadedDataset:
    """The pooled train / test tables (module docstring); ``y`` is the relevance (int64)."""
    for name, value, low in (
        ("num_clients", num_clients, 1),
        ("queries_per_client", queries_per_client, 1),
        ("items_per_query", items_per_query, 4),
        ("test_queries_per_client", test_queries_per_client, 0),
        ("dim", dim, 1),
    ):
        _check_int(name, value, low)
    for name, value in (("shift", shift), ("query_spread", query_spread), ("noise", noise)):
        check_range(f"synthetic_ranking: {name}", value, 0.0, None)
    if split not in SPLITS:
        raise FedriskError(f"synthetic_ranking: split = {split!r} is not allowed; allowed: {', '.join(SPLITS)}")
    g = torch.Generator().manual_seed(derive_seed(seed, "synthetic_ranking"))
    w_star = torch.randn(dim, generator=g) / math.sqrt(dim)
    direction = torch.randn(dim, generator=g)
    direction = direction / direction.norm()
    n_ones = max(1, round(0.1 * items_per_query))

    def draw(per_client: int, first_query: int) -> Samples:
        xs, ys, queries, clients = [], [], [], []
        for j in range(per_client * num_clients):
            if split == "queries":  # round-robin: query j belongs to client j mod N
                k = torch.full((items_per_query,), j % num_clients)
            else:  # every query's items dealt round-robin to the clients
                k = (torch.arange(items_per_query) + j) % num_clients
            mu = query_spread * torch.randn(dim, generator=g)
            z = torch.randn(items_per_query, dim, generator=g)
            s = z @ w_star + noise * torch.randn(items_per_query, generator=g)
            rank = torch.argsort(torch.argsort(s, descending=True))
            y = torch.where(rank == 0, 3, torch.where(rank == 1, 2, torch.where(rank < 2 + n_ones, 1, 0)))
            xs.append(mu + z + shift * k[:, None].to(z.dtype) * direction)
            ys.append(y)
            queries.append(torch.full((items_per_query,), first_query + j))
            clients.append(k)
        if not xs:
            return Samples(torch.zeros(0, dim), torch.zeros(0, dtype=torch.long), {
                "query": torch.zeros(0, dtype=torch.long), "client": torch.zeros(0, dtype=torch.long)})  # fmt: skip
        return Samples(torch.cat(xs), torch.cat(ys).long(), {"query": torch.cat(queries), "client": torch.cat(clients)})

    train = draw(queries_per_client, 0)
    test = draw(test_queries_per_client, queries_per_client * num_clients)
    meta = DatasetMeta(
        "synthetic_ranking",
        RELEVANCE_GRADES,
        [f"relevance {r}" for r in range(RELEVANCE_GRADES)],
        task="ranking",
        source="generated",
        attr_names={"client": [str(k) for k in range(num_clients)]},
        notes={
            "natural_attribute": "client",
            "items_per_query": items_per_query,
            "num_queries": (queries_per_client + test_queries_per_client) * num_clients,
            "split": split,
            "w_star": w_star.tolist(),
        },
    )
    return LoadedDataset(train, test, meta)


def synthetic_ranking_federation(num_clients: int = 4, *, seed: int = 0, **options: object) -> Federation:
    """:func:`synthetic_ranking_data` split back into its clients (``split``: whole queries or
    every query's items), each with its own test rows.

    Example:
        >>> fed = synthetic_ranking_federation(3, queries_per_client=2, items_per_query=5, dim=2)
        >>> fed.num_clients, [len(c) for c in fed.clients], fed.info["task"]
        (3, [10, 10, 10], 'ranking')
    """
    ds = synthetic_ranking_data(seed=seed, num_clients=num_clients, **options)  # type: ignore[arg-type]
    parts = by_attribute(ds.train.attrs["client"], num_clients)
    tests = by_attribute(ds.test.attrs["client"], num_clients) if len(ds.test) else None
    return Federation(
        "synthetic_ranking",
        [ds.train.subset(p) for p in parts],
        ds.meta.num_classes,
        client_tests=None if tests is None else [ds.test.subset(p) for p in tests],
        test=ds.test if len(ds.test) else None,
        class_names=ds.meta.class_names,
        info={"task": "ranking", **{k: ds.meta.notes[k] for k in ("items_per_query", "num_queries", "split")}},
    )
