"""kill -9 anywhere: a run killed with SIGKILL (at random moments, and at every phase of a
checkpoint write) and resumed with ``--resume`` ends with metrics bit-identical to an
uninterrupted run (every random stream restored, client sampling included).

The default suite kills a run twice at random moments and in two phases of a checkpoint write
(mid-write and between the two renames); ``pytest tests/experiment/test_kill.py`` (slow ones
included) runs 5 seeds x 5 kills and every phase.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedrisk.experiment import RunDir, resolve_config, run_experiment
from fedrisk.experiment.checkpoint import previous_path, verify

from .conftest import records, without_time, write_config

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().parent / "_killed_writer.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and SIGKILL (Linux)")


def _config(tiny: dict, tmp_path: Path, client_states: str = "memory") -> tuple[dict, Path]:
    # partial participation: the client sampling stream must be restored too
    tiny["algorithm"].update({"name": "scaffold", "clients_per_round": 2, "local_steps": 5})
    tiny["run"].update({"rounds": 8, "checkpoint_every": 1, "eval_every": 1, "client_states": client_states})
    return tiny, write_config(tmp_path / "kill.toml", tiny)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def _mode(out: Path) -> list[str]:
    status = RunDir(out).status()
    return {"checkpointed": ["--resume"], "started": ["--overwrite"]}.get(status, [])


def _run_args(config: Path, out: Path) -> list[str]:
    return ["run", str(config), "--out", str(out), "--quiet", *_mode(out)]


def _finish(config: Path, out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedrisk", *_run_args(config, out)], env=_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def _reference(tiny: dict, tmp_path: Path) -> list[dict]:
    return without_time(run_experiment(resolve_config(tiny), tmp_path / "reference", progress="none").history.records)


def _kill_at_random(config: Path, out: Path, rng: random.Random) -> None:
    """Start the run (resuming when there is a checkpoint), wait until it has made progress,
    then SIGKILL it after a random delay of up to 0.2 s."""
    before = len(records(out)) if (out / "metrics.jsonl").is_file() else 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedrisk", *_run_args(config, out)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").is_file() and len(records(out)) > min(before, 1):
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.2))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _kill_and_resume(tiny: dict, tmp_path: Path, seed: int, kills: int, client_states: str = "memory") -> None:
    tiny, config = _config(tiny, tmp_path, client_states)
    out = tmp_path / "killed"
    rng = random.Random(seed)
    for _ in range(kills):
        _kill_at_random(config, out, rng)
        if RunDir(out).status() == "finished":
            break
    if RunDir(out).status() != "finished":
        _finish(config, out)
    tiny["run"]["client_states"] = "memory"  # the reference keeps its states in memory
    assert without_time(records(out)) == _reference(tiny, tmp_path)


def test_sigkill_at_random_moments_then_resume_is_exact(tiny, tmp_path):
    _kill_and_resume(tiny, tmp_path, seed=0, kills=2)


def test_sigkill_with_client_states_on_disk_then_resume_is_exact(tiny, tmp_path):
    """run.client_states = "disk": the killed run's state files move on past its checkpoint;
    the resume restores the checkpoint's snapshot."""
    _kill_and_resume(tiny, tmp_path, seed=1, kills=2, client_states="disk")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_sigkill_with_staged_client_states_vectorized(tiny, tmp_path, seed):
    """The vectorised executor stages a round's new states as files before the round is
    applied: a kill leaves staged files behind, which the resume must ignore."""
    tiny["run"]["executor"] = "vectorized"
    _kill_and_resume(tiny, tmp_path, seed=20 + seed, kills=4, client_states="disk")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_sigkill_with_client_states_on_disk_full(tiny, tmp_path, seed):
    _kill_and_resume(tiny, tmp_path, seed=10 + seed, kills=5, client_states="disk")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_sigkill_at_random_moments_full(tiny, tmp_path, seed):
    _kill_and_resume(tiny, tmp_path, seed=seed, kills=5)


@pytest.mark.parametrize(
    "phase",
    [
        "torn",
        "prev_kept",
        pytest.param("tmp_written", marks=pytest.mark.slow),
        pytest.param("replaced", marks=pytest.mark.slow),
    ],
)
def test_sigkill_during_a_checkpoint_write_then_resume_is_exact(tiny, tmp_path, phase):
    """Killed in the 4th checkpoint write (after round 4): the files left behind are a complete
    newest and previous checkpoint (round 3 or 4, and the one before), and the resumed run is
    exact."""
    tiny, config = _config(tiny, tmp_path)
    out = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, str(WRITER), phase, "4", "--", "run", str(config), "--out", str(out), "--quiet"],
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpt = out / "checkpoint.pt"
    assert verify(ckpt) is None and verify(previous_path(ckpt)) is None
    _finish(config, out)
    assert without_time(records(out)) == _reference(tiny, tmp_path)
