"""What a SuperNode does with a ``train`` message, and the setup it keeps on its disk between messages.

Flower 1.41 runs every message in a fresh ClientApp process (``flwr-clientapp``), so nothing a
message computed survives in memory.  Rebuilding the config's federation for every message (load
the dataset, partition it for *every* client, build model and algorithm) to use one client's
partition cost about 5 s of a 12-14 s message on a loaded 2-core machine.  A node therefore keeps
its client's **setup** in its node-local store (node config ``state-dir``)::

    ROOT/<experiment>/setup-client-<id>.pt

holding the client's partition (:class:`~fedrisk.algorithms.base.LocalData` tensors, after
``run.dtype`` and any data attack), the :class:`~fedrisk.algorithms.base.FedInfo`, the client's
initial state (``init_client``) and the resolved model spec (input shape, number of outputs,
objective).  ``<experiment>`` is the config fingerprint (:func:`fedrisk.deploy.handshake.fingerprint`,
a hash of every key that changes the numbers), so a node never reads the setup of another config.
The first message that needs it (the handshake, before round 0) builds it once with
:func:`~fedrisk.experiment.assemble.build_simulation`; every later message loads only its own
partition and rebuilds the algorithm object from the config without any dataset
(:func:`~fedrisk.experiment.assemble.build_algorithm`).  The file is written with
:func:`~fedrisk.experiment.checkpoint.write_checkpoint` and read with the restricted unpickler
(tensors and plain containers only); a damaged file or one of another :data:`SETUP_VERSION` is
rebuilt.  A loaded setup computes what a built one computes, bit for bit (same tensors, same
algorithm object).

:func:`node_round` is the whole node side of a ``train`` message: check the message is for this
node's partition and config, load the setup and the client's kept state
(:class:`~fedrisk.deploy.state.ClientStateStore`), run :func:`~fedrisk.deploy.client.client_round`,
keep the new state.  The states are keyed by the config fingerprint and the deployed run's
session (:attr:`fedrisk.deploy.records.Meta.session`, kept in the run directory, so a resumed
run finds them; Flower's run id when a message carries none).  A round the node already finished
(sent again after a restart, or by a server resumed from its checkpoint) starts from the state
kept before it.

Example:
    >>> import tempfile
    >>> from fedrisk.experiment import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 2}, "model": {"name": "logreg"}})
    >>> root = tempfile.mkdtemp()
    >>> first = node_setup(cfg, 1, root)          # built from the dataset, then kept
    >>> again = node_setup(cfg, 1, root)          # loaded: this client's partition only
    >>> first.built, again.built, bool((first.data.x == again.data.x).all()), again.info == first.info
    (True, False, True, True)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedrisk.algorithms.base import Algorithm, FedInfo, LocalData
from fedrisk.errors import FedriskError
from fedrisk.experiment.checkpoint import CheckpointError, load_newest, previous_path, write_checkpoint
from fedrisk.tree import Tree

SETUP_VERSION = 1
"""The layout of a setup file; a file of another version is rebuilt."""
STATE_DIR = "state-dir"
"""Node config key: the node's store (client states and setups; default :data:`DEFAULT_STATE_DIR`)."""
DEFAULT_STATE_DIR = "~/.fedrisk/node-state"


@dataclass
class NodeSetup:
    """What a node needs to run its client's rounds (``built``: made from the dataset now, not loaded)."""

    algorithm: Algorithm
    info: FedInfo
    data: LocalData
    initial_state: Tree
    built: bool


def state_root(node_config: Mapping[str, Any]) -> Path:
    """The node's store directory (node config ``state-dir``, ``~`` expanded)."""
    return Path(str(node_config.get(STATE_DIR, "") or DEFAULT_STATE_DIR)).expanduser()


def setup_path(root: str | Path, experiment: str, client: int) -> Path:
    """Where a node keeps ``client``'s setup for ``experiment`` (names checked as the state store does)."""
    from fedrisk.deploy.state import ClientStateStore

    return ClientStateStore(root).path(experiment, client).with_name(f"setup-client-{client}.pt")


def node_setup(cfg: Any, client: int, root: str | Path, experiment: str | None = None) -> NodeSetup:
    """``client``'s setup for the config ``cfg``: loaded from ``root`` when kept there, else built
    from the dataset and kept (see the module docstring)."""
    from fedrisk.deploy.handshake import fingerprint

    experiment = experiment or fingerprint(cfg.semantic())
    path = setup_path(root, experiment, client)
    if path.exists() or previous_path(path).exists():
        try:
            return _load(cfg, client, experiment, path)
        except (CheckpointError, KeyError, TypeError, ValueError) as exc:
            warnings.warn(f"{path}: {exc}; building the setup again", stacklevel=2)
    return _build(cfg, client, experiment, path)


