"""Experiments from config to report: validated TOML configs, the runner (progress,
``metrics.jsonl``, checkpoints with exact resume), sweeps and reports.

Example:
    >>> import tempfile
    >>> from fedrisk.experiment import resolve_config, run_experiment
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 2}, "run": {"rounds": 1},
    ...                       "output": {"plots": False}})
    >>> run_experiment(cfg, tempfile.mkdtemp(), progress="none").summary["rounds"]
    1
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "ExperimentConfig": "config",
    "load_config": "config",
    "resolve_config": "config",
    "RunDir": "outputs",
    "load_run": "outputs",
    "Progress": "progress",
    "make_report": "report",
    "RunInterrupted": "runner",
    "RunResult": "runner",
    "build_simulation": "runner",
    "run_experiment": "runner",
    "SweepInterrupted": "sweep",
    "expand_sweep": "sweep",
    "run_sweep": "sweep",
}


def __getattr__(name: str) -> Any:  # lazy: `fedrisk.experiment.config` (the CLI's) does not import torch
    if name in _HOMES:
        return getattr(importlib.import_module(f"fedrisk.experiment.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'fedrisk.experiment' has no attribute {name!r}")


__all__ = [
    "ExperimentConfig",
    "Progress",
    "RunDir",
    "RunInterrupted",
    "RunResult",
    "SweepInterrupted",
    "build_simulation",
    "expand_sweep",
    "load_config",
    "load_run",
    "make_report",
    "resolve_config",
    "run_experiment",
    "run_sweep",
]
