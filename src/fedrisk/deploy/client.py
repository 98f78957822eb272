"""What a fedrisk ClientApp does with one ``train`` message: decode, ``draw``, ``client_update``, encode.

:func:`client_round` is the whole client side of a round, free of Flower's app machinery so that it
runs (and is tested) on loopback: the message content (:func:`fedrisk.deploy.records.encode` of
the client's payload, with round / client id / seed / round kind) comes in, the reply content
(the reply and the training metrics, same meta) goes out.  The draws come from
``client_generator(seed, round, client)`` exactly as in the simulators' executors, so a client
on a SuperNode computes bit for bit what the sequential executor computes for it.

Example:
    >>> from fedrisk.experiment import resolve_config
    >>> from fedrisk.experiment.assemble import build_simulation
    >>> from fedrisk.algorithms.base import RoundContext
    >>> from fedrisk.rng import server_generator
    >>> sim = build_simulation(resolve_config({"data": {"dataset": "digits", "num_clients": 2}})).simulation
    >>> plan = sim.algorithm.configure(RoundContext(0, sim.info), sim.server_state, server_generator(0, 0, "configure"))
    >>> content = encode(plan.payload(1), Meta(round=0, client=1, seed=0, kind=plan.kind))
    >>> reply, state, meta = client_round(sim.algorithm, sim.info, content, sim.client_states[1], sim.data[1])
    >>> sorted(decode(reply)[0]), meta.client
    (['metrics', 'reply'], 1)
"""

from __future__ import annotations

from typing import Any

from fedrisk.algorithms.base import Algorithm, FedInfo, LocalData, RoundContext
from fedrisk.deploy.records import Meta, decode, encode
from fedrisk.rng import client_generator
from fedrisk.runtime.device import to_device
from fedrisk.tree import Tree


def client_round(
    algorithm: Algorithm, fed: FedInfo, content: Any, state: Tree, data: LocalData
) -> tuple[Any, Tree, Meta]:
    """Run one client's round from a message content; returns ``(reply content, new state, meta)``.

    The reply content holds ``{"reply": ..., "metrics": ...}`` and the request's :class:`Meta`;
    the new state stays on the node (see :mod:`fedrisk.deploy.state`).
    """
    payload, meta = decode(content)
    # messages and a node's kept states are read on the CPU; the node's data say its run.device
    payload, state = to_device(payload, data.x.device), to_device(state, data.x.device)
    ctx = RoundContext(meta.round, fed, meta.kind or "train")
    gen = client_generator(meta.seed, meta.round, meta.client)
    draws = to_device(algorithm.draw(ctx, meta.client, int(data.size), gen), data.x.device)
    result = algorithm.client_update(ctx, payload, state, data, draws)
    return encode({"reply": result.reply, "metrics": result.metrics}, meta), result.state, meta
