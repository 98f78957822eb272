"""What the vectorised executor (:mod:`fedrisk.runtime.vectorized`) holds stacked: the clients'
data concatenated once (``_ClientStore``), the replies kept stacked (:class:`StackedReplies`)
and a round's results gathered block by block (``_Chunk``, ``_RoundChunks``), with the NaN/inf
check of a block's replies (``_check_chunk``).

Example:
    >>> import torch
    >>> r = StackedReplies([3, 5], {"p": torch.tensor([[1.0], [3.0]])})
    >>> r.mean("p").tolist(), [t.tolist() for t in r.gather("p")]
    ([2.0], [[1.0], [3.0]])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import LocalData, RoundContext
from fedrisk.errors import FedriskError
from fedrisk.runtime.executor import _provably_finite, check_reply
from fedrisk.tree import Tree, tree_all_finite, tree_map, tree_stack

__all__ = ["StackedReplies"]


# --------------------------------------------------------------------------------------------
# replies kept stacked
# --------------------------------------------------------------------------------------------


class StackedReplies(Replies):
    """Replies held as stacked tensors ``[M, ...]`` (row ``i`` is client ``clients[i]``).

    ``sum`` / ``mean`` are one (weighted) reduction over the client dimension per leaf;
    ``stacked`` returns the stacked tree without copying; ``gather`` / ``as_dict`` index it.

    Example:
        >>> import torch
        >>> r = StackedReplies([3, 5], {"p": torch.tensor([[1.0], [3.0]])})
        >>> r.sum("p").tolist(), r.mean("p", {3: 3.0, 5: 1.0}).tolist(), r.gather("p")[1].tolist()
        ([4.0], [1.5], [3.0])
        >>> r.nbytes()
        {3: 4, 5: 4}
    """

    def __init__(self, clients: Sequence[int], stacked: Mapping[str, Tree]) -> None:
        self.clients = [int(k) for k in clients]
        if self.clients != sorted(set(self.clients)):
            raise ValueError("StackedReplies: clients must be sorted and distinct")
        self._stacked = dict(stacked)
        m = len(self.clients)
        for key, tree in self._stacked.items():
            for leaf in pytree.tree_leaves(tree):
                if not isinstance(leaf, Tensor) or leaf.dim() == 0 or leaf.shape[0] != m:
                    raise ValueError(f"StackedReplies: every leaf of {key!r} must be a tensor [{m}, ...]")

    def sum(self, key: str, weights: Mapping[int, float] | None = None) -> Tree:
        if not self.clients:
            raise ValueError("no replies to aggregate")
        tree = self._stacked[key]
        if weights is None:
            return tree_map(lambda x: x.sum(0), tree)
        w = [float(weights[k]) for k in self.clients]

        def weighted(x: Tensor) -> Tensor:
            # the dtype of ``python_float * x`` (what the sequential InMemoryReplies computes)
            dtype = torch.result_type(x, 1.0)
            wt = torch.tensor(w, dtype=dtype, device=x.device)
            return torch.tensordot(wt, x.to(dtype), dims=1)

        return tree_map(weighted, tree)

    def gather(self, key: str) -> list[Tree]:
        return _unstack(self._stacked[key], len(self.clients))

    def stacked(self, key: str) -> Tree:
        return self._stacked[key]

    def nbytes(self) -> dict[int, int]:
        m = len(self.clients)
        per = sum(x.numel() // m * x.element_size() for x in pytree.tree_leaves(self._stacked)) if m else 0
        return {k: per for k in self.clients}

    def as_dict(self) -> dict[int, dict[str, Any]]:
        per_key = {key: _unstack(tree, len(self.clients)) for key, tree in self._stacked.items()}
        return {k: {key: rows[i] for key, rows in per_key.items()} for i, k in enumerate(self.clients)}


def _unstack(tree: Tree, n: int, copy: bool = False) -> list[Tree]:
    """Split a tree of ``[n, ...]`` tensors into ``n`` trees (one ``unbind`` per leaf).

    ``copy=True`` clones every row, so that a kept row does not hold the stacked tensor alive.
    """
    if type(tree) is dict and all(isinstance(v, Tensor) for v in tree.values()):  # fast path
        if not tree:
            return [{} for _ in range(n)]
        keys = list(tree)
        cols = [[r.clone() for r in v.unbind(0)] if copy else v.unbind(0) for v in tree.values()]
        return [dict(zip(keys, row)) for row in zip(*cols)]
    leaves, spec = pytree.tree_flatten(tree)
    rows: list[Sequence[Any]] = []
    for x in leaves:
        if not isinstance(x, Tensor):  # a constant (the same for every client)
            rows.append([x] * n)
        else:
            rows.append([r.clone() for r in x.unbind(0)] if copy else x.unbind(0))
    return [pytree.tree_unflatten([r[i] for r in rows], spec) for i in range(n)]


# --------------------------------------------------------------------------------------------
# the clients' data, concatenated once
# --------------------------------------------------------------------------------------------


@dataclass
class _ClientStore:
    """Every client's rows concatenated (``x``, ``y``, ``attrs``), with one zero row at the end
    that padding points to; ``offsets[k]`` / ``sizes[k]`` locate client ``k``."""

    x: Tensor
    y: Tensor
    attrs: dict[str, Tensor]
    offsets: list[int]
    sizes: list[int]
    offsets_t: Tensor
    sizes_t: Tensor
    row_bytes: int

    @classmethod
    def build(cls, data: Sequence[LocalData]) -> _ClientStore:
        if not data:
            raise FedriskError("executor 'vectorized' needs at least one client")
        first = data[0]
        keys = sorted(first.attrs)
        for k, d in enumerate(data):
            if sorted(d.attrs) != keys:
                raise FedriskError(
                    f"executor 'vectorized' stacks the clients' data: client {k} has attributes "
                    f"{sorted(d.attrs)} but client 0 has {keys}; give every client the same attributes "
                    "or use executor='sequential'"
                )
            for name, a, b in [("x", d.x, first.x), ("y", d.y, first.y)] + [
                (f"attrs[{n!r}]", d.attrs[n], first.attrs[n]) for n in keys
            ]:
                if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype or a.device != b.device:
                    raise FedriskError(
                        f"executor 'vectorized' stacks the clients' data: client {k}'s {name} has rows of "
                        f"shape {tuple(a.shape[1:])} ({a.dtype}, {a.device}) but client 0's has "
                        f"{tuple(b.shape[1:])} ({b.dtype}, {b.device}); make them equal or use "
                        "executor='sequential'"
                    )
        sizes = [int(d.size) for d in data]
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += n

        def concat(parts: list[Tensor]) -> Tensor:
            pad = torch.zeros((1, *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
            return torch.cat([p[:n] for p, n in zip(parts, sizes)] + [pad])

        x = concat([d.x for d in data])
        y = concat([d.y for d in data])
        attrs = {n: concat([d.attrs[n] for d in data]) for n in keys}
        row_bytes = sum(t[0].numel() * t.element_size() for t in [x, y, *attrs.values()])
        device = x.device
        return cls(
            x,
            y,
            attrs,
            offsets,
            sizes,
            torch.tensor(offsets, dtype=torch.long, device=device),
            torch.tensor(sizes, dtype=torch.long, device=device),
            row_bytes,
        )

    @property
    def pad_row(self) -> int:
        return self.x.shape[0] - 1

    def block(self, clients: Sequence[int]) -> list[Tensor]:
        """The flat leaves ``[x, y, size, *attrs]`` of ``clients``' data, stacked ``[C, n_max, ...]``.

        Equal-sized clients stored next to each other (an IID split taken in order) are a
        view of the store; otherwise the rows are gathered by index, padding pointing to the
        zero row.
        """
        c = len(clients)
        sizes = [self.sizes[k] for k in clients]
        n = max(sizes)
        start = self.offsets[clients[0]]
        if all(s == n for s in sizes) and all(self.offsets[k] == start + i * n for i, k in enumerate(clients)):

            def take(t: Tensor) -> Tensor:
                return t[start : start + c * n].reshape(c, n, *t.shape[1:])

            size = torch.full((c,), n, dtype=torch.long, device=self.sizes_t.device)
        else:
            ids = torch.tensor(list(clients), dtype=torch.long, device=self.offsets_t.device)
            ar = torch.arange(n, device=ids.device)
            size = self.sizes_t[ids]
            idx = torch.where(ar < size[:, None], self.offsets_t[ids][:, None] + ar, self.pad_row)

            def take(t: Tensor) -> Tensor:
                return t[idx]

        return [take(self.x), take(self.y), size, *(take(a) for a in self.attrs.values())]

    def local_data(self, leaves: Sequence[Tensor]) -> LocalData:
        """Rebuild one client's :class:`LocalData` from the (per-client) leaves of :meth:`block`."""
        x, y, size, *attrs = leaves
        return LocalData(x, y, size, dict(zip(self.attrs, attrs)))


