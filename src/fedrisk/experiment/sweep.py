"""Sweeps: variants × grid × seeds, each run in its own directory, then one report.

A sweep expands into points ``DIR/<label>/seed=<s>/`` where the label names the variant and
the grid values (``scaffold``, ``algorithm.lr=0.1``, ``scaffold,algorithm.lr=0.1``; runs of a
sweep without grid and variants go to ``DIR/seed=<s>/``).  Every point is validated before
the first one starts.  Points run one after another in this process, or ``jobs`` at a time as
``python -m fedrisk run`` subprocesses (each logs to ``<point>/sweep.log``; torch threads are
shared out between them).  A point that already finished is skipped and an interrupted one is
resumed, so re-running a sweep command continues it.  The report (``report.md`` and the
comparison plots) is written into ``DIR`` at the end.

Resolved ambiguities: a key set both by a variant and by the grid is an error (which should
win is not obvious); labels show values as TOML would write them, with ``/`` replaced by ``_``.

Example:
    >>> from fedrisk.experiment.config import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits"}})
    >>> pts = expand_sweep(cfg, "runs/s", grid={"algorithm.lr": [0.05, 0.1]}, seeds=[0, 1])
    >>> [str(p.path) for p in pts][:2]
    ['runs/s/algorithm.lr=0.05/seed=0', 'runs/s/algorithm.lr=0.05/seed=1']
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import tomli_w

from fedrisk.data.build import reuse_federations
from fedrisk.errors import FedriskError
from fedrisk.experiment.callbacks import SIGNAL_NAMES
from fedrisk.experiment.config import ExperimentConfig, flatten
from fedrisk.experiment.outputs import RunDir, atomic_write_text
from fedrisk.experiment.report import Report, make_report
from fedrisk.experiment.runner import RunInterrupted, run_experiment
from fedrisk.experiment.schema import to_toml_value

SWEEP_CONFIG = "sweep.toml"
POINT_LOG = "sweep.log"


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep."""

    label: str
    overrides: dict[str, Any]
    seed: int
    path: Path
    config: ExperimentConfig = field(compare=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.label + ' ' if self.label else ''}seed={self.seed}"


class SweepInterrupted(Exception):
    """SIGINT / SIGTERM stopped a sweep (its runs wrote checkpoints); re-run to continue."""

    def __init__(self, signum: int, out: Path) -> None:
        self.signum = signum
        name = SIGNAL_NAMES.get(signum, f"signal {signum}")
        super().__init__(f"{name} received: sweep stopped; run the same sweep command again to continue ({out})")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


def toml_literal(value: Any) -> str:
    """A value as a TOML literal for ``--set`` (inline tables for dicts).

    Example:
        >>> toml_literal({"name": "median"}), toml_literal([1, 2.5]), toml_literal("a/b")
        ('{name = "median"}', '[1, 2.5]', '"a/b"')
    """
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise FedriskError(f"cannot write {value!r} as a TOML value")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def label_value(value: Any) -> str:
    """A value as it appears in a sweep directory name."""
    text = value if isinstance(value, str) else toml_literal(value).replace(", ", ",")
    return text.replace("/", "_").replace(os.sep, "_")


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["algorithm.lr=0.01,0.1"]`` -> ``{"algorithm.lr": [0.01, 0.1]}`` (commas inside
    brackets, braces or quotes do not split).

    Example:
        >>> parse_grid(["algorithm.lr=0.01,0.1", "model.hidden=[64],[64,32]"])
        {'algorithm.lr': [0.01, 0.1], 'model.hidden': [[64], [64, 32]]}
    """
    from fedrisk.experiment.config import parse_literal

    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        parts = _split_top(text)
        if not sep or not key or any(not k for k in key.split(".")) or any(not p.strip() for p in parts):
            raise FedriskError(
                f"--grid expects key=v1,v2,... with a dotted key and non-empty values "
                f"(e.g. algorithm.lr=0.01,0.1); got {item!r}"
            )
        grid[key] = [parse_literal(p.strip()) for p in parts]
    return grid


def _split_top(text: str) -> list[str]:
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return parts


def expand_sweep(
    cfg: ExperimentConfig,
    out: str | Path,
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    seeds: Sequence[int] | None = None,
) -> list[SweepPoint]:
    """Every (variant, grid point, seed), validated.  Defaults: no grid, no variants, the
    config's own seed."""
    out = Path(out)
    grid = dict(grid or {})
    variants = {name: flatten(v) for name, v in (variants or {}).items()}
    seeds = list(seeds) if seeds is not None else [cfg["run.seed"]]
    for name, over in variants.items():
        both = sorted(set(over) & set(grid))
        if both:
            raise FedriskError(
                f"sweep: {', '.join(both)} set both by variant {name!r} and by the grid; set it in one place"
            )
    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys))) if keys else [()]
    points: list[SweepPoint] = []
    seen: dict[str, dict[str, Any]] = {}
    for vname, vover in variants.items() if variants else [("", {})]:
        for combo in combos:
            over = {**vover, **dict(zip(keys, combo))}
            label = ",".join(([vname] if vname else []) + [f"{k}={label_value(v)}" for k, v in zip(keys, combo)])
            if label in seen and seen[label] != over:
                raise FedriskError(f"sweep: two points share the directory name {label!r}; make their values distinct")
            seen[label] = over
            for s in seeds:
                try:
                    point_cfg = cfg.with_overrides({**over, "run.seed": s, "run.seeds": []})
                except FedriskError as exc:
                    where = f"sweep point {label or '(base)'} seed={s}"
                    raise FedriskError(f"{where}: {exc}") from None
                base = out / label if label else out
                points.append(SweepPoint(label, over, s, base / f"seed={s}", point_cfg))
    return points


