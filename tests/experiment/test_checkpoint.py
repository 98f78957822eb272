"""Checked, safe checkpoints: a crafted file is refused without running anything, a truncated or
bit-flipped newest checkpoint falls back to the previous one (with a warning) and the resumed
run still equals the uninterrupted one, every algorithm's state loads with the restricted
unpickler, and resume restores the global torch / NumPy / Python generators."""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment import RunInterrupted, resolve_config, run_experiment
from fedrisk.experiment.checkpoint import (
    MAGIC,
    CheckpointError,
    CheckpointWarning,
    UnsafeCheckpointError,
    encode,
    load_newest,
    pack_global_rng,
    previous_path,
    read_checkpoint,
    unpack_global_rng,
    verify,
    write_checkpoint,
)
from fedrisk.experiment.progress import Progress

from .conftest import interrupt_at, records, without_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _distributed_cases as C


class Sentinel:
    """Unpickling this creates a file: proof that loading ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _run_two_checkpoints(tiny, tmp_path, monkeypatch) -> tuple:
    """An uninterrupted 4-round run, and one interrupted after round 3 with checkpoints at rounds
    2 and 3 (checkpoint_every = 2): ``checkpoint.pt`` holds round 3, ``.prev`` round 2."""
    cfg = resolve_config(tiny)
    full = run_experiment(cfg, tmp_path / "full", progress="none")
    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "r", progress="none")
    return cfg, full, tmp_path / "r" / "checkpoint.pt"


def test_crafted_checkpoint_is_refused_and_nothing_runs(tiny, tmp_path, monkeypatch):
    cfg, _, ckpt = _run_two_checkpoints(tiny, tmp_path, monkeypatch)
    sentinel = tmp_path / "code-ran"
    evil = {"format": 1, "config": {}, "x": Sentinel(sentinel)}
    buf = io.BytesIO()
    torch.save(evil, buf)
    # (a) a bare torch.save file, as fedrisk wrote before manifests; (b) one with a valid manifest
    for data in (buf.getvalue(), encode(evil, round=3)):
        ckpt.write_bytes(data)
        refused = r"refused to load .*checkpoint.pt.*Nothing from it was executed"
        with pytest.raises(UnsafeCheckpointError, match=refused):
            run_experiment(cfg, ckpt.parent, resume=True, progress="none")
        assert not sentinel.exists()
    # an unsafe file is never skipped in favour of the previous one: someone replaced the checkpoint
    assert verify(previous_path(ckpt)) is None
    # the sentinel really runs code when loaded without the restriction (the test is not vacuous)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert sentinel.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "manifest"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tiny, tmp_path, monkeypatch, damage):
    cfg, full, ckpt = _run_two_checkpoints(tiny, tmp_path, monkeypatch)
    data = bytearray(ckpt.read_bytes())
    if damage == "truncate":
        data = data[: len(data) * 2 // 3]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "empty":
        data = bytearray()
    else:  # the manifest line names another digest
        data[len(MAGIC) + data[len(MAGIC) :].index(b'"sha256": "') + 11] ^= 0x01
    ckpt.write_bytes(bytes(data))
    (ckpt.parent / ".checkpoint.pt.stale.tmp").write_bytes(b"left by a killed writer")
    reason = {"truncate": "truncated", "flip": "SHA-256", "empty": "truncated", "manifest": "SHA-256"}[damage]
    with pytest.warns(CheckpointWarning, match=rf"checkpoint.pt .*{reason}.*resuming from the previous checkpoint"):
        resumed = run_experiment(cfg, ckpt.parent, resume=True, progress="none")
    assert resumed.summary["rounds"] == 4
    assert without_time(records(ckpt.parent)) == without_time(records(full.path))


def test_no_usable_checkpoint_names_every_file(tiny, tmp_path, monkeypatch):
    cfg, _, ckpt = _run_two_checkpoints(tiny, tmp_path, monkeypatch)
    for p in (ckpt, previous_path(ckpt)):
        p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(FedriskError, match=r"no usable checkpoint: .*checkpoint.pt is truncated.*\.prev is truncated"):
        run_experiment(cfg, ckpt.parent, resume=True, progress="none")


def test_write_keeps_the_previous_good_file_only(tmp_path):
    path = tmp_path / "c.pt"
    write_checkpoint(path, {"round": 1}, round=1)
    assert not previous_path(path).exists()
    write_checkpoint(path, {"round": 2}, round=2)
    path.write_bytes(path.read_bytes()[:-3])  # the newest (round 2) is damaged
    write_checkpoint(path, {"round": 3}, round=3)  # a damaged file never becomes the fallback
    assert read_checkpoint(path) == {"round": 3} and read_checkpoint(previous_path(path)) == {"round": 1}
    write_checkpoint(path, {"round": 4}, round=4)
    assert read_checkpoint(previous_path(path)) == {"round": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "c.pt.prev"]  # no temporary files left


def test_reader_errors(tmp_path):
    missing = tmp_path / "none.pt"
    with pytest.raises(CheckpointError, match=r"no usable checkpoint: .*none.pt does not exist"):
        load_newest(missing)
    text = tmp_path / "t.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match=r"t.pt is not a fedrisk checkpoint"):
        read_checkpoint(text)
    long = tmp_path / "long.pt"
    long.write_bytes(encode({"a": 1}) + b"x")
    assert "1 bytes more than its manifest says" in verify(long)
    garbage = tmp_path / "zip.pt"
    garbage.write_bytes(b"PK\x03\x04" + os.urandom(64))
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        read_checkpoint(garbage)


def test_every_algorithm_state_loads_with_the_restricted_unpickler(tmp_path):
    """The state of every registered algorithm (and the toys with pools and tensors of ints)
    after a round survives the round trip bit for bit: no type outside the allow-list."""
    names = []
    for case in C.cases():
        if case.skip or not case.name.startswith(("alg/", "toy/")) or case.name.endswith("/partial"):
            continue
        alg, fed, kwargs = case.build()
        sim = C.Simulation(alg, fed, seed=C.SEED, dtype=torch.float64, **kwargs)
        with contextlib.suppress(FedriskError):  # the faulty toys stop the run; their state is still a state
            sim.step()
        state = {"simulation": sim.state_dict(), "rng": pack_global_rng()}
        write_checkpoint(tmp_path / "c.pt", state, round=1)
        back = read_checkpoint(tmp_path / "c.pt")
        C.assert_same(state["simulation"], back["simulation"], rtol=0.0, atol=0.0, path=case.name)
        names.append(case.name)
    assert {"alg/fedavg", "alg/scaffold", "alg/codasca", "toy/score_pool"} <= set(names)


def test_global_generators_round_trip():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.standard_normal()  # NumPy caches a Gaussian: part of its state
    packed = pack_global_rng()
    want = (torch.rand(3), np.random.standard_normal(3), [random.random() for _ in range(3)])
    unpack_global_rng(packed)
    got = (torch.rand(3), np.random.standard_normal(3), [random.random() for _ in range(3)])
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_resume_restores_the_global_generators(tiny, tmp_path, monkeypatch):
    """Code drawing from the global generators (here: a callback each round) draws the same
    numbers in a resumed run as in the uninterrupted one, however the generators were left."""
    draws: list[tuple] = []
    original = Progress.on_round_end

    def hook(self, sim, report):
        original(self, sim, report)
        draws.append((sim.round, float(torch.rand(())), float(np.random.rand()), random.random()))

    monkeypatch.setattr(Progress, "on_round_end", hook)
    cfg = resolve_config(tiny)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    run_experiment(cfg, tmp_path / "full", progress="none")
    full, draws[:] = list(draws), []
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    with monkeypatch.context() as m:
        interrupt_at(m, 2)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "r", progress="none")
    torch.manual_seed(99), np.random.seed(99), random.seed(99)  # whatever ran in between
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        run_experiment(cfg, tmp_path / "r", resume=True, progress="none")
    assert [d[0] for d in draws] == [1, 2, 3, 4]
    assert draws == full
