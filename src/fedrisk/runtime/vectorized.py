"""The vectorised executor: a block of clients' ``client_update`` at once with ``torch.func.vmap``.

:class:`VectorizedExecutor` gives the same numbers as the sequential executor (to float
rounding: 1e-9 in float64, 1e-5 relative in float32) and is what makes thousands of small
clients cheap: one batched tensor program per block of clients instead of one small program
per client.  One round, for each block of the round's (sorted) clients:

1. ``draws``: for an algorithm with ``batched_draw = True``, one call
   ``algorithm.draw(ctx, ids, sizes, client_generator(seed, round, block))`` with the block's
   counter-based generator (:class:`fedrisk.rng.ClientRNG`): its row ``i`` is bit for bit the
   draw of client ``ids[i]`` alone, so the random choices are those of the sequential
   executor.  Otherwise ``algorithm.draw(ctx, k, n_k, client_generator(seed, round, k))`` for
   every client ``k`` of the block, exactly as
   :class:`~fedrisk.runtime.executor.SequentialExecutor` does.
2. ``stack``: each client's per-client payload part (``plan.per_client[k]``), client state
   (and draws, when made one by one) are flattened; clients whose trees have the same
   structure and leaf shapes form a *group* (normally the whole block) and their tensor leaves
   are stacked into ``[C, ...]`` (stateless clients with one payload skip this: one group).
   The ``broadcast`` part of the payload is not stacked: it is captured by the vmapped
   function, i.e. passed with ``in_dims=None``.  The clients' data are gathered from one
   concatenated store into ``[C, n_max, ...]`` tensors padded with zero rows up to the
   block's largest client (``LocalData.size`` is each client's real row count).
3. ``vmap``: ``client_update(ctx, {**broadcast, **per_client}, state, data, draws)`` runs once
   under ``torch.func.vmap`` for the whole group.  A group of stateless clients sharing one
   payload skips ``vmap`` when the algorithm has a ``block_update(ctx, payload, data, draws)``
   that returns its stacked result (FedAvg and FedProx with cross-entropy on a zoo MLP or
   logistic regression: :mod:`fedrisk.algorithms.fused`, the same numbers to float rounding;
   :func:`fedrisk.algorithms.local.fast_paths` switches it off).
4. ``replies`` stay stacked: :class:`StackedReplies` implements ``sum`` / ``mean`` as one
   weighted reduction over the client dimension and ``gather`` / ``stacked`` / ``as_dict`` by
   indexing.  Each block's stacked replies are moved into one ``[M, ...]`` round buffer as soon
   as the block is checked (``_RoundChunks``), so a round's replies are held once.  New client
   states are split per client (copied, so that a client's state never
   pins a whole block's tensor in memory); metrics are split per client.  (The stacked
   structures, the data store and the round buffer, are :mod:`fedrisk.runtime.stacked`.)
5. ``checks``: one ``isfinite`` reduction per reply leaf over the block gives the clients whose
   reply is NaN/inf; they are handled by ``on_failure`` exactly like the sequential executor
   (``"raise"``: :class:`~fedrisk.runtime.executor.ClientFailure` naming the client;
   ``"skip"``: the client is dropped for the round).

What an algorithm author must respect so that ``client_update`` runs under ``vmap``
(:class:`~fedrisk.algorithms.fedavg.FedAvg` is the reference):

* every random choice is made in ``Algorithm.draw`` from the client's generator and handed to
  ``client_update`` as tensors in ``draws`` (``torch.rand`` inside ``client_update`` fails:
  vmap runs with ``randomness="error"``);
* no ``.item()`` / ``float(t)`` / ``int(t)`` / ``bool(t)`` on tensors that depend on the data,
  the state or the draws, and no Python ``if`` / ``while`` on such values (use
  ``torch.where`` and masks); loops only over static counts (``local_steps``, ``draws``' shapes);
* gradients through :mod:`fedrisk.autodiff` (which switches to ``torch.func.grad_and_value``
  under a transform) or ``torch.func``; no in-place updates of inputs;
* the data are padded: index rows only through draws made below ``num_samples`` and use
  ``LocalData.valid()`` / ``LocalData.size`` for full-batch (masked) computations rather than
  ``data.x.shape[0]``;
* replies are trees of tensors (a Python number in a reply is an error here, since replies are
  stacked and reduced); states and metrics may contain Python values that do not depend on
  the client (they are carried through as constants).

An algorithm that cannot respect these sets ``vectorizable = False`` and says why in
``not_vectorizable_reason``; this executor then refuses it at start-up with that reason.  If an
algorithm claims to be vectorisable but its ``client_update`` fails under ``vmap`` while it runs
client by client, the run stops with a :class:`~fedrisk.errors.FedriskError` quoting the vmap
error.

A client raising an exception under ``vmap`` fails its whole group; the group is then re-run
client by client (on the clients' unpadded data) to find the failing client, which is reported
(``"raise"``) or dropped (``"skip"``) exactly as the sequential executor does.

**When it pays.**  Many small clients: the per-client Python and kernel-launch overhead of the
sequential executor is what vmap removes (``benchmarks/RESULTS.md``: 4-5x faster than
sequential on 100 MLP clients, 9-17x on 1000 logistic-regression clients).  Compute-bound
clients do not gain: with wide layers every client's weight matrix is a separate batched GEMM
and a separate weight gradient, and on the benchmark's heavy variant (MLP 64-512-512-10, 40
local steps per client) the vectorised executor was 1.5x *slower* than the sequential one;
use the sequential or distributed executor there.

**Block size.**  ``block_size=None`` (the default) picks the largest block whose estimated
memory fits ``memory_budget_mb``; the estimate per client is (see :meth:`bytes_per_client`)::

    PARAM_COPIES * (bytes of the client's payload + bytes of its state)
      + DATA_COPIES * (padded rows of the largest participating client * bytes per row)

with ``PARAM_COPIES = 8`` (under vmap every client holds its own working parameters, their
gradient, the tensors autograd saves for one step, the reply, the new state and temporaries)
and ``DATA_COPIES = 2`` (the gathered block data plus one minibatch-sized gather and the first
layer's activations, which are at most about the size of the data).  Activations of wide or
convolutional models are *not* estimated beyond that: for such models lower the budget or set
``block_size``.  On the CPU the automatic block is further capped so that a stacked
``[C, ...]`` copy of the largest per-client tensor (a weight matrix, or the padded data rows)
stays within :data:`CPU_STACKED_LEAF_BYTES` (32 MiB, what the C allocator recycles): larger
stacks come as fresh, zeroed pages at every local step, which made blocks of 600 MLP 784-64-10
clients about 3x slower per client than blocks of 160.  Results do not depend on the block
size (up to float rounding).

**Threads.**  The executor never changes torch's global thread settings.  Loops of many small
operations (the sequential executor on small models) run fastest with
``torch.set_num_threads(1)``; the batched kernels of this executor gain from 2 or more threads
when the blocks are large.  Set the number of threads in the calling program.  The first
vmapped gradient in a process pays a one-off lazy import inside torch (about 2 s on CPU).

**Memory.**  :meth:`VectorizedExecutor.prepare` concatenates every client's training rows into
one store (one extra copy of the training data); per block only the block's clients are
gathered, padded to the block's largest client (not the federation's).

Example:
    >>> import torch
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> from fedrisk.runtime.simulation import Simulation
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(15)), s.subset(range(15, 40))], num_classes=2)
    >>> alg = FedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, lr=0.1, batch_size=5)
    >>> seq = Simulation(alg, fed, seed=0, dtype=torch.float64)
    >>> vec = Simulation(alg, fed, seed=0, dtype=torch.float64, executor=VectorizedExecutor(block_size=2))
    >>> _ = seq.step(), vec.step()
    >>> bool(torch.allclose(seq.server_state["params"]["linear.weight"], vec.server_state["params"]["linear.weight"]))
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.func import vmap
from torch.utils import _pytree as pytree

from fedrisk.algorithms.base import Algorithm, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError, check_range
from fedrisk.rng import client_generator
from fedrisk.runtime.client_store import DiskClientStates
from fedrisk.runtime.executor import ClientFailure, Executor, RoundOutput, check_reply
from fedrisk.runtime.stacked import StackedReplies, _check_chunk, _Chunk, _ClientStore, _RoundChunks, _unstack
from fedrisk.tree import Tree, tensor_leaves, tree_map, tree_nbytes

__all__ = ["CPU_STACKED_LEAF_BYTES", "DATA_COPIES", "PARAM_COPIES", "StackedReplies", "VectorizedExecutor"]

PARAM_COPIES = 8
"""Copies of (payload + state) one client holds under vmap, in the block-size estimate."""

DATA_COPIES = 2
"""Copies of a client's padded data rows, in the block-size estimate."""

