"""fedrisk's Flower ServerApp and ClientApp: the same algorithm object, run on Flower's deployment engine.

A fedrisk Flower app is a directory that ``fedrisk deploy run`` writes (:func:`fedrisk.deploy.commands.write_app`): a
``pyproject.toml`` naming the components, the experiment's resolved config
(``experiment.toml``) and a two-line module ``fedrisk_app.py``::

    server_app = fedrisk.deploy.apps.server_app_for(HERE / "experiment.toml")
    client_app = fedrisk.deploy.apps.FedriskClientApp(HERE / "experiment.toml")

``flwr run`` ships the directory to the SuperLink and every SuperNode (Flower's FAB), so server
and nodes read the same config.

**ServerApp** (:func:`server_main`).  Before the first round it sends every connected node one
``query.fedrisk_handshake`` message and maps Flower's node ids to fedrisk client ids
(:func:`fedrisk.deploy.handshake.client_map`).  Then it runs
:func:`fedrisk.experiment.runner.run_experiment` (outputs, evaluation, tracking, summary exactly
as ``fedrisk run``) with a :class:`FlowerExecutor`: in every round ``configure`` chooses the
clients, each selected client's payload goes to its node as one ``train[.<kind>]`` message
(:mod:`fedrisk.deploy.records`), the replies are matched to the requests by
``reply_to_message_id`` and checked with the failure policy
(:class:`~fedrisk.deploy.server.MessageExecutor`), and ``aggregate`` runs on the server.

**ClientApp** (:class:`FedriskClientApp`).  A ``train`` message runs ``draw`` + ``client_update``
through :func:`fedrisk.deploy.client.client_round` on the node's partition (``partition-id`` of
its node config), with the client's state read from and written to the node-local
:class:`~fedrisk.deploy.state.ClientStateStore` (node config ``state-dir``), so control variates
and personal weights survive a SuperNode restart; an exception becomes Flower's error reply.

Flower polls: a SuperNode asks the SuperLink for work every 3 s when idle and starts a fresh
ClientApp process per message; fedrisk's own reply loop (:meth:`FlowerExecutor.exchange`) polls
every :data:`POLL_SECONDS` instead of the 3 s of ``Grid.send_and_receive``.

Example:
    >>> import tempfile
    >>> from fedrisk.deploy.commands import write_app
    >>> from fedrisk.experiment import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 2}})
    >>> app_dir = write_app(tempfile.mkdtemp(), cfg.to_toml(), "demo")
    >>> sorted(p.name for p in app_dir.iterdir())
    ['experiment.toml', 'fedrisk_app.py', 'pyproject.toml']
    >>> isinstance(FedriskClientApp(app_dir / "experiment.toml"), ClientApp)
    True
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrisk.deploy import require_flwr
from fedrisk.deploy.handshake import (
    ACTION,
    PARTITION_ID,
    as_int,
    client_map,
    fingerprint,
    handshake_reply,
    handshake_request,
)
from fedrisk.deploy.node import node_round, node_setup, state_root
from fedrisk.deploy.records import message_type
from fedrisk.deploy.server import MessageExecutor
from fedrisk.errors import FedriskError

require_flwr()
from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

POLL_SECONDS = 0.2
"""How often the ServerApp asks the SuperLink for replies (Flower's ``send_and_receive``: 3 s)."""
HANDSHAKE = "fedrisk.handshake"
NODE_UNAVAILABLE = 5
"""Flower's error code (``flwr.common.constant.ErrorCode``) of a reply the SuperLink writes for a
node that went offline (heartbeats missed, or the node stopped) before answering."""


def load_app_config(path: str | Path) -> Any:
    """The experiment config of an app directory (``experiment.toml``)."""
    from fedrisk.experiment.config import load_config

    return load_config(path, [])


# ============================================================================= server


class FlowerExecutor(MessageExecutor):
    """Runs a round over Flower's ``Grid``: one message per selected client to the node that serves it.

    Args:
        grid: the ServerApp's grid.
        experiment: the config fingerprint (:func:`fedrisk.deploy.handshake.fingerprint`).
        num_clients: ``data.num_clients``.
        timeout: seconds to wait for a round's replies; a node silent that long is dropped per
            the failure policy (a node Flower's heartbeats mark offline answers with an error sooner).
        connect_timeout: seconds to wait for ``num_clients`` nodes to connect and answer the handshake.
    """

    name = "flower"

    def __init__(
        self, grid: Grid, experiment: str, num_clients: int, *, timeout: float = 600.0, connect_timeout: float = 120.0
    ) -> None:
        super().__init__(experiment)
        self.grid, self.num_clients = grid, num_clients
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.node_of: dict[int, int] = {}

    def _send(self, messages: list[Any], timeout: float) -> list[Any]:
        """Push ``messages``; per message its reply (matched by ``reply_to_message_id``), or None
        when none came within ``timeout``."""
        ids = list(self.grid.push_messages(messages))
        pending, replies = {i for i in ids if i}, {}
        end = time.monotonic() + timeout
        while pending and time.monotonic() < end:
            for reply in self.grid.pull_messages(list(pending)):
                replies[reply.metadata.reply_to_message_id] = reply
                pending.discard(reply.metadata.reply_to_message_id)
            if pending:
                time.sleep(POLL_SECONDS)
        return [replies.get(i) for i in ids]

    def connect(self, lost: frozenset[int] = frozenset()) -> dict[int, int]:
        """The handshake: ``{node id: client id}`` once every client has a node (see
        :mod:`fedrisk.deploy.handshake`), leaving out the ``lost`` node ids; raises a
        :class:`FedriskError` naming what is wrong."""
        end = time.monotonic() + self.connect_timeout
        nodes: list[int] = []
        while time.monotonic() < end:
            nodes = sorted(n for n in self.grid.get_node_ids() if n not in lost)
            if len(nodes) >= self.num_clients:
                break
            time.sleep(POLL_SECONDS)
        if len(nodes) < self.num_clients:
            raise FedriskError(
                f"{len(nodes)} SuperNode(s) connected within {self.connect_timeout:g} s, the config has "
                f"{self.num_clients} clients; start one SuperNode per client (fedrisk deploy supernode)"
            )
        request = ConfigRecord(handshake_request(self.experiment, self.num_clients))
        messages = [Message(RecordDict({HANDSHAKE: request}), n, message_type(ACTION, "query")) for n in nodes]
        replies = self._send(messages, max(end - time.monotonic(), 30.0))
        answers: dict[int, Mapping[str, Any]] = {}
        errors = []
        for node, reply in zip(nodes, replies):
            if reply is None:
                continue
            if reply.has_error():
                errors.append(f"node {node}: {reply.error.reason}")
            else:
                answers[node] = dict(reply.content[HANDSHAKE])
        problems = errors + [f"node {n} did not answer" for n, r in zip(nodes, replies) if r is None]
        try:  # nodes that failed the handshake are left out when the others serve every client
            mapping = client_map(answers, num_clients=self.num_clients, experiment=self.experiment)
        except FedriskError as exc:
            raise FedriskError("; ".join([str(exc), *problems])) from None
        self.node_of = {client: node for node, client in mapping.items()}
        return mapping

    def exchange(self, requests: Mapping[int, tuple[str, Any]], ctx: Any, states: Mapping[int, Any]) -> dict[int, Any]:
        connected = set(self.grid.get_node_ids())
        if not self.node_of or any(self.node_of[k] not in connected for k in requests):
            self.connect()  # the first round, or a SuperNode restarted (a new node id): handshake again
        replies = self._round(requests, list(requests), ctx)
        lost = [k for k, r in replies.items() if r is not None and r.has_error() and r.error.code == NODE_UNAVAILABLE]
        if lost:  # a node went away after the message was sent: once it is back (restarted), send again
            try:
                self.connect(frozenset(self.node_of[k] for k in lost))
            except FedriskError:
                pass  # not back: the error replies go to the failure policy
            else:
                replies.update(self._round(requests, lost, ctx))
        out: dict[int, Any] = {}
        for k, reply in replies.items():
            if reply is None:
                continue  # silent: MessageExecutor names it
            out[k] = f"{reply.error.code}: {reply.error.reason}" if reply.has_error() else reply.content
        return out

    def _round(self, requests: Mapping[int, tuple[str, Any]], clients: list[int], ctx: Any) -> dict[int, Any]:
        messages = [
            Message(requests[k][1], self.node_of[k], requests[k][0], group_id=str(ctx.round), ttl=self.timeout)
            for k in clients
        ]
        return dict(zip(clients, self._send(messages, self.timeout)))


def server_main(grid: Grid, context: Context, config_path: str | Path) -> None:
    """The ServerApp's main loop (run config keys: ``out``, ``overwrite``, ``round-timeout``,
    ``connect-timeout``)."""
    from fedrisk.experiment.runner import run_experiment

    cfg = load_app_config(config_path)
    rc = context.run_config
    executor = FlowerExecutor(
        grid,
        fingerprint(cfg.semantic()),
        cfg["data.num_clients"],
        timeout=float(rc.get("round-timeout", 600.0)),
        connect_timeout=float(rc.get("connect-timeout", 120.0)),
    )
    mapping = executor.connect()
    print(f"fedrisk: {len(mapping)} node(s) serve clients {sorted(mapping.values())}", flush=True)
    out = str(rc.get("out", "")) or None
    result = run_experiment(cfg, out, overwrite=bool(rc.get("overwrite", False)), progress="plain", executor=executor)
    print(f"fedrisk: finished, outputs in {result.path}", flush=True)


def server_app_for(config_path: str | Path) -> ServerApp:
    """The ServerApp of the experiment in ``config_path``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        server_main(grid, context, config_path)

    return app


# ============================================================================= client


class FedriskClientApp(ClientApp):
    """fedrisk's ClientApp: ``query.fedrisk_handshake`` and ``train[.<kind>]`` messages.

    Every round kind travels as its own ``train.<kind>`` action, so the app routes every
    ``train*`` message itself instead of registering one function per action.
    """

    def __init__(self, config_path: str | Path) -> None:
        super().__init__()
        self.config_path = Path(config_path)

    def __call__(self, message: Message, context: Context) -> Message:
        kind = message.metadata.message_type
        if kind == message_type(ACTION, "query"):
            return self.handshake(message, context)
        if kind == "train" or kind.startswith("train."):
            return self.train_round(message, context)
        raise FedriskError(f"fedrisk's ClientApp got a {kind!r} message; it answers train[.<kind>] and handshakes")

    def handshake(self, message: Message, context: Context) -> Message:
        """Answer with the node's partition and config fingerprint; a node with a valid partition
        id first makes sure its client's setup is kept (:func:`fedrisk.deploy.node.node_setup`), so
        that no round pays for building it."""
        cfg = load_app_config(self.config_path)
        experiment = fingerprint(cfg.semantic())
        answer = handshake_reply(context.node_config, experiment)
        pid = as_int(context.node_config.get(PARTITION_ID))
        same = message.content[HANDSHAKE]["experiment"] == experiment  # else the server names the mismatch
        if same and pid is not None and 0 <= pid < cfg["data.num_clients"]:
            node_setup(cfg, pid, state_root(context.node_config), experiment)
        answer = {k: v for k, v in answer.items() if v is not None}  # a ConfigRecord carries no None
        return Message(RecordDict({HANDSHAKE: ConfigRecord(answer)}), reply_to=message)

    def train_round(self, message: Message, context: Context) -> Message:
        cfg = load_app_config(self.config_path)
        content = node_round(cfg, message.content, context.node_config, context.run_id)
        return Message(content, reply_to=message)
