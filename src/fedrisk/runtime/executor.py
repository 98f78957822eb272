"""Executors run the participating clients' ``client_update`` for one round.

All executors give the same numbers: each client's randomness comes from its own generator
``client_generator(seed, round, client)`` through ``Algorithm.draw``, and ``client_update`` is
a deterministic function of its inputs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError
from fedrisk.rng import client_generator
from fedrisk.runtime.device import to_device
from fedrisk.tree import Tree, tensor_leaves, tree_all_finite

T = TypeVar("T")


class ClientFailure(FedriskError):
    """A client raised an error or replied with non-finite values."""


@dataclass
class RoundOutput:
    replies: Replies
    states: dict[int, Tree]
    metrics: dict[int, dict[str, Tensor]]
    failed: dict[int, str]


class Executor(ABC):
    name: str = "executor"

    def prepare(self, algorithm: Algorithm, data: Sequence[LocalData]) -> None:  # noqa: B027
        """Called once before the first round (e.g. to stack data or check vmap support)."""

    def collect_states(self, states: Mapping[int, Tree]) -> dict[int, Tree]:
        """Every client's state in this process (the distributed executor gathers the shards)."""
        return dict(states)

    @property
    def is_primary(self) -> bool:
        """True in the process that writes logs, metrics and checkpoints."""
        return True

    def run_on_primary(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the primary process and give every process its result (or its error)."""
        return fn()

    def any_rank(self, flag: bool) -> bool:
        """True when ``flag`` is true in any process (e.g. a stop signal received by one rank)."""
        return flag

    @abstractmethod
    def run_round(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        seed: int,
        on_failure: str = "raise",
    ) -> RoundOutput: ...


def nonfinite_paths(tree: Any, limit: int = 4) -> list[str]:
    """Where ``tree`` holds NaN/inf: up to ``limit`` dotted dict-key paths (sequence positions
    left out, so a reply alone and a ``(reply, state)`` pair name a leaf alike).

    Example:
        >>> nonfinite_paths(({"x": {"mu": torch.ones(1)}, "y": torch.tensor([float("nan")])}, {}))
        ['y']
    """
    from torch.utils import _pytree as pytree

    leaves, _ = pytree.tree_flatten_with_path(tree)
    bad = [
        ".".join(str(getattr(k, "key", getattr(k, "name", ""))) for k in path if not hasattr(k, "idx")) or "?"
        for path, x in leaves
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not bool(torch.isfinite(x).all())
    ]
    return bad[:limit]


def check_reply(client: int, round: int, reply: Any, on_failure: str) -> str | None:
    """Return a failure reason for a non-finite reply or new client state (or raise when
    ``on_failure='raise'``)."""
    if tree_all_finite(reply):
        return None
    reason = (
        f"client {client} replied with NaN/inf values in round {round} (reply or new client state; "
        f"first non-finite leaf: {(nonfinite_paths(reply, limit=1) or ['?'])[0]})"
    )
    if on_failure == "raise":
        raise ClientFailure(reason + " (set on_client_failure='skip' to drop such replies)")
    return reason


_CHUNK = 1 << 20
"""Elements stacked at a time by :func:`_provably_finite` (4 MiB of float32)."""


def _provably_finite(trees: Sequence[Tree]) -> bool:
    """True when the floating tensor leaves of every tree are finite, proved by a few sums (a
    NaN / inf anywhere makes its sum non-finite): leaves of one shape / dtype / device are
    stacked, ``_CHUNK`` elements at a time, and summed.  False means "not proved": a real
    NaN / inf, or a sum of finite values that overflowed; callers then check tree by tree."""
    groups: dict[tuple[torch.Size, torch.dtype, torch.device], list[Tensor]] = {}
    for tree in trees:
        for x in tensor_leaves(tree):
            if x.is_floating_point() and x.numel():
                groups.setdefault((x.shape, x.dtype, x.device), []).append(x)
    sums: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for (_, dtype, device), xs in groups.items():
        per = max(1, _CHUNK // xs[0].numel())
        for start in range(0, len(xs), per):
            chunk = xs[start : start + per]
            total = chunk[0].sum() if len(chunk) == 1 else torch.stack(chunk).sum()
            sums.setdefault((dtype, device), []).append(total)
    # one sum (and one host sync) per dtype and device instead of one per group: a round of
    # one client with a small model has about ten groups, each a sync and a few small kernels
    return all(bool(torch.isfinite(torch.stack(part).sum())) for part in sums.values())


class SequentialExecutor(Executor):
    """One client after another in one process: the simplest to read and debug."""

    name = "sequential"

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
        results: dict[int, ClientResult] = {}
        failed: dict[int, str] = {}
        for k in plan.clients:
            gen = client_generator(seed, ctx.round, k)
            try:
                draws = algorithm.draw(ctx, k, int(data[k].size), gen)
                if data[k].x.device.type != "cpu":  # CPU generators' draws meet the device's data
                    draws = to_device(draws, data[k].x.device)
                result = algorithm.client_update(ctx, plan.payload(k), states[k], data[k], draws)
            except FedriskError:
                if on_failure == "raise":  # an earlier NaN reply would have stopped the run first
                    _check_finite(results, ctx.round, on_failure)
                raise
            except Exception as exc:  # a failing client must not silently corrupt the run
                if on_failure == "raise":
                    _check_finite(results, ctx.round, on_failure)
                    raise ClientFailure(f"client {k} failed in round {ctx.round}: {exc!r}") from exc
                failed[k] = repr(exc)
                continue
            results[k] = result
        nonfinite = _check_finite(results, ctx.round, on_failure)
        failed = dict(sorted({**failed, **nonfinite}.items()))  # client order, as checked one by one
        kept = {k: r for k, r in results.items() if k not in nonfinite}
        if not kept:
            raise ClientFailure(f"every client failed in round {ctx.round}: {failed}")
        return RoundOutput(
            InMemoryReplies({k: r.reply for k, r in kept.items()}),
            {k: r.state for k, r in kept.items()},
            {k: r.metrics for k, r in kept.items()},
            failed,
        )


def _check_finite(results: Mapping[int, ClientResult], round: int, on_failure: str) -> dict[int, str]:
    """:func:`check_reply` for every client of ``results`` (in client order): the clients whose
    reply or new state is NaN / inf with the reason, or raises for the first one under
    ``on_failure='raise'``.  One batched sum proves the common all-finite case; clients are
    checked one by one only when it does not (the per-client check costs as much as a local
    step of a small model)."""
    if _provably_finite([t for r in results.values() for t in (r.reply, r.state)]):
        return {}
    out = {}
    for k, r in results.items():
        reason = check_reply(k, round, (r.reply, r.state), on_failure)
        if reason:
            out[k] = reason
    return out