# --------------------------------------------------------------------------------------------
# a round's results, block by block
# --------------------------------------------------------------------------------------------


@dataclass
class _Chunk:
    """The results of some clients of one round (a vmapped group or a sequential fallback)."""

    clients: list[int]
    replies: list[dict[str, Any]] | None  # per client, when not stacked
    stacked: dict[str, Any] | None  # replies stacked [C, ...], when stacked
    states: list[Tree]
    metrics: list[dict[str, Tensor]]
    failures: dict[int, str] = field(default_factory=dict)  # dropped by the sequential fallback


def _check_chunk(chunk: _Chunk, ctx: RoundContext, on_failure: str, failed: dict[int, str]) -> _Chunk:
    """Apply the NaN/inf policy to a chunk's replies; return the chunk without failed clients."""
    failed.update(chunk.failures)
    if chunk.stacked is None:  # replies one by one (sequential fallback)
        assert chunk.replies is not None
        keep = []
        for i, (k, reply) in enumerate(zip(chunk.clients, chunk.replies)):
            reason = check_reply(k, ctx.round, (reply, chunk.states[i]), on_failure)
            if reason:
                failed[k] = reason
            else:
                keep.append(i)
        return _select(chunk, keep)
    c = len(chunk.clients)
    ok: Tensor | None = None
    for leaf in pytree.tree_leaves(chunk.stacked):
        if leaf.is_floating_point() and leaf.numel():
            rows = leaf.reshape(c, -1)
            # a row's sum is finite only if every entry is (a finite row can overflow to inf in
            # the sum: such rows are checked entry by entry); one reduction instead of a mask
            fin = torch.isfinite(rows.sum(1))
            if not bool(fin.all()):
                fin = torch.isfinite(rows).all(1)
            ok = fin if ok is None else ok & fin
    if not _provably_finite(chunk.states):  # a finite reply with a NaN/inf new state fails too
        fin = torch.tensor([tree_all_finite(s) for s in chunk.states])
        ok = fin if ok is None else ok & fin.to(ok.device)
    if ok is None or bool(ok.all()):
        return chunk
    bad = set((~ok).nonzero().flatten().tolist())
    replies = _unstack(chunk.stacked, c)
    for i in sorted(bad):
        k = chunk.clients[i]
        failed[k] = check_reply(k, ctx.round, (replies[i], chunk.states[i]), on_failure) or "non-finite reply"
    return _select(chunk, [i for i in range(c) if i not in bad])


