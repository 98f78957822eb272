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


STACK_BYTES = 64 * 2**20
"""Bytes of replies :func:`stacked_weighted_sum` stacks at a time (per leaf)."""


def stacked_weighted_sum(trees: Sequence[Tree], weights: Sequence[float] | None = None) -> Tree | None:
    """``sum_i weights[i] * trees[i]`` as one reduction per leaf, or None if the trees differ.

    Trees that are flat dicts of floating tensors with the same keys, shapes and dtypes (model
    parameters: the common case) are stacked along a new client dimension, at most
    :data:`STACK_BYTES` per leaf at a time, and reduced with one ``tensordot`` with the weights
    (``sum(0)`` without weights).  With a thousand small replies this is 15x cheaper than
    adding them one by one, and it is the reduction :class:`StackedReplies` uses, so the
    sequential and vectorised executors aggregate identical replies identically.

    Example:
        >>> import torch
        >>> stacked_weighted_sum([{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 4.0])}], [0.5, 2.0])
        {'w': tensor([6.5000, 9.0000])}
    """
    if not trees or type(trees[0]) is not dict or not trees[0]:
        return None
    first = trees[0]
    for tree in trees:
        if type(tree) is not dict or tree.keys() != first.keys():
            return None
        for name, x in tree.items():
            f = first[name]
            if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
                return None
            if x.shape != f.shape or x.dtype != f.dtype or x.device != f.device:
                return None
    out = {}
    for name, f in first.items():
        dtype = torch.result_type(f, 1.0)  # the dtype of ``python_float * x``
        per_chunk = max(1, STACK_BYTES // max(1, f.numel() * f.element_size()))
        total = None
        for start in range(0, len(trees), per_chunk):
            block = torch.stack([t[name] for t in trees[start : start + per_chunk]])
            if weights is None:
                part = block.sum(0)
            else:
                wt = torch.tensor(weights[start : start + per_chunk], dtype=dtype, device=f.device)
                part = torch.tensordot(wt, block.to(dtype), dims=1)
            total = part if total is None else total + part
        out[name] = total
    return out


class InMemoryReplies(Replies):
    """Replies held in one process, keyed by client id."""

    def __init__(self, replies: Mapping[int, Mapping[str, Any]]) -> None:
        self._replies = {int(k): dict(v) for k, v in sorted(replies.items())}
        self.clients = list(self._replies)

    def sum(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        if not self._replies:
            raise ValueError("no replies to aggregate")
        trees = self.gather(key)
        w = None if weights is None else [float(weights[k]) for k in self.clients]
        fast = stacked_weighted_sum(trees, w)
        if fast is not None:
            return fast
        out = None  # trees of different structures: one client at a time
        for tree, wk in zip(trees, w or [1.0] * len(trees)):
            term = tree if wk == 1.0 else tree_map(lambda x, wk=wk: wk * x, tree)
            out = term if out is None else tree_map(torch.add, out, term)
        return out

    def gather(self, key: str) -> list[Tree]:
        return [r[key] for r in self._replies.values()]

    def as_dict(self) -> dict[int, dict[str, Any]]:
        return {k: dict(v) for k, v in self._replies.items()}


class Aggregator:
    """Combines one field of the replies into one value; ``kind`` says how it reads them.

    ``gen`` is the server's generator of the round, for randomised rules (bucketing); the
    deterministic rules ignore it."""

    kind: ClassVar[Kind] = "sum"
    name: ClassVar[str] = "aggregator"

    def __call__(
        self, replies: Replies, key: str, weights: Mapping[int, float] | None = None, gen: torch.Generator | None = None
    ) -> Tree:
        raise NotImplementedError


class Mean(Aggregator):
    """The uniform mean ``(1/m) sum_k x_k`` (weights ignored)."""

    kind = "sum"
    name = "mean"

    def __call__(
        self, replies: Replies, key: str, weights: Mapping[int, float] | None = None, gen: torch.Generator | None = None
    ) -> Tree:
        return replies.mean(key)


class WeightedMean(Aggregator):
    """``sum_k w_k x_k / sum_k w_k`` with the caller's weights (FedAvg: sample counts)."""

    kind = "sum"
    name = "weighted_mean"

    def __call__(
        self, replies: Replies, key: str, weights: Mapping[int, float] | None = None, gen: torch.Generator | None = None
    ) -> Tree:
        return replies.mean(key, weights)


def weights_for(clients: Sequence[int], sizes: Sequence[int]) -> dict[int, float]:
    """Sample-count weights ``{k: sizes[k]}`` for the given clients."""
    return {k: float(sizes[k]) for k in clients}
