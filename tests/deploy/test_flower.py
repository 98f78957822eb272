"""fedrisk on a real Flower deployment: a SuperLink and SuperNodes on 127.0.0.1 (free ports picked at
run time), the ServerApp / ClientApp of :mod:`fedrisk.deploy.apps` submitted with ``flwr run``.

Default tier: the smoke test through ``fedrisk deploy run`` (2 SuperNodes, SCAFFOLD; final model
equal to the sequential executor's bit for bit), a failing ServerApp making the command exit 1,
an unreachable SuperLink.  Slow tier: TLS, node authentication, a SuperNode restart in the middle
of a run, a failed run resumed with ``--resume``.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra (scripts/setup.sh installs it)")

from fedrisk.cli import main
from fedrisk.deploy.commands import (
    DeployFailed,
    LocalFederation,
    check_reachable,
    free_port,
    make_certificates,
    run_deployed,
)
from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import build_simulation

from .test_records import same

WAIT = 600.0  # the shared CI machine can be slow; a healthy run takes well under a minute


def config(rounds: int = 2, num_clients: int = 2, algorithm: str = "scaffold"):
    raw = {"data": {"dataset": "digits", "num_clients": num_clients}, "model": {"name": "logreg"},
           "algorithm": {"name": algorithm, "local_steps": 2}, "run": {"rounds": rounds, "seed": 5, "threads": 1},
           "output": {"plots": False}}  # fmt: skip
    return resolve_config(raw)


def sequential_model(cfg):
    """The sequential executor's final model, with the run's thread count (as the server and nodes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg["run.threads"])
    try:
        sim = build_simulation(cfg).simulation
        for _ in range(cfg["run.rounds"]):
            sim.step()
        return sim.algorithm.global_params(sim.server_state)
    finally:
        torch.set_num_threads(threads)


