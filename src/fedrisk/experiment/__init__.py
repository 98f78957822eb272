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

from fedrisk.experiment.config import ExperimentConfig, load_config, resolve_config
from fedrisk.experiment.outputs import RunDir, load_run
from fedrisk.experiment.progress import Progress
from fedrisk.experiment.report import make_report
from fedrisk.experiment.runner import RunInterrupted, RunResult, build_simulation, run_experiment
from fedrisk.experiment.sweep import SweepInterrupted, expand_sweep, run_sweep

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
