"""Client states on disk (``Simulation(..., client_store=FOLDER)``): the same numbers as in
memory, bit for bit, under the sequential and the vectorised executor; only clients that took
part get a file; a checkpoint of a disk-backed run resumes; files are read without running code."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms.scaffold import Scaffold
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.client_store import DiskClientStates
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
    full = _sim("sequential", tmp_path / "a")
    for _ in range(4):
        full.step()
    first = _sim("sequential", tmp_path / "b")
    for _ in range(2):
        first.step()
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    resumed = _sim("sequential", tmp_path / "c")
    resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
    for _ in range(2):
        resumed.step()
    C.assert_same(full.server_state, resumed.server_state, rtol=0.0, atol=0.0)
    C.assert_same(dict(full.client_states), dict(resumed.client_states), rtol=0.0, atol=0.0)


def test_store_refuses_unsafe_files_and_bad_ids(tmp_path: Path) -> None:
    store = DiskClientStates(tmp_path, 2, initial=lambda k: {})

    class Evil:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    torch.save({"x": Evil()}, store.path(1))
    with pytest.raises(FedriskError, match=r"cannot read the state of client 1"):
        store[1]
    assert not (tmp_path / "ran").exists()
    with pytest.raises(KeyError):
        store[2]