@dataclass
class SweepResult:
    """What a sweep did: the points, those that failed (with messages) and the report."""

    points: list[SweepPoint]
    skipped: list[SweepPoint]
    failed: list[tuple[SweepPoint, str]]
    report: Report | None


def run_sweep(
    cfg: ExperimentConfig,
    out: str | Path,
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    seeds: Sequence[int] | None = None,
    jobs: int = 1,
    progress: str = "auto",
    stream: TextIO | None = None,
    echo: Callable[[str], None] | None = None,
) -> SweepResult:
    """Run every point of the sweep (skipping finished ones, resuming interrupted ones) and
    write the report into ``out``.

    Raises:
        SweepInterrupted / RunInterrupted: on SIGINT / SIGTERM (checkpoints written).
    """
    out = Path(out)
    stream = stream if stream is not None else sys.stderr
    if echo is None:
        echo = (lambda line: None) if progress == "none" else (lambda line: print(line, file=stream, flush=True))
    points = expand_sweep(cfg, out, grid=grid, variants=variants, seeds=seeds)
    out.mkdir(parents=True, exist_ok=True)
    _write_sweep_config(cfg, out, grid, variants, seeds)
    skipped = [p for p in points if RunDir(p.path).status() == "finished"]
    todo = [p for p in points if p not in skipped]
    echo(f"sweep: {len(points)} run(s) in {out} ({len(skipped)} already finished, {len(todo)} to run, jobs={jobs})")
    if jobs <= 1:
        failed = _run_sequential(todo, out, progress, stream, echo)
    else:
        failed = _run_parallel(todo, len(points), out, jobs, cfg, echo)
    done = [p.path for p in points if _has_records(RunDir(p.path))]
    report = make_report(done, out=out) if done else None
    return SweepResult(points, skipped, failed, report)


TUNED_FILE = "tuned.json"
"""Written beside a tuned variant's seed runs (``DIR/<variant>/tuned.json``): the selected values."""


