"""The ServerApp's executor and the ClientApp over an in-process stand-in for Flower's ``Grid``
(messages through their protobuf bytes, replies matched by ``reply_to_message_id``): bit-identity
with the sequential executor, the handshake, error replies (e.g. a node Flower's heartbeats
marked unavailable) and silent nodes per the failure policy, a SuperNode restarted with a new
node id, and messages that reach the wrong node."""

from __future__ import annotations

import itertools
import json
import re
import time

import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

from flwr.app import Context, Error, Message, RecordDict

from fedrisk.deploy.apps import FedriskClientApp, FlowerExecutor
from fedrisk.deploy.handshake import fingerprint
from fedrisk.deploy.server import wire
from fedrisk.deploy.state import ClientStateStore
from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.executor import ClientFailure

from .test_records import same

NODE_UNAVAILABLE = 5  # flwr.common.constant.ErrorCode.NODE_UNAVAILABLE


def config(num_clients: int = 2, rounds: int = 4, **run):
    raw = {"data": {"dataset": "digits", "num_clients": num_clients}, "model": {"name": "logreg"},
           "algorithm": {"name": "scaffold", "local_steps": 2},
           "run": {"rounds": rounds, "seed": 1, **run}}  # fmt: skip
    return resolve_config(raw)


@pytest.fixture(autouse=True)
def task_identity():
    """What a ServerApp process has set when it builds messages (run id, its node id 0, task id)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class FakeGrid:
    """Nodes in this process: ``nodes`` maps a node id to its node config; ``fault(message)``
    returns ``"silent"``, ``"unavailable"`` or None."""

    def __init__(self, app, nodes, fault=None):
        self.app, self.nodes, self.fault = app, dict(nodes), fault or (lambda m: None)
        self.ready: dict[str, Message] = {}
        self.ids = itertools.count()
        self.sent: list[Message] = []

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = f"m{next(self.ids)}"
            m.metadata.__dict__["_message_id"] = mid
            self.sent.append(m)
            ids.append(mid)
            node_config = self.nodes.get(m.metadata.dst_node_id)
            fault = self.fault(m)
            if fault == "silent":
                continue
            if fault == "lost-reply":  # the node finishes the round (its state is saved), the reply is lost
                self.app(_copy(m), Context(7, m.metadata.dst_node_id, node_config, RecordDict(), {}))
            if fault in ("unavailable", "lost-reply") or m.metadata.dst_node_id not in self.nodes:
                self.ready[mid] = Message(Error(NODE_UNAVAILABLE, "node is offline"), reply_to=m)
                continue
            received = _copy(m)
            context = Context(7, m.metadata.dst_node_id, self.nodes[m.metadata.dst_node_id], RecordDict(), {})
            try:
                reply = self.app(received, context)
                reply = Message(wire(reply.content), reply_to=m)
            except Exception as exc:  # Flower turns a ClientApp exception into an error reply
                reply = Message(Error(2, repr(exc)), reply_to=m)
            self.ready[mid] = reply
        return ids

    def pull_messages(self, ids):
        return [self.ready.pop(i) for i in list(ids) if i in self.ready]


def _copy(m: Message) -> Message:
    """``m`` as a node receives it: content through the protobuf bytes, the same metadata."""
    out = Message(wire(m.content), m.metadata.dst_node_id, m.metadata.message_type)
    out.metadata.__dict__.update({k: v for k, v in m.metadata.__dict__.items()})
    return out


@pytest.fixture
def app(tmp_path):
    def make(cfg):
        path = tmp_path / "experiment.toml"
        path.write_text(cfg.to_toml())
        return FedriskClientApp(path)

    return make


def nodes(tmp_path, num_clients, **extra):
    return {
        1000 + 7 * i: {"partition-id": i, "num-partitions": num_clients, "state-dir": str(tmp_path / f"n{i}"), **extra}
        for i in range(num_clients)
    }


def executor(grid, cfg, **kw):
    return FlowerExecutor(grid, fingerprint(cfg.semantic()), cfg["data.num_clients"], connect_timeout=1.0, **kw)


def test_the_serverapp_executor_equals_the_sequential_executor_bit_for_bit(app, tmp_path):
    cfg = config()
    grid = FakeGrid(app(cfg), nodes(tmp_path, 2))
    seq = build_simulation(cfg).simulation
    dep = build_simulation(cfg, executor=executor(grid, cfg)).simulation
    for _ in range(3):
        a, b = seq.step(), dep.step()
        assert a.train_metrics == b.train_metrics and a.clients == b.clients
    assert same(seq.server_state, dep.server_state)
    kinds = {m.metadata.message_type for m in grid.sent}
    assert kinds == {"query.fedrisk_handshake", "train"}
    assert {m.metadata.group_id for m in grid.sent if m.metadata.message_type == "train"} == {"0", "1", "2"}
    assert len(list((tmp_path / "n1").rglob("client-1.pt"))) == 1  # the node's SCAFFOLD state, on its disk


@pytest.mark.parametrize("policy", ["averaged", "local"])
def test_batchnorm_statistics_travel_through_the_deployment_bit_for_bit(policy, app, tmp_path, request):
    raw = {"data": {"dataset": "digits", "num_clients": 2, "dataset_options": {"flatten": False}},
           "model": {"name": "resnet18", "widths": [2, 2, 2, 2], "norm_stats": policy},
           "algorithm": {"name": "fedavg", "local_steps": 2, "batch_size": 8},
           "run": {"rounds": 2, "seed": 1, "threads": 1}}  # fmt: skip
    cfg = resolve_config(raw)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # what the nodes set (run.threads): convolutions' sums depend on it
    request.addfinalizer(lambda: torch.set_num_threads(before))
    grid = FakeGrid(app(cfg), nodes(tmp_path, 2))
    seq = build_simulation(cfg).simulation
    dep = build_simulation(cfg, executor=executor(grid, cfg)).simulation
    for _ in range(2):
        a, b = seq.step(), dep.step()
        assert a.train_metrics == b.train_metrics
    assert same(seq.server_state, dep.server_state)
    for k in range(2):  # the clients' states (FedBN: their own statistics) live on their nodes
        [kept] = list((tmp_path / f"n{k}").rglob(f"client-{k}.pt"))
        state = ClientStateStore(kept.parent.parent).load(kept.parent.name, k)[1]
        assert same(state, seq.client_states[k])
    moved = seq.server_state["norm_stats"]["bn1.running_mean"].abs().sum() > 0
    assert bool(moved) == (policy == "averaged")


def test_a_restarted_supernode_is_found_again_with_its_state(app, tmp_path):
    cfg = config()
    grid = FakeGrid(app(cfg), nodes(tmp_path, 2))
    seq = build_simulation(cfg).simulation
    dep = build_simulation(cfg, executor=executor(grid, cfg)).simulation
    seq.step(), dep.step()
    grid.nodes[4242] = grid.nodes.pop(1007)  # client 1's SuperNode restarts: a new Flower node id
    for _ in range(2):
        seq.step(), dep.step()
    assert same(seq.server_state, dep.server_state)
    handshakes = [m for m in grid.sent if m.metadata.message_type == "query.fedrisk_handshake"]
    assert len(handshakes) == 4  # two nodes at the start, two after the restart


def test_a_supernode_restarted_after_the_message_was_sent_gets_it_again_and_starts_from_the_state_before(app, tmp_path):
    cfg = config()
    moved = []

    def restart(m):  # client 1's node finishes round 1, stops before its reply leaves, and comes back
        if m.metadata.dst_node_id == 1007 and m.metadata.group_id == "1" and not moved:
            moved.append(m)
            grid.nodes[4242] = grid.nodes[1007]
            return "lost-reply"
        if moved and m.metadata.dst_node_id == 1007:  # the handshake after the restart: the old id is gone
            grid.nodes.pop(1007, None)
        return None

    grid = FakeGrid(app(cfg), nodes(tmp_path, 2), restart)
    seq = build_simulation(cfg).simulation
    dep = build_simulation(cfg, executor=executor(grid, cfg)).simulation
    for _ in range(3):
        seq.step()
        assert dep.step().failed == {}
    assert same(seq.server_state, dep.server_state) and moved


@pytest.mark.parametrize("fault", ["unavailable", "silent", "error"])
def test_error_replies_and_silent_nodes_follow_the_failure_policy(fault, app, tmp_path):
    def inject(m):
        if m.metadata.dst_node_id == 1007 and m.metadata.group_id == "1":
            return "unavailable" if fault == "unavailable" else ("silent" if fault == "silent" else None)
        return None

    for policy in ("raise", "skip"):
        cfg = config(on_client_failure=policy)
        node_cfg = nodes(tmp_path / policy, 2)
        (tmp_path / "blocker").write_text("")
        grid = FakeGrid(app(cfg), node_cfg, inject)
        sim = build_simulation(cfg, executor=executor(grid, cfg, timeout=0.5)).simulation
        expected = {"unavailable": "replied with an error.*node is offline", "silent": "did not reply",
                    "error": "replied with an error.*cannot keep"}[fault]  # fmt: skip
        sim.step()
        kept = grid.nodes[1007]["state-dir"]
        if fault == "error":  # the node's ClientApp raises in round 1: its store cannot be written
            grid.nodes[1007]["state-dir"] = str(tmp_path / "blocker")
        if policy == "raise":
            with pytest.raises(ClientFailure, match=expected):
                sim.step()
        else:
            report = sim.step()
            assert list(report.failed) == [1] and re.search(expected, report.failed[1])
            assert report.clients == [0]
            grid.nodes[1007]["state-dir"] = kept
            if fault == "silent":  # not asked again while listed: back once its SuperNode restarts (a new id)
                assert sim.step().clients == [0]
                grid.nodes[4242] = grid.nodes.pop(1007)
            assert sim.step().clients == [0, 1]  # client 1 is back


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({1000: {"num-partitions": 2}}, "node 1000 was started without partition-id"),
        ({1007: {"partition-id": 0}}, "nodes 1000 and 1007 both have partition-id = 0"),
        ({1007: {"partition-id": 5}}, "partition-id = 5; allowed: an integer in 0 .. 1"),
        ({1007: {"num-partitions": 3}}, "num-partitions = 3, the config has 2"),
    ],
    ids=["missing", "duplicated", "out-of-range", "num-partitions"],
)
def test_handshake_refuses_bad_node_configs(change, message, app, tmp_path):
    cfg = config()
    node_cfg = nodes(tmp_path, 2)
    for node, values in change.items():
        node_cfg[node] = values if "partition-id" not in values and node == 1000 else {**node_cfg[node], **values}
    grid = FakeGrid(app(cfg), node_cfg)
    with pytest.raises(FedriskError, match=re.escape(message)):
        executor(grid, cfg).connect()


def test_handshake_refuses_a_node_with_another_config_and_too_few_nodes(app, tmp_path):
    cfg, other = config(), config(rounds=3, seed=2)
    grid = FakeGrid(app(other), nodes(tmp_path, 2))
    with pytest.raises(FedriskError, match="runs another config"):
        executor(grid, cfg).connect()
    grid = FakeGrid(app(cfg), dict(list(nodes(tmp_path, 2).items())[:1]))
    with pytest.raises(FedriskError, match=r"1 SuperNode\(s\) connected within 1 s, the config has 2 clients"):
        executor(grid, cfg).connect()


def test_a_message_for_another_client_is_refused_by_the_node(app, tmp_path):
    cfg = config()
    grid = FakeGrid(app(cfg), nodes(tmp_path, 2))
    ex = executor(grid, cfg)
    ex.connect()
    ex.node_of = {0: 1007, 1: 1000}  # crossed wires
    sim = build_simulation(cfg, executor=ex).simulation
    with pytest.raises(ClientFailure, match="a message for client 0 reached the node with partition-id 1"):
        sim.step()


@pytest.mark.parametrize("death", ["gone", "hung"])
def test_a_dead_node_under_skip_costs_no_timeout_in_later_rounds(death, app, tmp_path):
    """Gone: Flower stops listing the node; hung: still listed, silent.  Either way the client is
    marked unavailable and not asked again (no connect or reply timeout per round) until a
    SuperNode with its partition handshakes again."""
    cfg = config(rounds=5, on_client_failure="skip")

    def hang(m):
        late = m.metadata.group_id not in ("", "0")  # the rounds after the first
        return "silent" if death == "hung" and m.metadata.dst_node_id == 1007 and late else None

    grid = FakeGrid(app(cfg), nodes(tmp_path, 2), hang)
    ex = executor(grid, cfg, timeout=1.0 if death == "hung" else 60.0)
    ex.connect_timeout = 60.0  # a wait for the node would show
    seq = build_simulation(cfg).simulation
    sim = build_simulation(cfg, executor=ex).simulation
    sim.step()
    dead = grid.nodes[1007]
    if death == "gone":
        del grid.nodes[1007]
    start = time.monotonic()
    report = sim.step()
    assert report.clients == [0] and list(report.failed) == [1]
    first = time.monotonic() - start
    start = time.monotonic()
    report = sim.step()
    assert report.clients == [0]
    assert "not asked in round 2: its node is unavailable since round 1" in report.failed[1]
    assert time.monotonic() - start < 10.0 and first < 30.0
    asked = {m.metadata.group_id for m in grid.sent if m.metadata.dst_node_id == 1007 and m.metadata.group_id}
    assert asked == ({"0"} if death == "gone" else {"0", "1"})  # the rounds sent to it (a handshake has no group)
    grid.nodes.pop(1007, None)
    grid.nodes[4242] = dead  # the SuperNode restarts (a new node id), with its store
    assert sim.step().clients == [0, 1] and sim.step().clients == [0, 1]
    for _ in range(5):
        seq.step()
    assert not same(seq.server_state, sim.server_state)  # rounds 1-2 went without client 1


class CrashingGrid(FakeGrid):
    """The ServerApp dies in round ``crash`` after the nodes answered (they kept their states)."""

    crash = 2

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        if any(m.metadata.group_id == str(self.crash) for m in messages):
            raise RuntimeError("the ServerApp's machine went down")
        return ids


def test_a_deployed_run_resumes_from_its_checkpoint_with_the_nodes_kept_states(app, tmp_path):
    from fedrisk.deploy.apps import SESSION_FILE, run_on_grid

    cfg = config(rounds=4)
    client_app, node_cfg, out = app(cfg), nodes(tmp_path, 2), tmp_path / "run"
    with pytest.raises(RuntimeError, match="went down"):
        run_on_grid(CrashingGrid(client_app, node_cfg), cfg, out, connect_timeout=1.0, progress="none")
    session = json.loads((out / SESSION_FILE).read_text())["session"]
    assert list((tmp_path / "n1").glob(f"*-{session}/client-1.pt"))  # keyed by the run's session
    result = run_on_grid(FakeGrid(client_app, node_cfg), cfg, out, resume=True, connect_timeout=1.0, progress="none")
    assert result.path == out
    seq = build_simulation(cfg).simulation
    for _ in range(4):
        seq.step()
    assert same(torch.load(out / "model.pt", weights_only=True), seq.algorithm.global_params(seq.server_state))
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_resume_refuses_a_directory_without_a_deployed_run_or_of_another_config(app, tmp_path):
    from fedrisk.deploy.apps import SESSION_FILE, read_session

    with pytest.raises(FedriskError, match=r"deployment.json not found.*fedrisk run --resume"):
        read_session(tmp_path, "abc")
    (tmp_path / SESSION_FILE).write_text(json.dumps({"session": "s1", "experiment": "abc"}))
    assert read_session(tmp_path, "abc") == "s1"
    with pytest.raises(FedriskError, match="belongs to another config"):
        read_session(tmp_path, "def")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [{"name": "codasca", "window": 2, "stage_iters": 4}, {"name": "fedxl2"}],
                         ids=lambda a: a["name"])  # fmt: skip
def test_stateful_algorithms_keep_their_client_states_across_a_supernode_restart(algorithm, app, tmp_path):
    """CODASCA's control variates, FeDXL's pools: from the node's store (and its cached setup)
    after a restart, bit for bit the sequential executor's numbers (SCAFFOLD: the tests above)."""
    raw = {"data": {"dataset": "wine", "num_clients": 2, "binarize": {}},
           "model": {"name": "mlp", "hidden": [8], "num_outputs": 1},
           "algorithm": algorithm, "run": {"rounds": 4, "seed": 2, "dtype": "float64"}}  # fmt: skip
    cfg = resolve_config(raw)
    grid = FakeGrid(app(cfg), nodes(tmp_path, 2))
    seq = build_simulation(cfg).simulation
    dep = build_simulation(cfg, executor=executor(grid, cfg)).simulation
    for r in range(4):
        if r == 2:
            grid.nodes[4242] = grid.nodes.pop(1007)  # client 1's SuperNode restarts
        a, b = seq.step(), dep.step()
        assert a.train_metrics == b.train_metrics
    assert same(seq.server_state, dep.server_state)
    assert not same(seq.client_states[1], dep.client_states[1])  # the states lived on the node, not here
