"""Client states on disk (``Simulation(..., client_store=FOLDER)``): the same numbers as in
memory, bit for bit, under the sequential and the vectorised executor; only clients that took
part get a file; a checkpoint of a disk-backed run is a snapshot of linked files (per-file
SHA-256 manifest) and resumes exactly; damaged files are named; files are read without running
code."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms.scaffold import Scaffold
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.client_store import DiskClientStates, snapshot_problem
from fedrisk.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _distributed_cases as C

CLIENTS = 12


def _sim(executor: str, store: Path | None) -> Simulation:
    alg = Scaffold(model=C.model(), loss=cross_entropy, clients_per_round=3, **C.SMALL)
    fed = C.federation(num_clients=CLIENTS)
    return Simulation(alg, fed, seed=C.SEED, dtype=torch.float64, executor=executor, client_store=store)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_disk_states_equal_memory_states(executor: str, tmp_path: Path) -> None:
    mem, disk = _sim(executor, None), _sim(executor, tmp_path / "states")
    took_part: set[int] = set()
    for _ in range(4):
        took_part |= set(mem.step().clients)
        disk.step()
    assert isinstance(disk.client_states, DiskClientStates)
    C.assert_same(mem.server_state, disk.server_state, rtol=0.0, atol=0.0)
    C.assert_same(dict(mem.client_states), dict(disk.client_states), rtol=0.0, atol=0.0)
    files = sorted(int(p.stem.split("-")[1]) for p in (tmp_path / "states").glob("client-*.pt"))
    assert files == sorted(took_part) and len(files) < CLIENTS  # clients that never took part have no file


def test_disk_run_checkpoint_resumes(tmp_path: Path) -> None:
    """A checkpoint of a disk store is a snapshot of linked files (no state in the payload); a
    run resumed from it in the same folder, after the folder moved on by a round, is exact."""
    full = _sim("sequential", tmp_path / "a")
    for _ in range(4):
        full.step()
    first = _sim("sequential", tmp_path / "b")
    for _ in range(2):
        first.step()
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    first.step()  # the folder moves on past the checkpoint, as a killed run leaves it
    state = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    assert set(state["client_states"]) == {"store", "snapshot", "sha256"}  # linked, not loaded
    resumed = _sim("sequential", tmp_path / "b")
    resumed.load_state_dict(state)
    for _ in range(2):
        resumed.step()
    C.assert_same(full.server_state, resumed.server_state, rtol=0.0, atol=0.0)
    C.assert_same(dict(full.client_states), dict(resumed.client_states), rtol=0.0, atol=0.0)


def test_snapshot_files_are_links_and_survive_later_rounds(tmp_path: Path) -> None:
    sim = _sim("sequential", tmp_path)
    sim.step()
    ref = sim.client_states.snapshot()
    snap = tmp_path / "snapshots" / ref["snapshot"]
    k = sorted(ref["sha256"])[0]
    assert os.path.samefile(snap / f"client-{k}.pt", tmp_path / f"client-{k}.pt")  # a link: no copy, no load
    before = (snap / f"client-{k}.pt").read_bytes()
    for _ in range(3):
        sim.step()
        sim.client_states[k] = {"control": {n: v + 1 for n, v in sim.client_states[k]["control"].items()}}
    assert (snap / f"client-{k}.pt").read_bytes() == before
    sim.client_states.prune([ref["snapshot"]])
    assert sim.client_states.snapshots() == [ref["snapshot"]]
    sim.client_states.prune([])
    assert sim.client_states.snapshots() == []


def test_damaged_snapshot_or_state_file_is_named(tmp_path: Path) -> None:
    sim = _sim("sequential", tmp_path)
    sim.step()
    state = sim.state_dict()
    ref = state["client_states"]
    first, second = sorted(ref["sha256"])[:2]
    memory = _sim("sequential", None)
    with pytest.raises(FedriskError, match="keeps its client states on disk"):
        memory.load_state_dict(state)

    def damage(p: Path) -> None:  # a new file: the other link stays intact
        data = p.read_bytes()
        p.unlink()
        p.write_bytes(data[:-5])

    damage(tmp_path / f"client-{second}.pt")
    with pytest.raises(FedriskError, match=rf"cannot read the state of client {second} .*SHA-256"):
        sim.client_states[second]
    damage(tmp_path / "snapshots" / ref["snapshot"] / f"client-{first}.pt")
    with pytest.raises(FedriskError, match=rf"state of client {first} .* is corrupted"):
        _sim("sequential", tmp_path).load_state_dict(state)


def test_store_refuses_unsafe_files_and_bad_ids(tmp_path: Path) -> None:
    store = DiskClientStates(tmp_path, 2, initial=lambda k: {})

    class Evil:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    torch.save({"x": Evil()}, store.path(1))
    store.digests[1] = hashlib.sha256(store.path(1).read_bytes()).hexdigest()  # as if fedrisk had written it
    with pytest.raises(FedriskError, match=r"cannot read the state of client 1"):
        store[1]
    assert not (tmp_path / "ran").exists()
    with pytest.raises(KeyError):
        store[2]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"snapshot": "../../elsewhere"}, r"names its client states '\.\./\.\./elsewhere', which is not a snapshot"),
        ({"snapshot": None}, r"names its client states 'None', which is not a snapshot name"),
        ({"sha256": [1, 2]}, r"reference to its client states in .* is malformed"),
        ({"sha256": {"x": "00"}}, r"reference to its client states in .* is malformed"),
    ],
)
def test_malformed_snapshot_reference_is_a_clear_error(tmp_path: Path, change: dict, message: str) -> None:
    """A checkpoint read safely can still hold any plain data: a bad reference is named, and
    its snapshot name can never point outside the store's snapshots folder."""
    store = DiskClientStates(tmp_path, 2, initial=lambda k: {"c": torch.zeros(1)})
    store[1] = {"c": torch.ones(1)}
    ref = {**store.snapshot(), **change}
    assert snapshot_problem(tmp_path, ref) is not None
    with pytest.raises(FedriskError, match=message):
        store.restore(ref)


