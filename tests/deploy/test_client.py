"""The ClientApp's round on loopback: every payload and reply goes through Flower's records and
their protobuf bytes, and the run ends with the sequential executor's model bit for bit."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.deploy.client import client_round
from fedrisk.deploy.records import Meta, decode, encode
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.executor import Executor, RoundOutput

from .test_records import over_the_wire, same


class RecordLoopback(Executor):
    """Each selected client's payload is encoded, serialised, parsed and handed to
    :func:`client_round`; its reply comes back the same way (what the ServerApp will do per node)."""

    name = "record_loopback"

    def run_round(self, algorithm, ctx, plan, states, data, seed, on_failure="raise"):
        replies, new_states, metrics = {}, {}, {}
        for k in plan.clients:
            content = over_the_wire(encode(plan.payload(k), Meta(round=ctx.round, client=k, seed=seed, kind=ctx.kind)))
            reply, state, _ = client_round(algorithm, ctx.fed, content, states[k], data[k])
            tree, meta = decode(over_the_wire(reply))
            assert (meta.round, meta.client) == (ctx.round, k)
            replies[k], new_states[k], metrics[k] = tree["reply"], state, tree["metrics"]
        return RoundOutput(InMemoryReplies(replies), new_states, metrics, {})


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "fedavg", "local_steps": 3},
        {"name": "scaffold", "local_steps": 3},
        {"name": "perm", "local_steps": 2, "warmup_rounds": 1},
    ],
    ids=lambda a: a["name"],
)
def test_records_loopback_equals_the_sequential_executor_bit_for_bit(algorithm):
    raw = {"data": {"dataset": "digits", "num_clients": 3}, "model": {"name": "logreg"}, "algorithm": algorithm,
           "run": {"rounds": 6, "seed": 3}}  # fmt: skip
    cfg = resolve_config(raw)
    seq = build_simulation(cfg, 3).simulation
    loop = build_simulation(cfg, 3, executor=RecordLoopback()).simulation
    kinds = set()
    for _ in range(6):
        a, b = seq.step(), loop.step()
        kinds.add(a.kind)
        assert a.train_metrics == b.train_metrics and a.bytes_up == b.bytes_up
    assert same(seq.server_state, loop.server_state)
    assert all(same(seq.client_states[k], loop.client_states[k]) for k in range(3))
    if algorithm["name"] == "perm":
        assert len(kinds) > 1  # PERM's estimation rounds travel as their own kind
