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

**ClientApp** (:class:`FedriskClientApp`).  The handshake also makes sure the node keeps its
client's setup (partition, ``FedInfo``, initial state, model spec: :mod:`fedrisk.deploy.node`), so
that a ``train`` message loads only that and runs ``draw`` + ``client_update`` through
:func:`fedrisk.deploy.node.node_round` on the node's partition (``partition-id`` of its node
config), with the client's state read from and written to the node-local
:class:`~fedrisk.deploy.state.ClientStateStore` (node config ``state-dir``, keyed by the run's
session), so control variates and personal weights survive a SuperNode restart and a resumed
ServerApp (:func:`run_on_grid`); an exception becomes Flower's error reply.

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

import json
import secrets
import sys
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
from fedrisk.deploy.server import MessageExecutor, Unavailable
from fedrisk.errors import FedriskError
from fedrisk.experiment.outputs import atomic_write_text

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
        timeout: seconds to wait for a round's replies (and a handshake's: a node builds its client's
            setup then); a node silent that long is dropped per the failure policy (a node Flower's
            heartbeats mark offline answers with an error sooner).
        connect_timeout: seconds to wait for ``num_clients`` nodes to connect (under ``"raise"``, for
            a missing node to come back).
        session: the key of the nodes' client states for this run (see :func:`run_on_grid`).
        session_file: where to record ``session`` once the run directory exists (a fresh run).

    A node that is gone (its reply is Flower's node-unavailable error, or it stayed silent for
    ``timeout``) is handled by the failure policy: under ``"raise"`` the executor waits up to
    ``connect_timeout`` for the SuperNode to come back (a restart: a new node id) and sends the
    round again; under ``"skip"`` it waits for nothing: the client is marked unavailable and not
    asked (its rounds are dropped at once, named in ``failed``) until a node that serves it
    answers a handshake.  Before every round (under ``"skip"``) the executor handshakes the
    nodes Flower lists that serve no client yet (a restarted SuperNode); a node that stayed
    silent is not asked again while Flower still lists it (a hung node), only once it has left
    the list and come back.
    """

    name = "flower"

    def __init__(
        self, grid: Grid, experiment: str, num_clients: int, *, timeout: float = 600.0, connect_timeout: float = 120.0,
        session: str = "", session_file: str | Path | None = None,
    ) -> None:  # fmt: skip
        super().__init__(experiment, session)
        self.grid, self.num_clients = grid, num_clients
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.session_file = Path(session_file) if session_file is not None else None
        self.node_of: dict[int, int] = {}
        self.down: dict[int, int] = {}
        """Clients marked unavailable (``"skip"``): client id -> the round since when."""
        self.shunned: set[int] = set()
        """Node ids not to handshake while Flower lists them (gone, or refused at the handshake)."""

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

    def _handshake(self, nodes: list[int], timeout: float) -> tuple[dict[int, Mapping[str, Any]], list[str]]:
        """Send the handshake to ``nodes``: their answers and the problems (error replies, silence)."""
        request = ConfigRecord(handshake_request(self.experiment, self.num_clients))
        messages = [Message(RecordDict({HANDSHAKE: request}), n, message_type(ACTION, "query")) for n in nodes]
        answers: dict[int, Mapping[str, Any]] = {}
        problems: list[str] = []
        for node, reply in zip(nodes, self._send(messages, timeout)):
            if reply is None:
                problems.append(f"node {node} did not answer")
            elif reply.has_error():
                problems.append(f"node {node}: {reply.error.reason}")
            else:
                answers[node] = dict(reply.content[HANDSHAKE])
        return answers, problems

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
        # a node builds its client's setup when it first answers (seconds): as long as a round may take
        answers, problems = self._handshake(nodes, max(end - time.monotonic(), self.timeout))
        try:  # nodes that failed the handshake are left out when the others serve every client
            mapping = client_map(answers, num_clients=self.num_clients, experiment=self.experiment)
        except FedriskError as exc:
            raise FedriskError("; ".join([str(exc), *problems])) from None
        self.node_of = {client: node for node, client in mapping.items()}
        self.down.clear()
        return mapping

    def rejoin(self, round: int) -> list[int]:
        """Under ``"skip"``, before a round: mark the clients whose node Flower no longer lists
        unavailable, and handshake the nodes not known yet (a restarted SuperNode); returns the
        clients that have a node again."""
        connected = set(self.grid.get_node_ids())
        self.shunned &= connected  # a node id that left Flower's list may handshake when it is back
        for k, node in self.node_of.items():
            if node not in connected and k not in self.down:
                self.down[k] = round
        live = {node for k, node in self.node_of.items() if k not in self.down}
        fresh = sorted(connected - live - self.shunned)
        if not fresh:
            return []
        answers, problems = self._handshake(fresh, self.timeout)
        back = []
        for node in fresh:
            if node not in answers:
                self.shunned.add(node)
                continue
            try:
                (client,) = client_map(
                    {node: answers[node]}, num_clients=self.num_clients, experiment=self.experiment, require_all=False
                ).values()
            except (FedriskError, ValueError) as exc:
                problems.append(str(exc))
                self.shunned.add(node)
                continue
            if client in self.node_of and client not in self.down and self.node_of[client] in connected:
                problems.append(f"node {node} has partition-id = {client}, served by node {self.node_of[client]}")
                self.shunned.add(node)
                continue
            self.node_of[client] = node
            self.down.pop(client, None)
            back.append(client)
        for problem in problems:
            print(f"fedrisk: round {round}: a node was refused: {problem}", file=sys.stderr, flush=True)
        return back

    def exchange(self, requests: Mapping[int, tuple[str, Any]], ctx: Any, states: Mapping[int, Any]) -> dict[int, Any]:
        if self.session_file is not None:  # a fresh run: its directory exists now
            atomic_write_text(self.session_file, json.dumps({"session": self.session, "experiment": self.experiment}))
            self.session_file = None
        skip = self.on_failure == "skip"
        connected = set(self.grid.get_node_ids())
        if not self.node_of:
            self.connect()  # the first round
        elif skip:
            self.rejoin(ctx.round)
        elif any(self.node_of[k] not in connected for k in requests):
            self.connect()  # a SuperNode restarted (a new node id): wait for it, handshake again
        asked = [k for k in requests if k not in self.down]
        replies = self._round(requests, asked, ctx)
        lost = [k for k, r in replies.items() if r is None or (r.has_error() and r.error.code == NODE_UNAVAILABLE)]
        lost = [k for k in lost if replies[k] is not None or skip]  # a silent node under "raise": a failure
        if lost and skip:  # marked unavailable; a node that is back already (restarted) gets the round again
            for k in lost:
                if replies[k] is None:  # silent: not asked again while Flower lists it (a hung node)
                    self.shunned.add(self.node_of[k])
                self.down[k] = ctx.round
            again = [k for k in self.rejoin(ctx.round) if k in lost]
            replies.update(self._round(requests, again, ctx))
            for k in again:
                reply = replies[k]
                if reply is None or (reply.has_error() and reply.error.code == NODE_UNAVAILABLE):
                    self.down[k] = ctx.round
        elif lost:  # a node went away after the message was sent: once it is back (restarted), send again
            try:
                self.connect(frozenset(self.node_of[k] for k in lost))
            except FedriskError:
                pass  # not back: the error replies go to the failure policy
            else:
                replies.update(self._round(requests, lost, ctx))
        out: dict[int, Any] = {}
        for k in requests:
            reply = replies.get(k)
            if k not in replies:
                out[k] = Unavailable(
                    f"its node is unavailable since round {self.down[k]} (asked again once a SuperNode with "
                    f"partition-id {k} answers a handshake)"
                )
            elif reply is None:
                continue  # silent: MessageExecutor names it
            else:
                out[k] = f"{reply.error.code}: {reply.error.reason}" if reply.has_error() else reply.content
        return out

    def _round(self, requests: Mapping[int, tuple[str, Any]], clients: list[int], ctx: Any) -> dict[int, Any]:
        messages = [
            Message(requests[k][1], self.node_of[k], requests[k][0], group_id=str(ctx.round), ttl=self.timeout)
            for k in clients
        ]
        return dict(zip(clients, self._send(messages, self.timeout)))


SESSION_FILE = "deployment.json"
"""A deployed run's session (the key of the nodes' client states) in its run directory."""


def run_on_grid(
    grid: Grid, cfg: Any, out: str | Path | None = None, *, resume: bool = False, overwrite: bool = False,
    timeout: float = 600.0, connect_timeout: float = 120.0, progress: str = "plain",
) -> Any:  # fmt: skip
    """Run the experiment ``cfg`` over ``grid`` into the run directory ``out`` (as
    :func:`~fedrisk.experiment.runner.run_experiment`, whose ``RunResult`` comes back).

    A fresh run draws a random session, the key under which the nodes keep their clients'
    states, and records it in ``out/deployment.json``; ``resume`` continues from ``out``'s
    checkpoint with the recorded session, so every node continues from its kept client state.
    The nodes keep a client's last two states, so a deployed run writes a checkpoint after every
    round (``run.checkpoint_every = 1``, a key that does not change the numbers).
    """
    from fedrisk.experiment.runner import default_out_dir, run_experiment

    experiment = fingerprint(cfg.semantic())
    out = Path(out) if out else default_out_dir(cfg)
    if cfg["run.checkpoint_every"] != 1:
        cfg = cfg.with_overrides({"run.checkpoint_every": 1})
    if resume:
        session, session_file = read_session(out, experiment), None
    else:
        session, session_file = secrets.token_hex(8), out / SESSION_FILE
    executor = FlowerExecutor(
        grid, experiment, cfg["data.num_clients"], timeout=timeout, connect_timeout=connect_timeout,
        session=session, session_file=session_file,
    )  # fmt: skip
    mapping = executor.connect()
    print(f"fedrisk: {len(mapping)} node(s) serve clients {sorted(mapping.values())}", flush=True)
    return run_experiment(cfg, out, resume=resume, overwrite=overwrite, progress=progress, executor=executor)


def read_session(out: str | Path, experiment: str) -> str:
    """The session recorded in a deployed run's directory, with clear errors."""
    path = Path(out) / SESSION_FILE
    if not path.is_file():
        raise FedriskError(
            f"{path} not found: --resume of a deployed run needs the run directory that `fedrisk deploy run` "
            "wrote (a simulated run resumes with `fedrisk run --resume`)"
        )
    try:
        record = json.loads(path.read_text())
        session, recorded = str(record["session"]), str(record["experiment"])
    except (ValueError, KeyError, TypeError) as exc:
        raise FedriskError(f"{path} is damaged ({exc}); start the run again with --overwrite") from None
    if recorded != experiment:
        raise FedriskError(
            f"{path} belongs to another config (fingerprint {recorded}, now {experiment}); resume with the "
            "config of that run or start again with --overwrite"
        )
    return session


def server_main(grid: Grid, context: Context, config_path: str | Path) -> None:
    """The ServerApp's main loop (run config keys: ``out``, ``overwrite``, ``resume``,
    ``round-timeout``, ``connect-timeout``)."""
    rc = context.run_config
    result = run_on_grid(
        grid, load_app_config(config_path), str(rc.get("out", "")) or None, resume=bool(rc.get("resume", False)),
        overwrite=bool(rc.get("overwrite", False)), timeout=float(rc.get("round-timeout", 600.0)),
        connect_timeout=float(rc.get("connect-timeout", 120.0)),
    )  # fmt: skip
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