def _select(chunk: _Chunk, keep: list[int]) -> _Chunk:
    """The chunk restricted to positions ``keep``."""
    if len(keep) == len(chunk.clients):
        return chunk
    stacked = None
    if chunk.stacked is not None:
        index = torch.tensor(keep, dtype=torch.long)
        stacked = tree_map(lambda x: x[index.to(x.device)], chunk.stacked)
    replies = None if chunk.replies is None else [chunk.replies[i] for i in keep]
    return _Chunk(
        [chunk.clients[i] for i in keep],
        replies,
        stacked,
        [chunk.states[i] for i in keep],
        [chunk.metrics[i] for i in keep],
    )


class _RoundChunks(list[_Chunk]):
    """The chunks of one round (a list), in the order ``_run_block`` appends them, with their stacked
    replies moved into one ``[M, ...]`` buffer per reply leaf (``M`` = the round's clients, row
    ``i`` = the ``i``-th smallest client id) as each chunk arrives.

    A block's stacked replies are therefore freed as soon as the block is checked, and the
    round's replies are never held twice: :func:`_assemble_replies` concatenated every block's
    stacked replies at the end of the round, so that the blocks and their concatenation (2x the
    round's replies) were alive at once.  The buffer holds the same values in the same order as
    that concatenation, so every reduction over it gives the same bits.  When every client
    replied it is used as is; otherwise the replying clients' rows are selected (one copy, like
    the concatenation).  Chunks that do not fit the buffer (replies not stacked, or of another
    structure, shape, dtype or device than the first chunk's) keep their replies, and the round
    is assembled by :func:`_assemble_replies` exactly as before (with the buffered chunks as
    views of the buffer's rows).

    With client states on disk (``stage``), each chunk's new states are staged as files as it
    arrives (:meth:`~fedrisk.runtime.client_store.DiskClientStates.stage`), so that the round
    does not hold every participant's new state either.

    Example:
        >>> rc = _RoundChunks([4, 1, 7])
        >>> rc.append(_Chunk([1, 4], None, {"d": torch.tensor([[1.0], [2.0]])}, [{}, {}], [{}, {}]))
        >>> rc.append(_Chunk([7], None, {"d": torch.tensor([[3.0]])}, [{}], [{}]))
        >>> r = rc.replies()
        >>> r.clients, r.stacked("d").flatten().tolist(), [c.stacked for c in rc]
        ([1, 4, 7], [1.0, 2.0, 3.0], [None, None])
    """

    def __init__(self, clients: Sequence[int], stage: Callable[[int, Tree], None] | None = None) -> None:
        super().__init__()
        self.stage = stage  # client states on disk: each chunk's new states are staged there at once
        self.row = {int(k): i for i, k in enumerate(sorted(int(k) for k in clients))}
        self.buffered: list[bool] = []  # per chunk: its replies are in the buffer
        self.spec: Any = None
        self.buffer: list[Tensor] | None = None
        self.whole: _Chunk | None = None  # a first chunk of every client: kept as it is

    def _fits(self, leaves: list[Any], spec: Any) -> bool:
        assert self.buffer is not None
        return spec == self.spec and all(
            isinstance(x, Tensor) and x.shape[1:] == b.shape[1:] and x.dtype == b.dtype and x.device == b.device
            for x, b in zip(leaves, self.buffer)
        )

    def append(self, chunk: _Chunk) -> None:
        super().append(chunk)
        if self.stage is not None:  # the new states go to disk as the block finishes, not at the round's end
            for k, state in zip(chunk.clients, chunk.states):
                self.stage(k, state)
            chunk.states = [{} for _ in chunk.clients]
        if chunk.stacked is None or not chunk.clients or self.whole is not None:
            self.buffered.append(False)
            return
        leaves, spec = pytree.tree_flatten(chunk.stacked)
        if self.buffer is None and not any(self.buffered):
            if not leaves or not all(isinstance(x, Tensor) for x in leaves):  # e.g. replies {}: nothing to hold
                self.buffered.append(False)
                return
            if len(chunk.clients) == len(self.row) and not any(c.clients for c in self[:-1]):
                self.whole = chunk  # the whole round in one chunk: nothing to move
                self.buffered.append(False)
                return
            self.spec = spec
            self.buffer = [torch.empty((len(self.row), *x.shape[1:]), dtype=x.dtype, device=x.device) for x in leaves]
        if not self._fits(leaves, spec):
            self.buffered.append(False)
            return
        assert self.buffer is not None
        rows = [self.row[k] for k in chunk.clients]
        contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
        index = None if contiguous else torch.tensor(rows, dtype=torch.long, device=self.buffer[0].device)
        for x, b in zip(leaves, self.buffer):
            if index is None:
                b[rows[0] : rows[0] + len(rows)].copy_(x)
            else:
                b.index_copy_(0, index, x)
        chunk.stacked = None  # its block's tensors are freed
        self.buffered.append(True)

    def replies(self) -> Replies:
        """The round's replies: those of :func:`_assemble_replies` over the same chunks."""
        if self.buffer is None:
            return _assemble_replies(self)
        if all(inside or not c.clients for c, inside in zip(self, self.buffered)):
            done = sorted(k for c in self for k in c.clients)
            cols = self.buffer
            if len(done) < len(self.row):  # failed clients: their rows are dropped
                index = torch.tensor([self.row[k] for k in done], dtype=torch.long, device=cols[0].device)
                cols = [x[index] for x in cols]
            return StackedReplies(done, pytree.tree_unflatten(cols, self.spec))
        views = []  # a mixed round: assemble as before, buffered chunks as views of their rows
        for c, inside in zip(self, self.buffered):
            if inside:
                index = torch.tensor([self.row[k] for k in c.clients], dtype=torch.long)
                stacked = pytree.tree_unflatten([x[index.to(x.device)] for x in self.buffer], self.spec)
                c = _Chunk(c.clients, None, stacked, c.states, c.metrics)
            views.append(c)
        return _assemble_replies(views)


