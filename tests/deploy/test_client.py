"""The client and server sides of a round on loopback: every payload and reply goes through
Flower's records and their protobuf bytes, the run ends with the sequential executor's model bit
for bit, and bad replies are dropped or stop the round per the failure policy."""

from __future__ import annotations

import math
import re

import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

from fedrisk.deploy.records import Meta, decode, encode
from fedrisk.deploy.server import LoopbackExecutor
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.executor import ClientFailure
from fedrisk.tree import tree_leaves

from .test_records import same


def config(algorithm, **run):
    raw = {"data": {"dataset": "digits", "num_clients": 3}, "model": {"name": "logreg"}, "algorithm": algorithm,
           "run": {"rounds": 6, "seed": 3, **run}}  # fmt: skip
    return resolve_config(raw)


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
    cfg = config(algorithm)
    seq = build_simulation(cfg, 3).simulation
    loop = build_simulation(cfg, 3, executor=LoopbackExecutor()).simulation
    kinds = set()
    for _ in range(6):
        a, b = seq.step(), loop.step()
        kinds.add(a.kind)
        assert a.train_metrics == b.train_metrics and a.bytes_up == b.bytes_up and a.clients == b.clients
    assert same(seq.server_state, loop.server_state)
    assert all(same(seq.client_states[k], loop.client_states[k]) for k in range(3))
    if algorithm["name"] == "perm":
        assert len(kinds) > 1  # PERM's estimation rounds travel as their own kind


class Faulty(LoopbackExecutor):
    """Client 1 misbehaves in round 1 in the way ``fault`` says."""

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault

    def exchange(self, requests, ctx, states):
        out = super().exchange(requests, ctx, states)
        if ctx.round != 1:
            return out
        if self.fault == "silent":
            del out[1]
        elif self.fault == "error":
            out[1] = "RuntimeError('out of memory')"
        elif self.fault == "stale":
            tree, meta = decode(out[1])
            out[1] = encode(tree, Meta(0, 1, meta.seed, meta.kind))
        elif self.fault == "nan":
            tree, meta = decode(out[1])
            next(t for t in tree_leaves(tree["reply"]) if torch.is_tensor(t)).view(-1)[0] = math.nan
            out[1] = encode(tree, meta)
        return out


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("silent", r"client 1 did not reply in round 1"),
        ("error", r"client 1 replied with an error in round 1: RuntimeError\('out of memory'\)"),
        ("stale", r"client 1's reply is for round 0, client 1 \(round 1\)"),
        ("nan", r"client 1 replied with NaN/inf values in round 1"),
    ],
)
def test_bad_replies_follow_the_failure_policy(fault, message):
    algorithm = {"name": "fedavg", "local_steps": 2}
    sim = build_simulation(config(algorithm), 3, executor=Faulty(fault)).simulation
    sim.step()
    with pytest.raises(ClientFailure, match=message + r".*on_client_failure='skip'"):
        sim.step()
    sim = build_simulation(config(algorithm, on_client_failure="skip"), 3, executor=Faulty(fault)).simulation
    sim.step()
    report = sim.step()
    assert report.clients == [0, 2] and list(report.failed) == [1]
    assert re.match(message, report.failed[1])
