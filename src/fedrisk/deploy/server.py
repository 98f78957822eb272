"""The server side of a round over Flower messages, as an executor.

:class:`MessageExecutor` is a :class:`~fedrisk.runtime.executor.Executor` whose ``run_round``
encodes each selected client's payload into a message content
(:func:`~fedrisk.deploy.records.encode`, message type :func:`~fedrisk.deploy.records.message_type`
of the round kind), hands all of them to :meth:`MessageExecutor.exchange` and checks what comes
back with the hardening policy of the simulators (``run.on_client_failure``): an error reply, a
silent client, a reply for another round or client, or a NaN / inf reply stops the round under
``"raise"`` and is dropped (and named in ``failed``) under ``"skip"``.  Everything else of the run
(``configure``, attacks, ``aggregate``, evaluation, checkpoints) stays in
:class:`~fedrisk.runtime.simulation.Simulation`, unchanged.

:meth:`~MessageExecutor.exchange` is the transport: :class:`LoopbackExecutor` runs
:func:`fedrisk.deploy.client.client_round` in-process on the serialised bytes (the tests' stand-in
for SuperNodes); the Flower ServerApp will send through its ``Grid`` and match replies by
``reply_to_message_id``.

Example:
    >>> from fedrisk.experiment import resolve_config
    >>> from fedrisk.experiment.assemble import build_simulation
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 2}, "run": {"rounds": 2}})
    >>> sim = build_simulation(cfg, executor=LoopbackExecutor()).simulation
    >>> sim.step().clients
    [0, 1]
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.algorithms.base import Algorithm, LocalData, RoundContext, RoundPlan
from fedrisk.deploy.records import Meta, decode, encode, message_type
from fedrisk.runtime.device import plan_device, to_device
from fedrisk.runtime.executor import ClientFailure, Executor, RoundOutput, check_reply
from fedrisk.tree import Tree


class Unavailable(str):
    """An answer of :meth:`MessageExecutor.exchange` for a client that was not asked this round
    because its node is known to be gone (the text says since when and what brings it back)."""


class MessageExecutor(Executor):
    """Runs a round by exchanging one message per selected client (see the module docstring).

    Args:
        experiment: the config fingerprint written into every message (nodes check it).
        session: the deployed run's key of the nodes' client states, written into every message.
    """

    name = "messages"

    def __init__(self, experiment: str = "", session: str = "") -> None:
        self.experiment, self.session = experiment, session
        self.on_failure = "raise"

    @abstractmethod
    def exchange(
        self, requests: Mapping[int, tuple[str, Any]], ctx: RoundContext, states: Mapping[int, Tree]
    ) -> dict[int, Any]:
        """Send ``{client: (message type, content)}``; return ``{client: reply content}`` for the
        clients that answered, an error text (``str``) for those that answered with an error,
        an :class:`Unavailable` text for those not asked (their node is gone) and nothing for
        silent ones (:attr:`on_failure` is the round's failure policy).  ``states`` are the
        simulation's client states (transports that keep client states on the server side read
        them and fill :attr:`states`)."""

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
        kind = message_type(ctx.kind)
        home = plan_device(plan, data[0].x.device if data else torch.device("cpu"))
        requests = {
            k: (kind, encode(plan.payload(k), Meta(ctx.round, k, seed, ctx.kind, self.experiment, self.session)))
            for k in plan.clients
        }
        self.states: dict[int, Tree] = {}
        self.on_failure = on_failure
        answers = self.exchange(requests, ctx, states)
        replies: dict[int, Any] = {}
        metrics: dict[int, Any] = {}
        failed: dict[int, str] = {}
        for k in plan.clients:
            reason = None
            answer = answers.get(k)
            if answer is None:
                reason = f"client {k} did not reply in round {ctx.round}"
            elif isinstance(answer, Unavailable):
                reason = f"client {k} was not asked in round {ctx.round}: {answer}"
            elif isinstance(answer, str):
                reason = f"client {k} replied with an error in round {ctx.round}: {answer}"
            else:
                tree, meta = decode(answer)
                tree = to_device(tree, home)  # messages arrive on the CPU; the server's run.device
                if (meta.round, meta.client) != (ctx.round, k):
                    reason = f"client {k}'s reply is for round {meta.round}, client {meta.client} (round {ctx.round})"
                else:
                    reason = check_reply(k, ctx.round, tree["reply"], on_failure)
            if reason is not None:
                if on_failure == "raise":
                    raise ClientFailure(reason + " (set on_client_failure='skip' to drop such replies)")
                failed[k] = reason
                continue
            replies[k], metrics[k] = tree["reply"], tree["metrics"]
        if not replies:
            raise ClientFailure(f"every client failed in round {ctx.round}: {failed}")
        kept_states = {k: s for k, s in self.states.items() if k in replies}
        return RoundOutput(InMemoryReplies(replies), kept_states, metrics, failed)


class LoopbackExecutor(MessageExecutor):
    """Every message goes through Flower's protobuf bytes to :func:`~fedrisk.deploy.client.client_round`
    in this process; client states come back to the simulation as with the sequential executor."""

    name = "loopback"

    def prepare(self, algorithm: Algorithm, data: Sequence[LocalData]) -> None:
        self._algorithm, self._data = algorithm, data

    def exchange(
        self, requests: Mapping[int, tuple[str, Any]], ctx: RoundContext, states: Mapping[int, Tree]
    ) -> dict[int, Any]:
        from fedrisk.deploy.client import client_round

        out: dict[int, Any] = {}
        for k, (_, content) in requests.items():
            try:
                reply, state, _ = client_round(self._algorithm, ctx.fed, wire(content), states[k], self._data[k])
            except Exception as exc:  # an error reply, as a node would send it
                out[k] = repr(exc)
                continue
            self.states[k] = state
            out[k] = wire(reply)
        return out


def wire(content: Any) -> Any:
    """``content`` after Flower's protobuf serialisation to bytes and back (what a peer receives)."""
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    proto = ProtoRecordDict()
    proto.ParseFromString(recorddict_to_proto(content).SerializeToString())
    return recorddict_from_proto(proto)
