"""The distributed executor gives the sequential executor's numbers, on 2 and 3 processes.

One ``torchrun`` launch per world size (2 processes with the sequential local executor,
3 with the vectorised one; both launched concurrently, gloo on 127.0.0.1) runs every case of
``_distributed_cases.py`` (every registered algorithm that can be built generically, toy
algorithms for per-client payloads / gather aggregation / failures, an omniscient attack,
float32, a resumed run); each rank writes its results.  The tests compare rank 0 with a
sequential run in this process (float64: 1e-9; float32: 1e-5 relative) and every rank with
rank 0 bit for bit (the server state is replicated).  Bad input (no torchrun environment,
world size above the number of clients, unknown names) is tested here too.

The contract conformance suite (``tests/conformance``) covers the in-process executors; the
distributed executor needs a process group, so its equivalence lives here.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _distributed_cases as C

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime import EXECUTORS
from fedrisk.runtime.distributed import (
    LAUNCH_COMMAND,
    TORCHRUN_ENV,
    DistributedExecutor,
    free_port,
    shard_clients,
    shard_of,
)
from fedrisk.runtime.simulation import Simulation

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distributed_worker.py"
LAUNCHES = {2: "sequential", 3: "vectorized"}  # world size -> local executor
CASES = C.cases()
TIMEOUT_S = 300


def _launch(world: int, local: str, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    src = str(HERE.parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(WORKER), str(out), local,
    ]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """``{world size: [results of rank 0, rank 1, ...]}`` from one torchrun launch per world size."""
    procs = {}
    for world, local in LAUNCHES.items():
        out = tmp_path_factory.mktemp(f"world{world}")
        procs[world] = (out, _launch(world, local, out))
    results = {}
    for world, (out, proc) in procs.items():
        try:
            log, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            pytest.fail(f"torchrun with {world} processes timed out after {TIMEOUT_S} s:\n{log[-4000:]}")
        assert proc.returncode == 0, f"torchrun with {world} processes failed:\n{log[-6000:]}"
        results[world] = [torch.load(out / f"rank{r}.pt") for r in range(world)]
    return results


@functools.cache
def sequential(name: str) -> dict[str, Any]:
    case = next(c for c in CASES if c.name == name)
    result = C.run_case(case, lambda: "sequential")
    C.check_outcome(case, result)
    return result


@pytest.mark.parametrize("world", sorted(LAUNCHES))
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_sequential(launched: dict[int, list[dict[str, Any]]], world: int, name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    if case.skip:
        pytest.skip(case.skip)
    ref = sequential(name)
    ranks = [results[name] for results in launched[world]]
    if "error" not in ref and ref["num_clients"] < world:  # centralised training: one pooled client
        for got in ranks:
            assert got["error"].startswith(f"world size {world} is larger than the number of clients 1")
    elif "error" in ref:  # the run stops on every rank, with the sequential executor's reason
        for got in ranks:
            assert ref["error"] in got.get("error", "(no error)")
    else:
        assert "error" not in ranks[0], ranks[0].get("error")
        C.assert_same(ref, ranks[0], **C.tolerance(case.dtype), path=name)


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_ranks_hold_identical_states(launched: dict[int, list[dict[str, Any]]], world: int) -> None:
    ranks = launched[world]
    names = [c.name for c in CASES if not c.skip and "error" not in ranks[0][c.name]]
    assert {"own/shuffle", "alg/fedavg", "fedavg/resume"} <= set(names)
    for rank in range(1, world):
        for name in names:
            C.assert_same(ranks[0][name], ranks[rank][name], rtol=0.0, atol=0.0, path=f"rank{rank}:{name}")


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_launch_used_the_requested_world(launched: dict[int, list[dict[str, Any]]], world: int) -> None:
    metas = [r["_meta"] for r in launched[world]]
    assert [m["rank"] for m in metas] == list(range(world))
    assert {m["world_size"] for m in metas} == {world}
    assert {m["local"] for m in metas} == {LAUNCHES[world]}


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_bad_launches_fail_on_every_rank(launched: dict[int, list[dict[str, Any]]], world: int) -> None:
    for ranks in launched[world]:
        assert ranks["world_size_error"]["error"] == (
            f"FedriskError: world size {world} is larger than the number of clients {world - 1}: every process "
            f"must own at least one client; launch at most {world - 1} processes "
            f"(torchrun --nproc-per-node {world - 1} ...) or use more clients"
        )
        assert ranks["federation_mismatch"]["error"].startswith(
            "FedriskError: the processes built different algorithms or federations (every rank must run the same "
            f"config): rank 0: fedavg on {world} clients; rank 1: fedavg on {world + 1} clients"
        )
        assert ranks["replica_mismatch"]["error"] == (
            "RuntimeError: the ranks disagree on the plan of round 0 (toy_shuffle): their server states "
            "diverged or they run different configs/seeds"
        )


@pytest.mark.parametrize("world", sorted(LAUNCHES))
def test_helpers_for_the_runner(launched: dict[int, list[dict[str, Any]]], world: int) -> None:
    for results in launched[world]:
        assert results["helpers"] == {
            "run_on_primary": "computed on rank 0",
            "run_on_primary_error": {"error": "FedriskError: refused on rank 0"},
            "any_rank_last": True,
            "any_rank_none": False,
        }


# -- in-process ------------------------------------------------------------------------------
def _tiny_sim(**kwargs: Any) -> Simulation:
    alg = FedAvg(model=C.model(), loss=cross_entropy, batch_size=4)
    return Simulation(alg, C.federation(), dtype=torch.float64, **kwargs)


def test_registered() -> None:
    assert EXECUTORS.get("distributed") is DistributedExecutor


def test_without_torchrun_shows_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in TORCHRUN_ENV:
        monkeypatch.delenv(var, raising=False)
    assert not dist.is_initialized()
    with pytest.raises(FedriskError) as err:
        _tiny_sim(executor="distributed")
    message = str(err.value)
    assert "must be launched by torchrun (missing environment variables RANK, WORLD_SIZE, MASTER_ADDR" in message
    assert LAUNCH_COMMAND in message
    assert LAUNCH_COMMAND == "torchrun --nproc-per-node 2 -m fedrisk run CONFIG --set run.executor=distributed"


def test_unknown_names() -> None:
    with pytest.raises(FedriskError, match=r"unknown distributed backend 'mpi'\. Valid choices: gloo, nccl"):
        DistributedExecutor(backend="mpi")
    with pytest.raises(FedriskError, match=r"Did you mean 'vectorized'.*Valid choices: sequential, vectorized"):
        DistributedExecutor(local="vectorised")
    with pytest.raises(FedriskError, match="cannot be distributed itself"):
        DistributedExecutor(local=DistributedExecutor())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without CUDA")
def test_nccl_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(FedriskError, match="backend 'nccl' needs CUDA GPUs, and none is available; use backend 'gloo'"):
        _tiny_sim(executor=DistributedExecutor(backend="nccl"))
    assert not dist.is_initialized()


def test_shards_are_fixed_round_robin() -> None:
    clients = [0, 1, 2, 4, 5, 7, 9]
    shards = [shard_clients(clients, r, 3) for r in range(3)]
    assert shards == [[0, 9], [1, 4, 7], [2, 5]]
    assert [shard_of(k, 3) for k in range(6)] == [0, 1, 2, 0, 1, 2]


def test_world_of_one_is_bitwise_sequential(monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (world size 1): every code path of a round without a second process."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    case = next(c for c in CASES if c.name == "own/shuffle-skip")
    executor = DistributedExecutor(check_replicas=True)
    try:
        got = C.run_case(case, lambda: executor)
        assert executor.world_size == 1 and executor.rank == 0 and executor.is_primary
    finally:
        executor.close()
    assert not dist.is_initialized()
    C.assert_same(sequential(case.name), got, rtol=0.0, atol=0.0)