@reuse_federations(capacity=1)  # variants on the same data share one build of it
def run_tuned_sweep(
    cfg: ExperimentConfig,
    out: str | Path,
    *,
    trials: int,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    seeds: Sequence[int] | None = None,
    jobs: int = 1,
    progress: str = "auto",
    stream: TextIO | None = None,
    fixed: Sequence[str] = (),
) -> SweepResult:
    """Tune every variant separately (``trials`` trials each, its own ``tune.keys`` of the shared
    ``[tune.space]``, studies in ``DIR/<variant>/tune/``), then run each variant's selected
    config over ``seeds`` (``DIR/<variant>/seed=<s>/``) and report.  Re-running continues: finished
    studies and runs are kept, interrupted ones resumed.

    Every variant is checked (its space and the metric) before the first trial starts; ``fixed``:
    the keys the command line sets, which no variant may tune (``tune_spec``).
    """
    from fedrisk.experiment.tune import has_study, run_tune, select_overrides, tune_spec

    out = Path(out)
    stream = stream if stream is not None else sys.stderr
    echo = (lambda line: None) if progress == "none" else (lambda line: print(line, file=stream, flush=True))
    named = {name: flatten(v) for name, v in (variants or {}).items()} or {"": {}}
    specs = {}
    for name, over in named.items():
        where = f"sweep variant {name!r}" if name else "the config"
        try:
            vcfg = cfg.with_overrides(over)
        except FedriskError as exc:
            raise FedriskError(f"{where}: {exc}") from None
        specs[name] = (vcfg, tune_spec(vcfg, trials=trials, where=where, fixed=fixed))
    dims = {name: len(spec.space) for name, (_, spec) in specs.items()}
    if len(set(dims.values())) > 1:
        echo(f"note: the variants tune different numbers of keys ({dims}); trials per variant are equal ({trials})")
    tuned: dict[str, dict[str, Any]] = {}
    for name, (vcfg, spec) in specs.items():
        folder = out / name if name else out
        study = folder / "tune"
        resume = has_study(study)
        shown = ", ".join(f"{k}={d.spec}" for k, d in spec.space.items())
        echo(f"tune {name or '(base)'}: {spec.trials} trials of {shown} on {spec.metric} -> {study}")
        result = run_tune(vcfg, study, spec, resume=resume, echo=lambda line, n=name: echo(f"  {n} {line}".rstrip()))
        tuned[name] = {**named[name], **result.best_params, **select_overrides(vcfg, spec.metric)}
        folder.mkdir(parents=True, exist_ok=True)
        info = {"params": result.best_params, "metric": spec.metric, "value": result.best_value, "trials": trials}
        atomic_write_text(folder / TUNED_FILE, json.dumps(info, indent=2) + "\n")
        picked = f"{shown_params(result.best_params)} ({spec.metric} = {result.best_value:.4f})"
        echo(f"tune {name or '(base)'}: selected {picked}")
        _reuse_best_trial(cfg, tuned[name], folder, seeds, result.best_run, echo)
    if named.keys() == {""}:
        return run_sweep(cfg.with_overrides(tuned[""]), out, seeds=seeds, jobs=jobs, progress=progress, stream=stream)
    return run_sweep(cfg, out, variants=tuned, seeds=seeds, jobs=jobs, progress=progress, stream=stream)


def _reuse_best_trial(cfg, overrides, folder, seeds, best_run, echo) -> None:
    """The study ran on ``run.seed``: when that seed is among the sweep's, its run is the best
    trial's run (the same config, seed and code: the same numbers), copied instead of repeated."""
    import shutil

    seed = cfg["run.seed"]
    point = RunDir(folder / f"seed={seed}")
    if seed not in (seeds or [seed]) or point.status() != "empty" or best_run is None:
        return
    trial = RunDir(best_run)
    if trial.status() != "finished":
        return
    want = cfg.with_overrides({**overrides, "run.seed": seed, "run.seeds": []}).semantic()
    from fedrisk.experiment.config import load_config

    if load_config(trial.config).semantic() != want:
        return
    shutil.copytree(trial.path, point.path, dirs_exist_ok=True)
    echo(f"  seed={seed}: the best trial's run ({trial.path}), copied to {point.path}")


def shown_params(params: Mapping[str, Any]) -> str:
    """``{"algorithm.lr": 0.0123456}`` -> ``"lr=0.01235"``.

    Example:
        >>> shown_params({"algorithm.lr": 0.0123456, "algorithm.lam": 10})
        'lr=0.01235, lam=10'
    """
    from fedrisk.experiment.tune import short

    return ", ".join(f"{k.rsplit('.', 1)[-1]}={short(v)}" for k, v in params.items())


def _has_records(rd: RunDir) -> bool:
    """A run to report: it has records, or it stopped with an error (failure.json; the worst-case
    table shows it)."""
    if not (rd.config.is_file() and rd.metrics.is_file()):
        return False
    return rd.metrics.stat().st_size > 0 or (rd.path / "failure.json").is_file()