def _assemble_replies(chunks: Sequence[_Chunk]) -> Replies:
    """One :class:`StackedReplies` when every chunk's replies stack together, else in memory."""
    chunks = [c for c in chunks if c.clients]
    stacked: list[Any] = []
    for c in chunks:
        if c.stacked is not None:
            stacked.append(c.stacked)
            continue
        try:  # a sequential fallback chunk: stack its replies if they have one structure
            stacked.append(tree_stack(c.replies or []))
        except Exception:
            stacked.append(None)
    if all(s is not None for s in stacked):
        specs = [pytree.tree_flatten(s) for s in stacked]
        first_leaves, first_spec = specs[0]
        same = all(
            spec == first_spec
            and all(a.shape[1:] == b.shape[1:] and a.dtype == b.dtype for a, b in zip(leaves, first_leaves))
            for leaves, spec in specs
        )
        if same:
            clients = [k for c in chunks for k in c.clients]
            if len(chunks) == 1:
                return StackedReplies(clients, stacked[0])
            cols = [torch.cat(col) for col in zip(*(leaves for leaves, _ in specs))]
            if clients != sorted(clients):
                order = sorted(range(len(clients)), key=clients.__getitem__)
                index = torch.tensor(order, dtype=torch.long)
                cols = [x[index.to(x.device)] for x in cols]
                clients = sorted(clients)
            return StackedReplies(clients, pytree.tree_unflatten(cols, first_spec))
    replies: dict[int, dict[str, Any]] = {}
    for c, s in zip(chunks, stacked):
        rows = c.replies if c.replies is not None else _unstack(s, len(c.clients))
        replies.update(zip(c.clients, rows))
    return InMemoryReplies(replies)