CPU_STACKED_LEAF_BYTES = 32 * 2**20
"""On the CPU the automatic block size keeps every stacked ``[C, ...]`` tensor within 32 MiB.

32 MiB is glibc's largest dynamic ``mmap`` threshold: a freed block of up to that size goes back
to the heap and the next step's tensors of the same size reuse it, while a larger one is
returned to the kernel and every new one comes as fresh pages that the kernel zeroes and faults
in.  A block step allocates a few such stacks (gradients, updated weights), so above the
threshold page faults dominate: in a micro-benchmark (5 local steps under ``vmap``), blocks of
600 clients of an MLP 784-64-10 (a 120 MiB stack of first-layer weights) took 1.6 ms CPU per
client, blocks of 160 (32 MiB) 0.45-0.5 ms; ``benchmarks/RESULTS.md`` ("10,000 clients") has
the end-to-end effect (with this issue's other changes: 20.8 -> 8.6 s per round)."""

_TENSOR = object()  # marks a tensor position in a flattened tree whose other leaves are constants


# --------------------------------------------------------------------------------------------
# the executor
# --------------------------------------------------------------------------------------------


class VectorizedExecutor(Executor):
    """Runs blocks of clients with ``torch.func.vmap`` (see the module docstring).

    Args:
        block_size: clients per vmapped block; None chooses it from ``memory_budget_mb``.
        memory_budget_mb: the memory a block may use, in MiB (used when ``block_size`` is None).

    Example:
        >>> VectorizedExecutor(block_size=64).block_size
        64
        >>> VectorizedExecutor(block_size=0)
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: block_size = 0 is out of range; allowed: [1, inf)
    """

    name = "vectorized"

    def __init__(self, block_size: int | None = None, memory_budget_mb: float = 1024.0) -> None:
        if block_size is not None:
            if isinstance(block_size, bool) or not isinstance(block_size, int):
                raise FedriskError(f"block_size must be a positive integer or None (automatic); got {block_size!r}")
            check_range("block_size", block_size, 1)
        check_range("memory_budget_mb", memory_budget_mb, 0.0, None, low_inclusive=False)
        self.block_size = block_size
        self.memory_budget_mb = float(memory_budget_mb)
        self._store: _ClientStore | None = None
        self._data_ref: Sequence[LocalData] | None = None

    # -- set-up -----------------------------------------------------------------------------
    def prepare(self, algorithm: Algorithm, data: Sequence[LocalData]) -> None:
        """Check that ``algorithm`` can be vectorised and concatenate the clients' data once."""
        check_vectorizable(algorithm)
        self._store = _ClientStore.build(data)
        self._data_ref = data

    def _store_of(self, data: Sequence[LocalData]) -> _ClientStore:
        """The concatenated store of ``data`` (built again if ``data`` is not the prepared list)."""
        if self._store is None or self._data_ref is not data:
            self._store = _ClientStore.build(data)
            self._data_ref = data
        return self._store

    # -- block size -------------------------------------------------------------------------
    def bytes_per_client(self, plan: RoundPlan, states: Mapping[int, Tree], data: Sequence[LocalData]) -> int:
        """The estimated bytes one client of ``plan`` needs inside a vmapped block.

        ``PARAM_COPIES * (payload + state) + DATA_COPIES * n_max * row_bytes`` with the payload
        and state of the round's first client and ``n_max`` the largest participating client.
        """
        if not plan.clients:
            return 1
        k0 = plan.clients[0]
        model = tree_nbytes(plan.payload(k0)) + tree_nbytes(states[k0])
        store = self._store_of(data)
        n_max = max(store.sizes[k] for k in plan.clients)
        row = store.row_bytes
        return max(1, PARAM_COPIES * model + DATA_COPIES * n_max * row)

    def largest_leaf_per_client(self, plan: RoundPlan, states: Mapping[int, Tree], data: Sequence[LocalData]) -> int:
        """Bytes of one client's largest tensor in a block: its largest payload or state leaf
        (a weight matrix, of which the block holds ``[C, ...]`` stacks: working copy, gradient,
        update) or its padded data rows (``n_max * row_bytes``), whichever is larger."""
        if not plan.clients:
            return 1
        k0 = plan.clients[0]
        leaves = tensor_leaves(plan.payload(k0)) + tensor_leaves(states[k0])
        model = max((x.numel() * x.element_size() for x in leaves), default=0)
        store = self._store_of(data)
        n_max = max(store.sizes[k] for k in plan.clients)
        return max(1, model, n_max * store.row_bytes)

    def block_size_for(self, plan: RoundPlan, states: Mapping[int, Tree], data: Sequence[LocalData]) -> int:
        """The block size used for ``plan``: ``block_size`` if given, else
        ``clamp(memory_budget / bytes_per_client, 1, len(plan.clients))``, on the CPU further
        capped so that a stacked ``[C, ...]`` tensor of the block's largest leaf stays within
        :data:`CPU_STACKED_LEAF_BYTES` (unless one client's leaf alone is above half of it)."""
        m = max(1, len(plan.clients))
        if self.block_size is not None:
            return min(self.block_size, m)
        budget = self.memory_budget_mb * 2**20
        size = max(1, min(m, int(budget // self.bytes_per_client(plan, states, data))))
        if self._store_of(data).x.device.type == "cpu":
            leaf = self.largest_leaf_per_client(plan, states, data)
            if 2 * leaf <= CPU_STACKED_LEAF_BYTES:
                size = min(size, CPU_STACKED_LEAF_BYTES // leaf)
        return size

    # -- one round --------------------------------------------------------------------------
    def run_round(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        seed: int,
        on_failure: str = "raise",
    ) -> RoundOutput:
        check_vectorizable(algorithm)
        store = self._store_of(data)
        size = self.block_size_for(plan, states, data)
        disk = states if isinstance(states, DiskClientStates) else None
        chunks = _RoundChunks(plan.clients, stage=disk.stage if disk is not None else None)
        failed: dict[int, str] = {}
        clients = plan.clients
        for start in range(0, len(clients), size):
            block = clients[start : start + size]
            self._run_block(algorithm, ctx, plan, states, data, store, seed, on_failure, block, chunks, failed)
        done = sorted(k for c in chunks for k in c.clients)
        if not done:
            raise ClientFailure(f"every client failed in round {ctx.round}: {failed}")
        new_states: dict[int, Tree] = {}
        metrics: dict[int, dict[str, Tensor]] = {}
        for c in chunks:
            new_states.update(zip(c.clients, c.states))
            metrics.update(zip(c.clients, c.metrics))
        return RoundOutput(
            chunks.replies(),
            disk.staged(done) if disk is not None else {k: new_states[k] for k in done},
            {k: metrics[k] for k in done},
            {k: failed[k] for k in sorted(failed)},
        )

    def _run_block(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        store: _ClientStore,
        seed: int,
        on_failure: str,
        block: list[int],
        chunks: list[_Chunk],
        failed: dict[int, str],
    ) -> None:
        # 1. draws: one call for the block (batched_draw), else client by client as the
        #    sequential executor makes them (row i of a batched draw equals client i's own draw)
        stacked_draws = self._block_draws(algorithm, ctx, store, seed, block) if algorithm.batched_draw else None
        draws: dict[int, Tree] = {}
        if stacked_draws is None:
            for k in block:
                try:
                    own_draws = algorithm.draw(ctx, k, store.sizes[k], client_generator(seed, ctx.round, k))
                    draws[k] = _to_device(own_draws, store.x.device)
                except FedriskError:
                    raise
                except Exception as exc:
                    if on_failure == "raise":
                        raise ClientFailure(f"client {k} failed in round {ctx.round}: {exc!r}") from exc
                    failed[k] = repr(exc)
        # 2. group the clients whose (per-client payload, state[, draws]) trees stack together
        groups: dict[Any, tuple[list[int], list[list[Any]], Any]] = {}
        if stacked_draws is not None and plan.per_client is None and all(_is_empty_dict(states[k]) for k in block):
            # stateless clients, one payload (FedAvg and kin): one group with nothing to stack
            groups["stateless"] = (list(block), [[] for _ in block], pytree.tree_flatten(({}, {}))[1])
        for k in block if not groups else ():
            if stacked_draws is None and k not in draws:
                continue
            own = plan.per_client[k] if plan.per_client is not None else {}
            tree = (dict(own), states[k]) if stacked_draws is not None else (dict(own), states[k], draws[k])
            leaves: list[Any] = []
            structure: list[Any] = []
            if _fast_flatten(tree, leaves, structure):  # dicts / lists / tuples of tensors
                key: Any = ("fast", tuple(structure))
                spec = None
            else:  # anything else: torch's pytree, constants compared by value
                leaves, spec = pytree.tree_flatten(tree)
                key = ("pytree", _signature(spec, leaves))
            if key not in groups:
                if spec is None:  # one pytree flatten per group: the spec, and a check of the leaf order
                    ref, spec = pytree.tree_flatten(tree)
                    if len(ref) != len(leaves) or any(a is not b for a, b in zip(ref, leaves)):
                        raise RuntimeError("internal error: _fast_flatten disagrees with torch's pytree order")
                groups[key] = ([], [], spec)
            groups[key][0].append(k)
            groups[key][1].append(leaves)
        if stacked_draws is not None:
            position = {k: i for i, k in enumerate(block)}
            draws = _LazyDraws(stacked_draws, position)
        # 3. one vmap per group
        for members, rows, spec in groups.values():
            group_draws = None
            if stacked_draws is not None:
                rows_of_group = None if len(members) == len(block) else [position[k] for k in members]
                group_draws = _select_rows(stacked_draws, rows_of_group)
            chunk = self._run_group(
                algorithm, ctx, plan, states, data, store, on_failure, members, rows, spec, draws, group_draws
            )
            chunks.append(_check_chunk(chunk, ctx, on_failure, failed))

    def _block_draws(
        self, algorithm: Algorithm, ctx: RoundContext, store: _ClientStore, seed: int, block: list[int]
    ) -> Tree | None:
        """``algorithm.draw`` for the whole block at once, or None when that raises (the draws
        are then made client by client, which names the failing client)."""
        ids = torch.tensor(block, dtype=torch.long)
        try:
            out = algorithm.draw(ctx, ids, store.sizes_t.cpu()[ids], client_generator(seed, ctx.round, block))
        except FedriskError:
            raise
        except Exception:
            return None
        for leaf in pytree.tree_leaves(out):
            if not isinstance(leaf, Tensor) or leaf.dim() == 0 or leaf.shape[0] != len(block):
                raise FedriskError(
                    f"algorithm {algorithm.name!r} sets batched_draw = True but its draw for a block of "
                    f"{len(block)} clients returned a leaf that is not a tensor [{len(block)}, ...] "
                    f"({type(leaf).__name__} {tuple(getattr(leaf, 'shape', ()))}); see Algorithm.draw"
                )
        return _to_device(out, store.x.device)

    def _run_group(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        store: _ClientStore,
        on_failure: str,
        members: list[int],
        rows: list[list[Any]],
        spec: Any,
        draws: Mapping[int, Tree],
        group_draws: Tree | None = None,
    ) -> _Chunk:
        """vmap ``client_update`` over ``members``; ``rows`` are their flattened (own payload,
        state[, draws]) leaves; ``group_draws`` their stacked draws when made for the block."""
        first = rows[0]
        template = [_TENSOR if isinstance(x, Tensor) else x for x in first]
        positions = [i for i, x in enumerate(first) if isinstance(x, Tensor)]
        batched = [torch.stack([r[i] for r in rows]) for i in positions]
        data_leaves = store.block(members)
        broadcast = dict(plan.broadcast)
        out_meta: dict[str, Any] = {}

        draw_leaves, draw_spec = pytree.tree_flatten(group_draws) if group_draws is not None else ([], None)

        def one_client(own_leaves: list[Tensor], local: list[Tensor], draw_rows: list[Tensor]) -> list[Tensor]:
            it = iter(own_leaves)
            parts = pytree.tree_unflatten([next(it) if t is _TENSOR else t for t in template], spec)
            own, state = parts[0], parts[1]
            client_draws = parts[2] if group_draws is None else pytree.tree_unflatten(draw_rows, draw_spec)
            result = algorithm.client_update(ctx, {**broadcast, **own}, state, store.local_data(local), client_draws)
            reply, new_state, metrics = result
            return _flatten_outputs(algorithm, (reply, new_state, metrics), out_meta)

        fused = None
        if group_draws is not None and plan.per_client is None and all(_is_empty_dict(states[k]) for k in members):
            fused = _block_update(algorithm, ctx, broadcast, store.local_data(data_leaves), group_draws)
        if fused is not None:
            reply_t, state_t, metric_t = fused
        else:
            try:
                outs = vmap(one_client, in_dims=(0, 0, 0))(batched, data_leaves, draw_leaves)
            except FedriskError:
                raise
            except Exception as exc:  # a client failure, or an algorithm that does not vectorise
                return _run_sequentially(algorithm, ctx, plan, states, data, on_failure, members, draws, exc)
            reply_t, state_t, metric_t = _split_outputs(outs, out_meta)
        c = len(members)
        return _Chunk(
            clients=list(members),
            replies=None,
            stacked=reply_t,
            states=_unstack(state_t, c, copy=True),
            metrics=_unstack(metric_t, c),
        )


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


class _LazyDraws(Mapping[int, Tree]):
    """Per-client views of a block's stacked draws (for the rare client-by-client fallback)."""

    def __init__(self, stacked: Tree, position: Mapping[int, int]) -> None:
        self._stacked, self._position = stacked, position

    def __getitem__(self, k: int) -> Tree:
        i = self._position[k]
        return tree_map(lambda x: x[i], self._stacked)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._position)

    def __len__(self) -> int:
        return len(self._position)


def _block_update(
    algorithm: Algorithm, ctx: RoundContext, payload: Mapping[str, Any], data: LocalData, draws: Tree
) -> tuple[Tree, Tree, Tree] | None:
    """The algorithm's ``block_update`` (a stacked program for a block of stateless clients that
    share one payload, e.g. :meth:`FedAvg.block_update <fedrisk.algorithms.fedavg.FedAvg.block_update>`)
    instead of ``vmap``, when it has one and it applies; None otherwise (or when it raises: ``vmap``
    then runs the block and finds a failing client as usual)."""
    block_update = getattr(algorithm, "block_update", None)
    if block_update is None:
        return None
    try:
        out = block_update(ctx, payload, data, draws)
    except FedriskError:
        raise
    except Exception:
        return None
    return None if out is None else (out[0], out[1], out[2])


def _to_device(draws: Tree, device: torch.device) -> Tree:
    """The draws' tensors on the clients' data device (``ClientRNG`` draws on the CPU), so that
    indexing the stacked data under vmap never mixes devices; a no-op on the CPU."""
    if device.type == "cpu":
        return draws
    return tree_map(lambda x: x.to(device) if isinstance(x, Tensor) else x, draws)


def _select_rows(stacked: Tree, rows: list[int] | None) -> Tree:
    """``stacked`` (leaves ``[C, ...]``) restricted to ``rows`` (all of it for None)."""
    if rows is None:
        return stacked
    index = torch.tensor(rows, dtype=torch.long)
    return tree_map(lambda x: x[index.to(x.device)], stacked)


def check_vectorizable(algorithm: Algorithm) -> None:
    """Raise a :class:`FedriskError` naming the reason when ``algorithm`` cannot be vmapped."""
    if not getattr(algorithm, "vectorizable", True):
        reason = getattr(algorithm, "not_vectorizable_reason", "") or "no reason given"
        raise FedriskError(
            f"algorithm {algorithm.name!r} cannot run under executor='vectorized': {reason}. "
            "Use executor='sequential' (or 'distributed')"
        )


def _is_empty_dict(tree: Any) -> bool:
    return type(tree) is dict and not tree


def _fast_flatten(tree: Any, leaves: list[Any], structure: list[Any]) -> bool:
    """Flatten nested dicts / lists / tuples of tensors in torch pytree's leaf order.

    Appends the tensors to ``leaves`` and a hashable description of the structure and of the
    leaves' shapes / dtypes / devices to ``structure``.  Returns False (the caller then uses
    :mod:`torch.utils._pytree`) for any other node or leaf type.  This is the per-client hot
    path of a round, several times cheaper than ``pytree.tree_flatten`` plus a spec hash.
    """
    t = type(tree)
    if t is dict or t is list or t is tuple:
        if t is dict:
            structure.append(("dict", tuple(tree)))
            children = tree.values()
        else:
            structure.append((t, len(tree)))
            children = tree
        return all(_fast_flatten(child, leaves, structure) for child in children)
    if tree is None:
        structure.append(None)
        return True
    if isinstance(tree, Tensor):
        leaves.append(tree)
        structure.append((tree.shape, tree.dtype, tree.device))
        return True
    return False


def _signature(spec: Any, leaves: Sequence[Any]) -> Any:
    """A hashable key: tree structure, tensor shapes / dtypes / devices and constant leaves."""
    sig: list[Any] = [spec]
    for x in leaves:
        if isinstance(x, Tensor):
            sig.append((tuple(x.shape), x.dtype, x.device))
        else:
            try:
                hash(x)
                sig.append(("const", type(x), x))
            except TypeError:
                sig.append(("object", id(x)))
    return tuple(sig)


def _flatten_outputs(algorithm: Algorithm, result: tuple[Tree, Tree, Tree], meta: dict[str, Any]) -> list[Tensor]:
    """Flatten (reply, state, metrics) into tensors; record specs and constant leaves in ``meta``."""
    tensors: list[Tensor] = []
    for part, tree in zip(("reply", "state", "metrics"), result):
        leaves, spec = pytree.tree_flatten(tree)
        if part == "reply":
            for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
                if not isinstance(leaf, Tensor):
                    where = "reply" + pytree.keystr(path)
                    raise FedriskError(
                        f"algorithm {algorithm.name!r}: {where} is a {type(leaf).__name__} ({leaf!r}); the "
                        "vectorised executor stacks and reduces replies and needs tensor leaves - return "
                        "torch.tensor(...) instead, or use executor='sequential'"
                    )
        meta[part] = (spec, [_TENSOR if isinstance(x, Tensor) else x for x in leaves])
        tensors.extend(x for x in leaves if isinstance(x, Tensor))
    return tensors


def _split_outputs(outs: Sequence[Tensor], meta: Mapping[str, Any]) -> tuple[Tree, Tree, Tree]:
    """Rebuild the stacked (reply, state, metrics) trees from vmap's flat outputs."""
    it = iter(outs)
    trees = []
    for part in ("reply", "state", "metrics"):
        spec, template = meta[part]
        trees.append(pytree.tree_unflatten([next(it) if t is _TENSOR else t for t in template], spec))
    return trees[0], trees[1], trees[2]


def _run_sequentially(
    algorithm: Algorithm,
    ctx: RoundContext,
    plan: RoundPlan,
    states: Mapping[int, Tree],
    data: Sequence[LocalData],
    on_failure: str,
    members: list[int],
    draws: Mapping[int, Tree],
    vmap_error: Exception,
) -> _Chunk:
    """Re-run a group whose vmap raised, client by client (as the sequential executor does)."""
    chunk = _Chunk([], [], None, [], [])
    failures: dict[int, str] = {}
    for k in members:
        try:
            reply, state, metrics = algorithm.client_update(ctx, plan.payload(k), states[k], data[k], draws[k])
        except FedriskError:
            raise
        except Exception as exc:
            if on_failure == "raise":
                # an earlier client's NaN reply stops the round first, as in the sequential executor
                for j, earlier in enumerate(chunk.clients):
                    check_reply(earlier, ctx.round, (chunk.replies[j], chunk.states[j]), on_failure)
                raise ClientFailure(
                    f"client {k} failed in round {ctx.round}: {exc!r} (found by re-running the vectorised "
                    f"block of clients {members} one by one)"
                ) from exc
            failures[k] = repr(exc)
            continue
        chunk.clients.append(k)
        assert chunk.replies is not None
        chunk.replies.append(reply)
        chunk.states.append(state)
        chunk.metrics.append(metrics)
    if not failures:
        raise FedriskError(
            f"algorithm {algorithm.name!r}: client_update fails under torch.func.vmap ({vmap_error!r}) although "
            "it runs client by client, so it cannot use executor='vectorized'. Its client_update must not call "
            ".item()/float() on tensors, branch in Python on tensor values or draw random numbers (see "
            "fedrisk.runtime.vectorized); fix it, or set vectorizable = False with a not_vectorizable_reason "
            "and use executor='sequential'"
        ) from vmap_error
    chunk.failures = failures
    return chunk
