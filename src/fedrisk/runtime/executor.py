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

from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import Algorithm, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError
from fedrisk.rng import client_generator
from fedrisk.tree import Tree, tree_all_finite

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


def check_reply(client: int, round: int, reply: Any, on_failure: str) -> str | None:
    """Return a failure reason for a non-finite reply or new client state (or raise when
    ``on_failure='raise'``)."""
    if tree_all_finite(reply):
        return None
    reason = f"client {client} replied with NaN/inf values in round {round} (reply or new client state)"
    if on_failure == "raise":
        raise ClientFailure(reason + " (set on_client_failure='skip' to drop such replies)")
    return reason


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
        replies: dict[int, dict[str, Any]] = {}
        new_states: dict[int, Tree] = {}
        metrics: dict[int, dict[str, Tensor]] = {}
        failed: dict[int, str] = {}
        for k in plan.clients:
            gen = client_generator(seed, ctx.round, k)
            try:
                draws = algorithm.draw(ctx, k, int(data[k].size), gen)
                result = algorithm.client_update(ctx, plan.payload(k), states[k], data[k], draws)
            except FedriskError:
                raise
            except Exception as exc:  # a failing client must not silently corrupt the run
                if on_failure == "raise":
                    raise ClientFailure(f"client {k} failed in round {ctx.round}: {exc!r}") from exc
                failed[k] = repr(exc)
                continue
            reason = check_reply(k, ctx.round, (result.reply, result.state), on_failure)
            if reason:
                failed[k] = reason
                continue
            replies[k] = result.reply
            new_states[k] = result.state
            metrics[k] = result.metrics
        if not replies:
            raise ClientFailure(f"every client failed in round {ctx.round}: {failed}")
        return RoundOutput(InMemoryReplies(replies), new_states, metrics, failed)
