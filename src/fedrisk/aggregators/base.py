"""How the server sees the clients' replies, and the averaging aggregators.

:class:`Replies` is the view ``Algorithm.aggregate`` gets.  It offers two kinds of access:

* ``sum`` kind — :meth:`Replies.sum` / :meth:`Replies.mean`: streamable reductions; the
  distributed executor implements them with one ``all_reduce``.
* ``gather`` kind — :meth:`Replies.gather` / :meth:`Replies.stacked`: every reply, in client
  order; robust aggregators (median, Krum, ...) and pooled buffers (FeDXL) need these.

Aggregators are small objects declaring their ``kind``; algorithms take one as a
hyper-parameter so that e.g. FedAvg can be made robust by swapping ``Mean()`` for ``Median()``.

Example:
    >>> import torch
    >>> r = InMemoryReplies({0: {"p": torch.tensor([1.0])}, 1: {"p": torch.tensor([3.0])}})
    >>> Mean()(r, "p").tolist(), WeightedMean()(r, "p", {0: 3.0, 1: 1.0}).tolist()
    ([2.0], [1.5])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import torch

from fedrisk.tree import Tree, tree_map, tree_nbytes, tree_stack

Kind = Literal["sum", "gather"]


class Replies(ABC):
    """The replies of one round's participating clients (``clients``, sorted)."""

    clients: list[int]

    @abstractmethod
    def sum(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        """``sum_k w_k reply_k[key]`` (``w_k = 1`` when ``weights`` is None)."""

    def mean(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        """Weighted mean ``sum_k w_k reply_k[key] / sum_k w_k`` (uniform when None)."""
        if weights is None:
            return tree_map(lambda x: x / len(self.clients), self.sum(key))
        total = sum(float(weights[k]) for k in self.clients)
        if total <= 0:
            raise ValueError("weights of the replying clients sum to zero")
        return tree_map(lambda x: x / total, self.sum(key, weights))

    @abstractmethod
    def gather(self, key: str) -> list[Tree]:
        """``[reply_k[key] for k in clients]``."""

    def stacked(self, key: str) -> Tree:
        """The gathered replies stacked along a new leading (client) dimension."""
        return tree_stack(self.gather(key))

    def nbytes(self) -> dict[int, int]:
        """Bytes of each client's reply (for the communication ledger)."""
        return {k: tree_nbytes(v) for k, v in self.as_dict().items()}

    @abstractmethod
    def as_dict(self) -> dict[int, dict[str, Any]]:
        """Every reply, by client id (gathers in the distributed executor)."""


class InMemoryReplies(Replies):
    """Replies held in one process, keyed by client id."""

    def __init__(self, replies: Mapping[int, Mapping[str, Any]]) -> None:
        self._replies = {int(k): dict(v) for k, v in sorted(replies.items())}
        self.clients = list(self._replies)

    def sum(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        out = None
        for k, reply in self._replies.items():
            w = 1.0 if weights is None else float(weights[k])
            term = reply[key] if w == 1.0 else tree_map(lambda x, w=w: w * x, reply[key])
            out = term if out is None else tree_map(torch.add, out, term)
        if out is None:
            raise ValueError("no replies to aggregate")
        return out

    def gather(self, key: str) -> list[Tree]:
        return [r[key] for r in self._replies.values()]

    def as_dict(self) -> dict[int, dict[str, Any]]:
        return {k: dict(v) for k, v in self._replies.items()}


class Aggregator:
    """Combines one field of the replies into one value; ``kind`` says how it reads them."""

    kind: ClassVar[Kind] = "sum"
    name: ClassVar[str] = "aggregator"

    def __call__(self, replies: Replies, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        raise NotImplementedError


class Mean(Aggregator):
    """The uniform mean ``(1/m) sum_k x_k`` (weights ignored)."""

    kind = "sum"
    name = "mean"

    def __call__(self, replies: Replies, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        return replies.mean(key)


class WeightedMean(Aggregator):
    """``sum_k w_k x_k / sum_k w_k`` with the caller's weights (FedAvg: sample counts)."""

    kind = "sum"
    name = "weighted_mean"

    def __call__(self, replies: Replies, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        return replies.mean(key, weights)


def weights_for(clients: Sequence[int], sizes: Sequence[int]) -> dict[int, float]:
    """Sample-count weights ``{k: sizes[k]}`` for the given clients."""
    return {k: float(sizes[k]) for k in clients}