def deployed_model(out: Path):
    return torch.load(out / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with LocalFederation(2, tmp_path_factory.mktemp("federation")) as fed:
        yield fed


def test_two_supernodes_end_with_the_sequential_model_bit_for_bit(federation, tmp_path, capsys):
    cfg = config()
    (tmp_path / "exp.toml").write_text(cfg.to_toml())
    argv = ["deploy", "run", str(tmp_path / "exp.toml"), "--superlink", federation.superlink]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert f"outputs in {tmp_path / 'run'}: config.toml" in capsys.readouterr().out
    assert same(deployed_model(tmp_path / "run"), sequential_model(cfg))
    assert {"config.toml", "metrics.jsonl", "summary.json"} <= {p.name for p in (tmp_path / "run").iterdir()}
    # each node kept its client's SCAFFOLD state on its own disk
    assert all(list((federation.root / f"node-{i}").rglob(f"client-{i}.pt")) for i in range(2))


def test_a_failing_serverapp_is_a_failed_command(federation, tmp_path, capsys):
    cfg = config(num_clients=3)  # three clients, two SuperNodes: the handshake fails in the ServerApp
    (tmp_path / "exp.toml").write_text(cfg.to_toml())
    argv = ["deploy", "run", str(tmp_path / "exp.toml"), "--superlink", federation.superlink]
    # `flwr run` itself returns 0 here; fedrisk reads the final status
    assert main([*argv, "--out", str(tmp_path / "run"), "--connect-timeout", "1"]) == 1
    assert re.search(r"finished:failed.*2 SuperNode\(s\) connected.*3 clients", capsys.readouterr().err)


def test_an_unreachable_superlink_is_a_clear_error(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(FedriskError, match=rf"cannot reach the SuperLink at {address}"):
        check_reachable(address)
    with pytest.raises(FedriskError, match="cannot reach the SuperLink"):
        run_deployed(config(), address, tmp_path / "run")


@pytest.mark.slow
def test_tls_federation(tmp_path):
    certs = make_certificates(tmp_path / "certs")
    cfg = config(rounds=1)
    with LocalFederation(2, tmp_path / "fed", tls=certs) as fed:
        assert "--insecure" not in (fed.log("superlink.log") + fed.log("supernode-0.log")).split()
        run_deployed(cfg, fed.superlink, tmp_path / "run", tls=certs, wait=WAIT)
    assert same(deployed_model(tmp_path / "run"), sequential_model(cfg))


@pytest.mark.slow
def test_node_authentication(tmp_path):
    cfg = config(rounds=1)
    certs = make_certificates(tmp_path / "certs")  # Flower 1.41: node authentication needs TLS
    with LocalFederation(2, tmp_path / "fed", tls=certs, node_auth=True) as fed:
        run_deployed(cfg, fed.superlink, tmp_path / "run", tls=certs, wait=WAIT)
        assert len(fed.keys) == 2
    assert same(deployed_model(tmp_path / "run"), sequential_model(cfg))


@pytest.mark.slow
def test_node_authentication_refuses_an_unregistered_node(tmp_path):
    cfg = config(rounds=1, num_clients=2)
    certs = make_certificates(tmp_path / "certs")
    with LocalFederation(1, tmp_path / "fed", tls=certs, node_auth=True) as fed:
        fed.node_auth = False  # the second node starts without a registered key
        fed.num_nodes = 2
        fed.start_node(1)
        with pytest.raises(DeployFailed, match=r"1 SuperNode\(s\) connected"):
            run_deployed(cfg, fed.superlink, tmp_path / "run", tls=certs, connect_timeout=20.0, wait=WAIT)


@pytest.mark.slow
def test_a_supernode_restarted_mid_run_keeps_its_client_state(tmp_path):
    cfg = config(rounds=3)
    with LocalFederation(2, tmp_path / "fed") as fed:
        result: dict[str, object] = {}

        def submit() -> None:
            try:
                result["run"] = run_deployed(cfg, fed.superlink, tmp_path / "run", wait=WAIT)
            except Exception as exc:  # reported below
                result["error"] = exc

        thread = threading.Thread(target=submit)
        thread.start()
        metrics = tmp_path / "run" / "metrics.jsonl"
        end = time.monotonic() + WAIT
        while time.monotonic() < end and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            time.sleep(0.2)
        fed.stop_node(1)  # after round 1: SIGTERM, then a fresh process (a new Flower node id)
        fed.start_node(1)
        thread.join(WAIT)
    assert "error" not in result, result.get("error")
    assert same(deployed_model(tmp_path / "run"), sequential_model(cfg))


@pytest.mark.slow
def test_a_failed_deployed_run_resumes_with_the_nodes_kept_states(tmp_path):
    """The ServerApp fails in round 2 (client 1's SuperNode is gone and `--connect-timeout` passes);
    `fedrisk deploy run --resume` continues from the run directory's checkpoint with the session
    the nodes keyed their states by, and ends with the sequential executor's model."""
    cfg = config(rounds=4)
    (tmp_path / "exp.toml").write_text(cfg.to_toml())
    with LocalFederation(2, tmp_path / "fed") as fed:
        result: dict[str, object] = {}

        def submit() -> None:
            try:
                run_deployed(cfg, fed.superlink, tmp_path / "run", connect_timeout=5.0, wait=WAIT)
            except Exception as exc:  # the failed run, checked below
                result["error"] = exc

        thread = threading.Thread(target=submit)
        thread.start()
        metrics = tmp_path / "run" / "metrics.jsonl"
        end = time.monotonic() + WAIT
        while (
            time.monotonic() < end
            and thread.is_alive()
            and not (metrics.exists() and metrics.read_text().count("\n") >= 2)
        ):
            time.sleep(0.2)
        fed.stop_node(1)  # after round 1
        thread.join(WAIT)
        assert isinstance(result.get("error"), DeployFailed), result
        fed.start_node(1)
        argv = ["deploy", "run", str(tmp_path / "exp.toml"), "--superlink", fed.superlink]
        assert main([*argv, "--out", str(tmp_path / "run"), "--resume"]) == 0
    assert same(deployed_model(tmp_path / "run"), sequential_model(cfg))
