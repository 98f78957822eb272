"""Failing ranks under torchrun (gloo, CPU).

* SIGTERM to one rank stops every rank after the same round with a checkpoint, and ``--resume``
  under torchrun continues exactly (default suite): bit for bit the run of the same 2 processes
  that was never stopped (metrics, server and client states, ledger).
* SIGKILL of one rank stops every process within 30 s; the checkpoint of 2 processes then
  resumes on 3 processes and under the sequential executor (slow).

Each resumed run also ends with the numbers of an uninterrupted sequential run (float64, to
rounding: the all-reduce sums in another order).  Bit-identity is asserted only against a run
with the same process count on the same machine.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedrisk.cli import main
from fedrisk.experiment import RunDir, resolve_config, run_experiment
from fedrisk.experiment.runner import load_checkpoint
from fedrisk.runtime.distributed import free_port

from .conftest import records, without_time, write_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from _distributed_cases import assert_same  # the tree comparison of the distributed cases

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the ranks through /proc (Linux)")


def _torchrun(world: int, config: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "FEDRISK_COLLECTIVE_TIMEOUT_S": "20"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "fedrisk", "run", str(config), "--out", str(out), "--quiet",
           "--set", "run.executor=distributed", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (from the parent ids in /proc/*/stat)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = children
    return found


def _rank_pid(root: int, rank: int) -> int | None:
    """The pid of worker ``rank`` below the torchrun process ``root``."""
    for pid in _descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"fedrisk" in cmdline and b"torch.distributed.run" not in cmdline:
            return pid
    return None


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


def _start(tmp_path: Path, tiny: dict) -> tuple[dict, Path, Path, subprocess.Popen]:
    """A 2-process SCAFFOLD run (float64, 30 rounds, checkpoints every 2), once it has written a
    checkpoint."""
    tiny["model"] = {"name": "mlp", "hidden": [32]}
    tiny["algorithm"].update({"name": "scaffold", "local_steps": 20})
    tiny["run"].update({"dtype": "float64", "rounds": 30, "checkpoint_every": 2, "eval_every": 2})
    config = write_config(tmp_path / "ranks.toml", tiny)
    out = tmp_path / "stopped"
    proc = _torchrun(2, config, out)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").is_file() and len(records(out)) >= 2 and RunDir(out).status() == "checkpointed":
            break
        time.sleep(0.05)
    return tiny, config, out, proc


def _check_resumed(tiny: dict, tmp_path: Path, run_dir: Path) -> None:
    """``run_dir`` ends with the numbers of an uninterrupted sequential run."""
    reference = without_time(
        run_experiment(resolve_config(tiny), tmp_path / f"ref-{run_dir.name}", progress="none").history.records
    )
    got = without_time(records(run_dir))
    assert [r["round"] for r in got] == [r["round"] for r in reference]
    for a, b in zip(got, reference):
        assert a["test_accuracy"] == b["test_accuracy"] and a["bytes_up"] == b["bytes_up"]
        assert a["test_log_loss"] == pytest.approx(b["test_log_loss"], rel=1e-9)


def _assert_same_run(resumed: Path, uninterrupted: Path, rounds: int) -> None:
    """``resumed`` equals ``uninterrupted`` bit for bit: every metrics record (but its wall
    time) and the final checkpoint's server state, client states and ledger."""
    assert without_time(records(resumed)) == without_time(records(uninterrupted))
    a, b = load_checkpoint(resumed / "checkpoint.pt"), load_checkpoint(uninterrupted / "checkpoint.pt")
    assert a["round"] == b["round"] == rounds
    for part in ("server_state", "client_states", "ledger", "round"):
        assert_same(a["simulation"][part], b["simulation"][part], rtol=0.0, atol=0.0, path=part)  # bit for bit


def test_sigterm_to_one_rank_stops_all_after_one_round_then_resume(tmp_path, tiny):
    tiny, config, out, proc = _start(tmp_path, tiny)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None, "the run ended before a rank could be signalled"
    os.kill(victim, signal.SIGTERM)
    code, err = _finish(proc, timeout=120)
    assert code != 0, err[-2000:]
    # the run stops after a completed round with its checkpoint (rank 0 learns of the signal through
    # any_rank, or from torchrun, which forwards SIGTERM to the other workers once one has exited)
    stop = re.search(r"SIGTERM received: stopped after round (\d+); checkpoint written", err)
    assert stop is not None, err[-3000:]
    assert "src/fedrisk" not in err, err[-3000:]  # no traceback through fedrisk (torchrun prints its own)
    assert RunDir(out).status() == "checkpointed"
    assert load_checkpoint(out / "checkpoint.pt")["round"] == int(stop.group(1)) < 30  # stopped part-way
    code, err = _finish(_torchrun(2, config, out, "--resume"), timeout=300)
    assert code == 0, err[-3000:]
    _check_resumed(tiny, tmp_path, out)
    # bit for bit the uninterrupted run of the same 2 processes on this machine
    uninterrupted = tmp_path / "uninterrupted"
    code, err = _finish(_torchrun(2, config, uninterrupted), timeout=300)
    assert code == 0, err[-3000:]
    _assert_same_run(out, uninterrupted, tiny["run"]["rounds"])


@pytest.mark.slow
def test_killed_rank_stops_every_process_then_resume_anywhere(tmp_path, tiny):
    tiny, config, out, proc = _start(tmp_path, tiny)
    victim = _rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None, "the run ended before a rank could be killed"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    code, err = _finish(proc, timeout=60)
    stopped_after = time.monotonic() - killed_at
    assert code != 0 and stopped_after < 30, (code, stopped_after, err[-2000:])
    assert RunDir(out).status() == "checkpointed"
    # the checkpoint of 2 processes resumes on 3 processes and on the sequential executor
    three = tmp_path / "three"
    shutil.copytree(out, three)
    code, err = _finish(_torchrun(3, config, three, "--resume"), timeout=300)
    assert code == 0, err[-3000:]
    _check_resumed(tiny, tmp_path, three)
    seq = tmp_path / "sequential"
    shutil.copytree(out, seq)
    assert main(["run", str(config), "--out", str(seq), "--resume", "--quiet", "--set", "run.executor=sequential"]) == 0
    _check_resumed(tiny, tmp_path, seq)
