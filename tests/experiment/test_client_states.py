"""``run.client_states = "disk"`` (issue 14, item 8): the experiment layer keeps the client
states in ``<run dir>/client_states``; a checkpoint links them (a snapshot with a per-file
SHA-256 manifest) instead of loading them, only the snapshots of the newest and the previous
checkpoint are kept, and an interrupted run resumes to the numbers of an uninterrupted run in
memory."""

from __future__ import annotations

import shutil

import pytest

from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config, run_experiment
from fedrisk.experiment.checkpoint import CheckpointWarning, previous_path, read_checkpoint, read_manifest
from fedrisk.experiment.runner import RunInterrupted
from fedrisk.runtime.client_store import is_snapshot_ref

from .conftest import interrupt_at, records, without_time


def _scaffold(tiny: dict, client_states: str) -> dict:
    tiny["algorithm"].update({"name": "scaffold", "clients_per_round": 2})
    tiny["run"].update({"rounds": 5, "checkpoint_every": 1, "client_states": client_states})
    return tiny


def _interrupted_disk_run(tiny: dict, out, monkeypatch):
    """A SCAFFOLD run with its client states on disk, interrupted after round 3's checkpoint."""
    cfg = resolve_config(_scaffold(tiny, "disk"))
    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, out, progress="none")
    return cfg


def test_disk_states_resume_like_memory(tiny, tmp_path, monkeypatch):
    memory = run_experiment(resolve_config(_scaffold(tiny, "memory")), tmp_path / "memory", progress="none")
    out = tmp_path / "disk"
    cfg = _interrupted_disk_run(tiny, out, monkeypatch)
    ckpt = out / "checkpoint.pt"
    state = read_checkpoint(ckpt)["simulation"]["client_states"]
    assert is_snapshot_ref(state) and set(state) == {"store", "snapshot", "sha256"}  # linked, not loaded
    kept = sorted(p.name for p in (out / "client_states" / "snapshots").iterdir())
    named = sorted(read_manifest(p)["states_snapshot"] for p in (ckpt, previous_path(ckpt)))
    assert kept == named and len(kept) == 2  # the newest and the previous checkpoint's only
    resumed = run_experiment(cfg, out, resume=True, progress="none")
    assert resumed.summary["rounds"] == 5
    assert without_time(records(out)) == without_time(records(memory.path))


def test_client_states_key_is_checked(tiny):
    with pytest.raises(FedriskError, match=r'run.client_states = "ram" is not a known name; valid choices: disk, m'):
        resolve_config(_scaffold(tiny, "ram"))
    tiny = _scaffold(tiny, "disk")
    tiny["run"]["executor"] = "distributed"
    from fedrisk.experiment.runner import build_simulation

    with pytest.raises(FedriskError, match=r'client_states = "disk" works with the sequential and vectorized'):
        build_simulation(resolve_config(tiny))


def _damage(path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:  # one bit flipped in place
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))


def _fresh_file(out):
    """A state file of the newest checkpoint's snapshot that the previous one does not share
    (written in the last round before the checkpoint: hard links make unchanged files one file)."""
    ckpt = out / "checkpoint.pt"
    new = read_checkpoint(ckpt)["simulation"]["client_states"]
    old = read_checkpoint(previous_path(ckpt))["simulation"]["client_states"]
    k = next(k for k, d in sorted(new["sha256"].items()) if old["sha256"].get(k) != d)
    return out / "client_states" / "snapshots" / new["snapshot"] / f"client-{k}.pt", old["snapshot"]


@pytest.mark.parametrize("how", ["missing", "truncated", "bit-flipped"])
def test_damaged_snapshot_falls_back_to_the_previous_checkpoint(tiny, tmp_path, monkeypatch, how):
    memory = run_experiment(resolve_config(_scaffold(tiny, "memory")), tmp_path / "memory", progress="none")
    out = tmp_path / "disk"
    cfg = _interrupted_disk_run(tiny, out, monkeypatch)
    damaged, previous = _fresh_file(out)
    _damage(damaged, how)
    with (
        monkeypatch.context() as m,
        pytest.warns(CheckpointWarning, match=rf"{damaged.name}\) is (missing|corrupted).*resuming from the previous"),
    ):
        interrupt_at(m, 3)  # the resumed run redoes round 3
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, out, resume=True, progress="none")
    # the unusable round-3 checkpoint was replaced by round 2's: the next checkpoint keeps that one
    ckpt = out / "checkpoint.pt"
    assert [read_manifest(p)["round"] for p in (ckpt, previous_path(ckpt))] == [3, 2]
    assert read_manifest(previous_path(ckpt))["states_snapshot"] == previous
    resumed = run_experiment(cfg, out, resume=True, progress="none")
    assert resumed.summary["rounds"] == 5
    assert without_time(records(out)) == without_time(records(memory.path))  # bit for bit


def test_unusable_snapshots_everywhere_name_both(tiny, tmp_path, monkeypatch):
    out = tmp_path / "disk"
    cfg = _interrupted_disk_run(tiny, out, monkeypatch)
    damaged, previous = _fresh_file(out)
    damaged.unlink()
    shutil.rmtree(out / "client_states" / "snapshots" / previous)
    both = r"no usable checkpoint: .*client-\d+\.pt\) is missing; .*snapshots/snap-\w+ are missing"
    with pytest.raises(FedriskError, match=both):
        run_experiment(cfg, out, resume=True, progress="none")


def test_vectorized_disk_states_equal_memory(tiny, tmp_path):
    """Under the vectorised executor each block's new states are staged as files and renamed
    into place when the round is applied: the run equals the sequential run in memory."""
    memory = run_experiment(resolve_config(_scaffold(tiny, "memory")), tmp_path / "memory", progress="none")
    tiny["run"]["executor"] = "vectorized"
    disk = run_experiment(resolve_config(_scaffold(tiny, "disk")), tmp_path / "disk", progress="none")
    assert disk.summary["rounds"] == 5
    assert len(list((tmp_path / "disk" / "client_states").glob("client-*.pt"))) == tiny["data"]["num_clients"]
    want, got = without_time(records(memory.path)), without_time(records(disk.path))
    assert len(got) == len(want) and all(g.keys() == w.keys() for g, w in zip(got, want))
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-6, abs=1e-9)
