"""Client identity: mapping Flower's random node ids to fedrisk client ids.

Flower names each SuperNode by a random 64-bit node id that changes with every start; fedrisk's
client ``i`` is the partition ``i`` of the federation (its data, its persistent state, its seed
stream).  Each SuperNode is therefore started with its partition in the node config
(``flower-supernode --node-config "partition-id=3 num-partitions=8"``, Flower's own convention).
Before the first round the ServerApp sends every connected node one ``query.fedrisk_handshake``
message whose content is :func:`handshake_request`; each node answers with
:func:`handshake_reply` (its partition id, the number of partitions it was told, and the
experiment fingerprint it computed from its own copy of the config), and :func:`client_map`
checks the answers and returns ``{node id: client id}``.

Refused, with a :class:`~fedrisk.errors.FedriskError` naming the nodes: a node without
``partition-id``, a partition id outside ``0 .. num_clients-1`` or given twice, a node told a
different number of partitions, a node whose config fingerprint (algorithm and every key that
changes the numbers) differs from the server's, and (with ``require_all``) clients no node serves.

Example:
    >>> fp = fingerprint({"algorithm.name": "fedavg", "algorithm.lr": 0.1})
    >>> replies = {901: handshake_reply({"partition-id": 1, "num-partitions": 2}, fp),
    ...            517: handshake_reply({"partition-id": 0, "num-partitions": 2}, fp)}
    >>> client_map(replies, num_clients=2, experiment=fp)
    {517: 0, 901: 1}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fedrisk.errors import FedriskError

ACTION = "fedrisk_handshake"
"""The handshake's Flower message type is ``query.fedrisk_handshake``."""
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"


def fingerprint(semantic: Mapping[str, Any]) -> str:
    """A short hash of a config's semantic keys (``ExperimentConfig.semantic()``): server and nodes
    must agree on it.

    Example:
        >>> fingerprint({"a": 1}) == fingerprint({"a": 1}), fingerprint({"a": 1}) == fingerprint({"a": 2})
        (True, False)
    """
    text = json.dumps(dict(semantic), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def handshake_request(experiment: str, num_clients: int) -> dict[str, Any]:
    """The server's question (the values of the ``ConfigRecord`` it sends)."""
    return {"experiment": experiment, "num_clients": num_clients}


def handshake_reply(node_config: Mapping[str, Any], experiment: str) -> dict[str, Any]:
    """A node's answer from its node config (``Context.node_config``) and its own fingerprint;
    ``partition-id`` and ``num-partitions`` are passed on as given (:func:`client_map` checks them)."""
    return {
        PARTITION_ID: node_config.get(PARTITION_ID, None),
        NUM_PARTITIONS: node_config.get(NUM_PARTITIONS, None),
        "experiment": experiment,
    }


def as_int(value: Any) -> int | None:
    """``value`` as a partition id (an int or a string of digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def client_map(
    replies: Mapping[int, Mapping[str, Any]], *, num_clients: int, experiment: str, require_all: bool = True
) -> dict[int, int]:
    """``{node id: client id}`` from the handshake replies, sorted by client id.

    Args:
        replies: node id -> the node's :func:`handshake_reply`.
        num_clients: the federation's number of clients (``data.num_clients``).
        experiment: the server's :func:`fingerprint`.
        require_all: every client must be served by a node.
    """
    errors: list[str] = []
    owner: dict[int, int] = {}
    for node, reply in sorted(replies.items()):
        raw = reply.get(PARTITION_ID)
        pid = as_int(raw)
        if raw is None:
            errors.append(f'node {node} was started without {PARTITION_ID} (--node-config "{PARTITION_ID}=I")')
            continue
        if pid is None or not 0 <= pid < num_clients:
            errors.append(f"node {node} has {PARTITION_ID} = {raw!r}; allowed: an integer in 0 .. {num_clients - 1}")
            continue
        told = reply.get(NUM_PARTITIONS)
        if told is not None and as_int(told) != num_clients:
            errors.append(f"node {node} was started with {NUM_PARTITIONS} = {told!r}, the config has {num_clients}")
        if reply.get("experiment") != experiment:
            errors.append(
                f"node {node} runs another config (fingerprint {reply.get('experiment')!r}, server {experiment!r}): "
                "start every node with the server's config file"
            )
        if pid in owner:
            errors.append(f"nodes {owner[pid]} and {node} both have {PARTITION_ID} = {pid}")
            continue
        owner[pid] = node
    if require_all and not errors:
        unserved = [c for c in range(num_clients) if c not in owner]
        if unserved:
            errors.append(f"no node serves client(s) {unserved} of {num_clients}; start a SuperNode for each")
    if errors:
        raise FedriskError("client handshake failed: " + "; ".join(errors))
    return {node: pid for pid, node in sorted(owner.items())}