def _write_sweep_config(cfg, out, grid, variants, seeds) -> None:
    raw = dict(cfg.raw)
    raw["sweep"] = {
        **dict(raw.get("sweep", {})),
        "seeds": list(seeds) if seeds is not None else [cfg["run.seed"]],
        "grid": {k: list(v) for k, v in (grid or {}).items()},
        "variants": {k: dict(v) for k, v in (variants or {}).items()},
    }
    atomic_write_text(
        out / SWEEP_CONFIG,
        "# The sweep as run (base config, grid, variants, seeds)\n" + tomli_w.dumps(to_toml_value(raw)),
    )


def _mode(p: SweepPoint) -> dict[str, bool]:
    status = RunDir(p.path).status()
    return {"resume": status == "checkpointed", "overwrite": status == "started"}


def _final_line(p: SweepPoint) -> str:
    rd = RunDir(p.path)
    try:
        summary = json.loads(rd.summary.read_text())
    except (OSError, json.JSONDecodeError):
        return ""
    from fedrisk.experiment.progress import format_number

    return " ".join(f"{k}={format_number(v)}" for k, v in summary.get("final", {}).items())


def _run_sequential(todo: list[SweepPoint], out: Path, progress: str, stream: TextIO, echo) -> list:
    failed = []
    for i, p in enumerate(todo, 1):
        mode = _mode(p)
        verb = "resuming" if mode["resume"] else "running"
        echo(f"[{i}/{len(todo)}] {verb} {p.name} -> {p.path}")
        try:
            result = run_experiment(
                p.config, p.path, progress=progress, stream=stream, label=p.name, seed=p.seed, **mode
            )
        except RunInterrupted:
            raise
        except FedriskError as exc:
            failed.append((p, str(exc)))
            echo(f"[{i}/{len(todo)}] FAILED {p.name}: {exc}")
            continue
        if result.signal is not None:  # the signal came as this run was finishing: start no other run
            raise SweepInterrupted(result.signal, out)
    return failed


def _run_parallel(todo, total, out, jobs, cfg, echo) -> list:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    extra_path = [str(cfg.source.parent.resolve())] if cfg.source is not None else []
    extra_path.append(str(Path.cwd()))
    env["PYTHONPATH"] = os.pathsep.join(extra_path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    sweep_file = out / SWEEP_CONFIG
    pending = deque(todo)
    running: dict[subprocess.Popen, tuple[SweepPoint, Any, float]] = {}
    failed: list[tuple[SweepPoint, str]] = []
    stop: list[int] = []
    count = 0

    def handler(signum: int, frame: Any) -> None:
        if not stop:
            stop.append(signum)
            echo(f"{SIGNAL_NAMES.get(signum, signum)} received: stopping the running runs (they write checkpoints)")
            for proc in running:
                proc.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        while running or (pending and not stop):
            while pending and len(running) < jobs and not stop:
                p = pending.popleft()
                mode = _mode(p)
                cmd = [sys.executable, "-m", "fedrisk", "run", str(sweep_file), "--out", str(p.path), "--plain"]
                for k, v in {**p.overrides, "run.seed": p.seed, "run.seeds": []}.items():
                    cmd += ["--set", f"{k}={toml_literal(v)}"]
                if mode["resume"]:
                    cmd.append("--resume")
                if mode["overwrite"]:
                    cmd.append("--overwrite")
                p.path.mkdir(parents=True, exist_ok=True)
                log = open(p.path / POINT_LOG, "w")  # noqa: SIM115 - closed when the process ends
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[proc] = (p, log, time.perf_counter())
                echo(f"started {p.name} (pid {proc.pid}) -> {p.path / POINT_LOG}")
            time.sleep(0.1)
            for proc in [q for q in running if q.poll() is not None]:
                p, log, t0 = running.pop(proc)
                log.close()
                count += 1
                took = f"{time.perf_counter() - t0:.0f} s"
                if proc.returncode == 0:
                    echo(f"[{count}/{len(todo)}] finished {p.name} ({took}) {_final_line(p)}")
                elif proc.returncode in (130, 143) and stop:
                    echo(f"[{count}/{len(todo)}] interrupted {p.name} (checkpoint written)")
                else:
                    tail = _tail(p.path / POINT_LOG)
                    failed.append((p, tail))
                    echo(f"[{count}/{len(todo)}] FAILED {p.name} (exit {proc.returncode}): {tail}")
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
    if stop:
        raise SweepInterrupted(stop[0], out)
    return failed


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text().strip().splitlines()
    except OSError:
        return ""
    return " / ".join(text[-lines:])
