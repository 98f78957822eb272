"""Shared tiny configs for the experiment-layer tests (digits, 3 clients, logreg, few rounds)."""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import torch

from fedrisk.experiment.progress import Progress

TINY: dict[str, Any] = {
    "data": {"dataset": "digits", "num_clients": 3, "partition": "dirichlet", "partition_options": {"alpha": 0.5}},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 3, "batch_size": 16},
    "run": {"rounds": 4, "threads": 1, "checkpoint_every": 2},
    "output": {"plots": False},
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and two threads crawl on a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("FEDRISK_TEST_THREADS", "0")) or 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny() -> dict[str, Any]:
    """A fresh copy of the tiny raw config."""
    return copy.deepcopy(TINY)


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(raw))
    return path


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def without_time(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without wall_time (the only value allowed to differ between equal runs)."""
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in recs]


def interrupt_at(monkeypatch, round_: int, signum: int = signal.SIGTERM) -> None:
    """Deliver a real ``signum`` to this process right after round ``round_`` (before its
    evaluation and checkpoint hooks run)."""
    original = Progress.on_round_end

    def hook(self, sim, report):
        original(self, sim, report)
        if sim.round == round_:
            signal.raise_signal(signum)

    monkeypatch.setattr(Progress, "on_round_end", hook)


def crash_at(monkeypatch, round_: int) -> None:
    """A hard failure (no checkpoint on the way out) after round ``round_``."""
    original = Progress.on_round_end

    def hook(self, sim, report):
        original(self, sim, report)
        if sim.round == round_:
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(Progress, "on_round_end", hook)