def test_vectorized_rounds_stage_new_states_on_disk(tmp_path: Path) -> None:
    """With client states on disk, the vectorised executor writes each block's new states to
    staged files as the block finishes (the round's output holds no state in memory); applying
    the round renames them into place, and a round that is not applied changes nothing."""
    from fedrisk.runtime.client_store import StagedStates
    from fedrisk.runtime.executor import ClientFailure
    from fedrisk.runtime.vectorized import VectorizedExecutor

    disk = _sim("sequential", tmp_path / "s")
    disk.executor = VectorizedExecutor(block_size=2)
    disk.executor.prepare(disk.algorithm, disk.data)
    mem = _sim("vectorized", None)
    mem.executor = VectorizedExecutor(block_size=2)
    mem.executor.prepare(mem.algorithm, mem.data)
    seen = []
    original = disk.executor.run_round

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out.states)
        return out

    disk.executor.run_round = spy  # type: ignore[method-assign]
    for _ in range(3):
        disk.step()
        mem.step()
    assert all(isinstance(s, StagedStates) for s in seen) and not list((tmp_path / "s").glob(".client-*.staged"))
    C.assert_same(dict(mem.client_states), dict(disk.client_states), rtol=0.0, atol=0.0)
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").glob("client-*.pt")}
    disk.min_replies = CLIENTS  # the next round has too few replies: it is not applied
    with pytest.raises(ClientFailure, match="fewer than min_replies"):
        disk.step()
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").glob("client-*.pt")} == before
    assert len(list((tmp_path / "s").glob(".client-*.staged"))) == 3  # staged, never applied
    C.assert_same(dict(mem.client_states), dict(disk.client_states), rtol=0.0, atol=0.0)