def _build(cfg: Any, client: int, experiment: str, path: Path) -> NodeSetup:
    from fedrisk.experiment.assemble import build_simulation, run_seed

    num_clients = cfg["data.num_clients"]
    if not 0 <= client < num_clients:
        raise FedriskError(f"client {client} is out of range; allowed: 0 .. {num_clients - 1} (data.num_clients)")
    built = build_simulation(cfg, run_seed(cfg))
    sim, resolved = built.simulation, built.resolved
    data, state = sim.data[client], sim.client_states[client]
    payload = {
        "version": SETUP_VERSION,
        "experiment": experiment,
        "client": client,
        "model": [list(resolved["input_shape"]), int(resolved["num_outputs"]), str(resolved["objective"])],
        "info": [sim.info.num_clients, list(sim.info.client_sizes), sim.info.num_classes,
                 [list(c) for c in sim.info.class_counts]],
        "data": {"x": data.x, "y": data.y, "size": data.size, "attrs": dict(data.attrs)},
        "state": state,
    }  # fmt: skip
    try:
        write_checkpoint(path, payload, round=-1, client=client)
    except OSError as exc:
        raise FedriskError(
            f"the node cannot keep client {client}'s setup under {path.parent} ({exc}); start the SuperNode with "
            "a writable state directory (fedrisk deploy supernode --state-dir DIR)"
        ) from None
    return NodeSetup(sim.algorithm, sim.info, data, state, built=True)


def _load(cfg: Any, client: int, experiment: str, path: Path) -> NodeSetup:
    from fedrisk.experiment.assemble import build_algorithm

    payload, _ = load_newest(path)
    if payload.get("version") != SETUP_VERSION:
        raise ValueError(f"setup version {payload.get('version')!r}, this fedrisk writes {SETUP_VERSION}")
    if payload.get("experiment") != experiment or payload.get("client") != client:
        raise ValueError(f"the file is client {payload.get('client')!r}'s of experiment {payload.get('experiment')!r}")
    input_shape, num_outputs, objective = payload["model"]
    algorithm, _ = build_algorithm(cfg, tuple(int(d) for d in input_shape), int(num_outputs), str(objective))
    num, sizes, num_classes, counts = payload["info"]
    info = FedInfo(
        int(num), tuple(int(s) for s in sizes), int(num_classes), tuple(tuple(int(c) for c in row) for row in counts)
    )
    d = payload["data"]
    data = LocalData(d["x"], d["y"], d["size"], dict(d["attrs"]))
    return NodeSetup(algorithm, info, data, payload["state"], built=False)


def node_round(cfg: Any, content: Any, node_config: Mapping[str, Any], run_id: int = 0) -> Any:
    """The node side of one ``train`` message (its content; the reply content comes back): the
    client's setup (:func:`node_setup`) and kept state, :func:`~fedrisk.deploy.client.client_round`,
    the new state kept.  Refuses a message for another partition or another config."""
    from fedrisk.deploy.client import client_round
    from fedrisk.deploy.handshake import fingerprint
    from fedrisk.deploy.records import decode
    from fedrisk.deploy.state import ClientStateStore

    if cfg["run.threads"]:
        torch.set_num_threads(cfg["run.threads"])
    experiment = fingerprint(cfg.semantic())
    _, meta = decode(content)
    partition = node_config.get("partition-id")
    if str(partition) != str(meta.client):
        raise FedriskError(f"a message for client {meta.client} reached the node with partition-id {partition!r}")
    if meta.experiment != experiment:
        raise FedriskError(f"the message is for experiment {meta.experiment!r}; this node runs {experiment!r}")
    root = state_root(node_config)
    setup = node_setup(cfg, meta.client, root, experiment)
    store = ClientStateStore(root)
    key = f"{experiment}-{meta.session}" if meta.session else f"{experiment}-run{run_id}"
    kept = store.load(key, meta.client)
    again = kept is not None and kept[0] >= meta.round  # sent again: after a restart, or by a resumed server
    if again:
        kept = store.state_before(key, meta.client, meta.round)
    state = setup.initial_state if kept is None else kept[1]
    reply, new_state, _ = client_round(setup.algorithm, setup.info, content, state, setup.data)
    if again:
        store.discard_newest(key, meta.client)
    store.save(key, meta.client, meta.round, new_state)
    return reply
