"""What travels between the ranks of the distributed executor (:mod:`fedrisk.runtime.distributed`):
trees packed into one byte buffer (a picklable skeleton of structure, dtypes and shapes, plus the
tensors' raw bytes: bit-exact), one-element metrics as numbers, the digest that checks that every
rank computed the same plan, and :class:`DistributedReplies`, the view of every rank's replies
that ``aggregate`` reads on every rank.

Example:
    >>> import torch
    >>> chunks = []
    >>> skeleton = _skeleton({"w": torch.tensor([1.5, -2.0]), "n": 3}, chunks)
    >>> tree, end = _unpack(skeleton, torch.cat(chunks), 0, torch.device("cpu"))
    >>> tree["w"].tolist(), tree["n"], end
    ([1.5, -2.0], 3, 8)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import RoundPlan
from fedrisk.tree import Tree, tensor_leaves, tree_map

if TYPE_CHECKING:
    from fedrisk.runtime.distributed import DistributedExecutor

# -- packing trees into one byte buffer ------------------------------------------------------
_TENSOR = ...
"""Marks a tensor's place in a skeleton: a pytree leaf that pickles by reference (no custom
class travels between processes)."""

LeafMeta = tuple[torch.dtype, tuple[int, ...], int]
Skeleton = tuple[Tree, list[LeafMeta]]
"""A tree with its tensors replaced by ``_TENSOR``, and each tensor's (dtype, shape, bytes)."""


def _skeleton(tree: Tree, chunks: list[Tensor] | None = None) -> Skeleton:
    """The skeleton of ``tree``; the tensors' raw bytes are appended to ``chunks`` (if given)."""
    metas: list[LeafMeta] = []

    def leaf(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        if chunks is not None:
            chunks.append(x.detach().contiguous().reshape(-1).view(torch.uint8))
        metas.append((x.dtype, tuple(x.shape), x.numel() * x.element_size()))
        return _TENSOR

    return tree_map(leaf, tree), metas


def _fill(skeleton: Skeleton, make: Callable[[torch.dtype, tuple[int, ...], int], Tensor]) -> Tree:
    """The tree of ``skeleton`` with ``make(dtype, shape, nbytes)`` at every tensor's place."""
    structure, metas = skeleton
    if not metas:  # nothing to fill (e.g. FedAvg's empty client states)
        return structure
    todo = iter(metas)
    return tree_map(lambda x: make(*next(todo)) if x is _TENSOR else x, structure)


def _unpack(skeleton: Skeleton, buffer: Tensor, offset: int, device: torch.device) -> tuple[Tree, int]:
    """Rebuild the tree of ``skeleton`` from ``buffer[offset:]``; returns it and the new offset."""
    pos = offset

    def make(dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> Tensor:
        nonlocal pos
        raw = buffer[pos : pos + nbytes].to(device, copy=True)  # own storage at offset 0
        pos += nbytes
        return raw.view(dtype).reshape(shape)

    return _fill(skeleton, make), pos


def _digest(plan: RoundPlan) -> str:
    """A hash of the plan (clients, kind, every payload byte) to check that ranks agree."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((plan.kind, plan.clients)).encode())
    trees = [plan.broadcast] + ([plan.per_client[k] for k in plan.clients] if plan.per_client else [])
    for tree in trees:
        for x in tensor_leaves(dict(tree)):
            h.update(x.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _metric_out(x: Any) -> Any:
    """A metric to send: a one-element tensor as (Python number, dtype, shape) — pickling tensors
    one by one costs far more — anything else as is (tensors moved to the CPU)."""
    if isinstance(x, Tensor):
        if x.numel() == 1:
            return (x.item(), x.dtype, tuple(x.shape))
        return x.detach().to("cpu")
    return x


def _metric_in(x: Any) -> Any:
    """Inverse of :func:`_metric_out` (exact: the number is the tensor's value)."""
    if isinstance(x, tuple) and len(x) == 3 and isinstance(x[1], torch.dtype):
        return torch.tensor(x[0], dtype=x[1]).reshape(x[2])
    return x


# -- the replies view ----------------------------------------------------------------------
class DistributedReplies(Replies):
    """The replies of every rank's clients, seen identically on every rank.

    Every method is a collective (except :meth:`nbytes` and ``clients``): all ranks must call
    the same methods in the same order — which they do, since ``aggregate`` and attacks run
    the same code on the same replicated state everywhere.

    ``sum(key, weights)`` is the local weighted sum followed by ``all_reduce``; its result may
    differ from the sequential executor's in the last bits (the additions are grouped by rank),
    but it is identical on every rank.  ``gather`` / ``as_dict`` are bit-exact.
    """

    def __init__(
        self,
        executor: DistributedExecutor,
        local: Replies | None,
        *,
        owners: Mapping[int, int],
        spec: Mapping[str, Any],
        nbytes: Mapping[int, int],
        device: torch.device,
    ) -> None:
        self._executor = executor
        self._local = local
        self._owners = dict(owners)
        self._spec = dict(spec)
        self._nbytes = dict(nbytes)
        self._device = device
        self._all: dict[int, dict[str, Any]] | None = None
        self.clients = sorted(self._owners)

    def _key_spec(self, key: str) -> Any:
        if key not in self._spec:
            raise KeyError(f"the replies have no field {key!r}; fields: {sorted(self._spec)}")
        return self._spec[key]

    def sum(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        skeleton = self._key_spec(key)

        # The reduction dtype of each leaf is decided from the shared skeleton so that every
        # rank agrees: the reply's dtype, except that a weighted sum of an integer leaf is
        # floating (as ``w * x`` makes it; the sequential executor keeps integers when every
        # weight is exactly 1.0 - the one case where the dtypes of the two executors differ).
        def reduction_dtype(dtype: torch.dtype) -> torch.dtype:
            if weights is None or dtype.is_floating_point or dtype.is_complex:
                return dtype
            return torch.promote_types(dtype, torch.get_default_dtype())

        dtypes = [reduction_dtype(dtype) for dtype, _, _ in skeleton[1]]
        if self._local is not None:
            tree = self._local.sum(key, weights)
            leaves = [x.to(d) for x, d in zip(tensor_leaves(tree), dtypes)]
        else:  # this rank has no replying client this round: it contributes zeros
            todo = iter(dtypes)
            tree = _fill(skeleton, lambda _, shape, __: torch.zeros(shape, dtype=next(todo), device=self._device))
            leaves = tensor_leaves(tree)
        reduced = iter(self._executor._all_reduce_leaves(leaves))
        return tree_map(lambda x: next(reduced) if isinstance(x, Tensor) else x, tree)

    def as_dict(self) -> dict[int, dict[str, Any]]:
        if self._all is None:
            local = self._local.as_dict() if self._local is not None else {}
            gathered, _ = self._executor._exchange(local, None, self._device)
            self._all = {k: {**gathered[k], **local.get(k, {})} for k in self.clients}
        return {k: dict(v) for k, v in self._all.items()}

    def gather(self, key: str) -> list[Tree]:
        self._key_spec(key)
        if self._all is not None:
            return [self._all[k][key] for k in self.clients]
        local = self._local.as_dict() if self._local is not None else {}
        gathered, _ = self._executor._exchange({k: r[key] for k, r in local.items()}, None, self._device)
        return [local[k][key] if k in local else gathered[k] for k in self.clients]

    def nbytes(self) -> dict[int, int]:
        """Bytes of each client's reply (exchanged with the round's bookkeeping: no collective)."""
        return dict(self._nbytes)
