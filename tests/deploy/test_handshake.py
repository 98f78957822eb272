"""The client-id handshake: node ids -> partition ids, and every refusal."""

from __future__ import annotations

import pytest

from fedrisk.deploy.handshake import client_map, fingerprint, handshake_reply
from fedrisk.errors import FedriskError

FP = fingerprint({"algorithm.name": "scaffold", "algorithm.lr": 0.05})


def reply(pid, n=3, fp=FP):
    config = {} if pid is None else {"partition-id": pid}
    if n is not None:
        config["num-partitions"] = n
    return handshake_reply(config, fp)


def test_random_node_ids_map_to_partitions():
    replies = {2**63 - 5: reply(2), 12: reply(0), 7_000_000_001: reply(1)}
    assert client_map(replies, num_clients=3, experiment=FP) == {12: 0, 7_000_000_001: 1, 2**63 - 5: 2}
    assert client_map({4: reply("1", n="3")}, num_clients=3, experiment=FP, require_all=False) == {4: 1}


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        ({1: reply(None), 2: reply(1), 3: reply(2)}, r"node 1 was started without partition-id"),
        ({1: reply(0), 2: reply(0), 3: reply(2)}, r"nodes 1 and 2 both have partition-id = 0"),
        ({1: reply(0), 2: reply(3), 3: reply(2)}, r"node 2 has partition-id = 3; allowed: an integer in 0 \.\. 2"),
        ({1: reply(0), 2: reply("x"), 3: reply(2)}, r"node 2 has partition-id = 'x'"),
        ({1: reply(0), 2: reply(1, n=4), 3: reply(2)}, r"node 2 was started with num-partitions = 4, the config has 3"),
        ({1: reply(0), 2: reply(1, fp="other"), 3: reply(2)}, r"node 2 runs another config"),
        ({1: reply(0), 3: reply(2)}, r"no node serves client\(s\) \[1\] of 3"),
    ],
)
def test_bad_handshakes_name_the_node(replies, message):
    with pytest.raises(FedriskError, match="client handshake failed: .*" + message):
        client_map(replies, num_clients=3, experiment=FP)


def test_the_fingerprint_follows_the_semantic_config():
    from fedrisk.experiment import resolve_config

    base = {"data": {"dataset": "digits", "num_clients": 3}, "algorithm": {"name": "fedavg"}}
    a = resolve_config(base)
    assert fingerprint(a.semantic()) == fingerprint(resolve_config(base, ["run.threads=2"]).semantic())
    assert fingerprint(a.semantic()) != fingerprint(resolve_config(base, ["algorithm.lr=0.5"]).semantic())
    assert fingerprint(a.semantic()) != fingerprint(resolve_config(base, ["algorithm.name=fedprox"]).semantic())
