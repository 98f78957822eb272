"""Budgeted hyper-parameter tuning on Optuna: ``fedrisk tune``.

A study proposes values for a few config keys (the *search space*), runs each proposal as an
ordinary fedrisk run (``OUT/trials/<n>/``, any executor) and scores it by a metric of the
**validation** split at its best evaluation (the validation-selected round; never the test
split).  Every evaluation is reported to Optuna as it happens, so the pruner (the median rule
or successive halving) stops an unpromising trial right after the evaluation that condemns it.

The study lives in the run folder::

    OUT/tune.toml     the base config and the study's settings (what --resume checks)
    OUT/study.db      Optuna's SQLite storage: every trial, its values and intermediate values
    OUT/trials/<n>/   one run directory per trial (config.toml, metrics.jsonl, summary.json)
    OUT/best.toml     the base config with the best values filled in (`fedrisk run OUT/best.toml`)
    OUT/trials.md     a Markdown table of the trials
    OUT/history.png   the optimisation history (each trial's value and the best so far)

Search spaces are strings: ``log:LO:HI`` (floats, log-uniform, 0 < LO < HI), ``float:LO:HI``,
``int:LO:HI``, ``logint:LO:HI`` and ``choice:A,B,...`` (TOML values).  They come from
``--space KEY=SPEC`` or the config's ``[tune.space]`` table (restricted to ``tune.keys``).

Reproducibility and resuming.  The sampler is re-seeded before each proposal from
``(run.seed, number of trials counted so far)``, so a proposal depends only on the seed and
the finished trials, not on how many processes came and went.  A tune killed at any moment
(even ``kill -9``) continues with ``--resume``: finished trials are kept in the SQLite file; a
trial that was running is marked failed-interrupted (not counted) and proposed again with the
same values, in the same run directory (resumed from its checkpoint when it has one).  With
one job a resumed tune therefore ends with the same trials as an uninterrupted one.  With
``--jobs J`` trials run in J worker processes sharing the study (faster, but which trial sees
which finished ones depends on timing).

A trial whose run fails (a diverging step size stops the run with a non-finite state) is
recorded as failed with its message, counts towards the budget and does not stop the study.

Example:
    >>> parse_dimension("algorithm.lr", "log:1e-3:1")
    Dimension(key='algorithm.lr', kind='log', low=0.001, high=1.0, choices=())
    >>> parse_dimension("algorithm.lam", "choice:1,10,100").choices
    (1, 10, 100)
    >>> parse_dimension("algorithm.lr", "log:0:1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    fedrisk.errors.FedriskError: search space algorithm.lr = 'log:0:1' does not parse: ...
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from fedrisk.api import Callback
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig, apply_overrides, flatten, parse_literal, resolve_config
from fedrisk.experiment.outputs import RunDir, atomic_write_text, read_jsonl
from fedrisk.experiment.runner import RunInterrupted, lower_is_better, run_experiment
from fedrisk.experiment.types import format_value, to_toml_value

KINDS = ("log", "float", "int", "logint", "choice")
ALLOWED = "log:LO:HI (0 < LO < HI), float:LO:HI, int:LO:HI, logint:LO:HI, choice:A,B,..."
SPEC_FILE = "tune.toml"
STUDY_FILE = "study.db"
STUDY_NAME = "fedrisk"
TRIALS_DIR = "trials"
NOT_TUNABLE = ("run.seed", "run.seeds", "sweep.", "tune.", "output.")


# ============================================================================= search spaces


@dataclass(frozen=True)
class Dimension:
    """One tuned key: ``kind`` in :data:`KINDS` with bounds or choices."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def spec(self) -> str:
        """The canonical text, e.g. ``"log:0.001:1.0"``."""
        if self.kind == "choice":
            return "choice:" + ",".join(format_value(c) for c in self.choices)
        return f"{self.kind}:{self.low}:{self.high}"

    def suggest(self, trial: Any) -> Any:
        """Optuna's proposal for this key in ``trial``."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind in ("int", "logint"):
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.kind == "logint")
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.kind == "log")

    def values(self) -> list[Any]:
        """Values that span the dimension (its bounds or its choices), to validate against the config."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def short(value: Any) -> str:
    """A proposed value for tables: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else format_value(value)


def parse_dimension(key: str, text: str) -> Dimension:
    """``"log:1e-3:1"`` -> a log-uniform float dimension of ``key`` (see :data:`KINDS`)."""
    from fedrisk.experiment.sweep import _split_top

    def bad(why: str) -> FedriskError:
        return FedriskError(f"search space {key} = {text!r} does not parse: {why}; allowed: {ALLOWED}")

    if not isinstance(text, str):
        raise bad("not a string")
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise bad(f"unknown kind {kind!r}")
    if kind == "choice":
        parts = [p.strip() for p in _split_top(rest)]
        if not rest.strip() or any(not p for p in parts):
            raise bad("empty choice")
        choices = tuple(parse_literal(p) for p in parts)
        if any(not isinstance(c, (str, int, float, bool)) for c in choices):
            raise bad("choices must be numbers, strings or booleans")
        if len(set(map(repr, choices))) != len(choices):
            raise bad("repeated choice")
        return Dimension(key, kind, choices=choices)
    bounds = rest.split(":")
    if len(bounds) != 2:
        raise bad("expected two bounds LO:HI")
    number = int if kind in ("int", "logint") else float
    try:
        low, high = (number(b) for b in bounds)
    except ValueError:
        raise bad(f"bounds must be {'integers' if number is int else 'numbers'}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise bad("need finite bounds with LO < HI")
    if kind in ("log", "logint") and low <= 0:
        raise bad("a log scale needs 0 < LO")
    return Dimension(key, kind, low, high)


def parse_space(items: Sequence[str]) -> dict[str, Dimension]:
    """``["algorithm.lr=log:1e-3:1", ...]`` (``--space``) -> ``{key: Dimension}``."""
    space: dict[str, Dimension] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not k for k in key.split(".")):
            raise FedriskError(
                f"--space expects KEY=SPEC with a dotted key (e.g. algorithm.lr=log:1e-3:1); got {item!r}"
            )
        if key in space:
            raise FedriskError(f"--space {key} is given twice; give each key once")
        space[key] = parse_dimension(key, text.strip())
    return space


def config_space(cfg: ExperimentConfig) -> dict[str, Dimension]:
    """The config's ``[tune.space]`` restricted to ``tune.keys`` (all of it when empty)."""
    table = flatten(cfg["tune.space"])
    keys = cfg["tune.keys"] or list(table)
    missing = [k for k in keys if k not in table]
    if missing:
        raise FedriskError(
            f"tune.keys lists {', '.join(missing)}, not in tune.space; "
            f"allowed: {', '.join(table) or '(tune.space is empty)'}"
        )
    return {k: parse_dimension(k, table[k]) for k in keys}


def check_space(cfg: ExperimentConfig, space: Mapping[str, Dimension], where: str = "search space") -> None:
    """Every key must be a config key whose type takes the dimension's values (bounds, choices)."""
    for key, dim in space.items():
        if any(key == p or (p.endswith(".") and key.startswith(p)) for p in NOT_TUNABLE):
            raise FedriskError(f"{where} {key}: not a tunable key; allowed: keys of [data], [model], [algorithm], ...")
        for value in dim.values():
            try:
                with warnings.catch_warnings():  # a bound may be a poor value (a theorem's step bound): not an error
                    warnings.simplefilter("ignore")
                    cfg.with_overrides({key: value})
            except FedriskError as exc:
                raise FedriskError(f"{where} {key} = {dim.spec!r}: {exc}") from None


def check_metric(cfg: ExperimentConfig, metric: str) -> None:
    """``metric`` must be a metric the runs evaluate on the validation split."""
    if not metric:
        raise FedriskError(
            "no metric to tune: set tune.metric or pass --metric; allowed: a validation metric such as validation_auroc"
        )
    if not metric.startswith("validation_"):
        raise FedriskError(
            f"metric {metric!r} is not evaluated on the validation split; allowed: validation_<metric> "
            "(e.g. validation_auroc): tuning on the test split would select on it"
        )
    if "validation" not in cfg["run.splits"]:
        raise FedriskError(
            f"metric {metric!r} needs the validation split: set data.validation_fraction (e.g. 0.2) and "
            'run.splits = ["test", "validation"]'
        )
    name = metric.removeprefix("validation_")
    if cfg["run.metrics"] and name not in cfg["run.metrics"]:
        raise FedriskError(
            f"metric {metric!r} is not evaluated: run.metrics = {format_value(cfg['run.metrics'])}; allowed: "
            + ", ".join(f"validation_{m}" for m in cfg["run.metrics"])
        )


def select_overrides(cfg: ExperimentConfig, metric: str) -> dict[str, Any]:
    """``{"run.select_by": metric}`` where the config has model selection (``run.select_by``), so
    that tuned runs report and save the round their validation metric selects; else ``{}``."""
    return {"run.select_by": metric} if "select_by" in cfg.section("run") else {}


# ============================================================================= the study's settings


@dataclass
class TuneSpec:
    """What a study tunes and how (written to ``OUT/tune.toml``)."""

    space: dict[str, Dimension]
    trials: int
    metric: str
    pruner: str = "median"
    sampler: str = "tpe"
    seed: int = 0
    jobs: int = 1
    warmup: int = 0  # rounds before which no trial is pruned

    @property
    def direction(self) -> str:
        return "minimize" if lower_is_better(self.metric) else "maximize"

    def settings(self) -> dict[str, Any]:
        """What must agree for a study to be resumed (``trials`` and ``jobs`` may change)."""
        return {
            "space": {k: d.spec for k, d in self.space.items()},
            "metric": self.metric,
            "pruner": self.pruner,
            "sampler": self.sampler,
            "seed": self.seed,
            "warmup": self.warmup,
        }


def tune_spec(
    cfg: ExperimentConfig,
    *,
    space: Sequence[str] = (),
    trials: int | None = None,
    metric: str | None = None,
    pruner: str | None = None,
    sampler: str | None = None,
    jobs: int | None = None,
    where: str = "",
) -> TuneSpec:
    """The study of ``cfg``: ``[tune]`` values, replaced by the given ones; checked."""
    dims = parse_space(space) if space else config_space(cfg)
    if not dims:
        raise FedriskError(
            f"{where or 'the config'} has no tunable key: no --space given and tune.space is empty; allowed: "
            "--space 'algorithm.lr=log:1e-3:1' or a [tune.space] table"
        )
    check_space(cfg, dims, where=f"{where}: search space" if where else "search space")
    spec = TuneSpec(
        space=dims,
        trials=cfg["tune.trials"] if trials is None else trials,
        metric=cfg["tune.metric"] if metric is None else metric,
        pruner=cfg["tune.pruner"] if pruner is None else pruner,
        sampler=cfg["tune.sampler"] if sampler is None else sampler,
        seed=cfg["run.seed"],
        jobs=cfg["tune.jobs"] if jobs is None else jobs,
        warmup=cfg["run.rounds"] // 4,
    )
    if spec.trials < 1 or spec.jobs < 1:
        raise FedriskError(f"--trials = {spec.trials}, --jobs = {spec.jobs}: both must be >= 1")
    for name, value, allowed in (
        ("pruner", spec.pruner, ("median", "halving", "none")),
        ("sampler", spec.sampler, ("tpe", "random")),
    ):
        if value not in allowed:
            raise FedriskError(f"--{name} = {value!r} is not allowed; allowed: {', '.join(allowed)}")
    check_metric(cfg, spec.metric)
    return spec


# ============================================================================= Optuna pieces


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:  # pragma: no cover - a dependency of fedrisk
        raise FedriskError("fedrisk tune needs optuna (pip install 'optuna>=4,<6')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def startup_trials(trials: int) -> int:
    """Trials proposed at random before the TPE model (and the median pruner) take over: a
    quarter of the budget, between 2 and 10 (Optuna's default of 10 suits budgets of 40+).
    The median rule also waits for a quarter of the rounds (``TuneSpec.warmup``): methods that
    start slowly are not cut at their first evaluation."""
    return max(2, min(10, trials // 4))


def _sub_seed(seed: int, index: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def make_sampler(spec: TuneSpec, index: int) -> Any:
    """The sampler for proposal number ``index`` (counted trials so far), seeded from (seed, index)."""
    optuna = _optuna()
    seed = _sub_seed(spec.seed, index)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials(spec.trials))


class _Reseeded:
    """An Optuna sampler that delegates to :func:`make_sampler` for the current proposal."""

    def __new__(cls, spec: TuneSpec) -> Any:
        optuna = _optuna()

        class Reseeded(optuna.samplers.BaseSampler):
            def __init__(self) -> None:
                self.inner = make_sampler(spec, 0)

            def reseed(self, index: int) -> None:
                self.inner = make_sampler(spec, index)

            def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
                return self.inner.infer_relative_search_space(study, trial)

            def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
                return self.inner.sample_relative(study, trial, search_space)

            def sample_independent(self, study, trial, name, distribution):  # type: ignore[no-untyped-def]
                return self.inner.sample_independent(study, trial, name, distribution)

            def before_trial(self, study, trial):  # type: ignore[no-untyped-def]
                self.inner.before_trial(study, trial)

            def after_trial(self, study, trial, state, values):  # type: ignore[no-untyped-def]
                self.inner.after_trial(study, trial, state, values)

        return Reseeded()


def make_pruner(spec: TuneSpec) -> Any:
    optuna = _optuna()
    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials(spec.trials), n_warmup_steps=spec.warmup)
    if spec.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def storage_url(out: Path) -> str:
    return f"sqlite:///{(Path(out) / STUDY_FILE).resolve()}"


def _connect(path: Path) -> Any:
    """A SQLite connection in write-ahead-log mode without a sync per commit: a killed process
    loses nothing it committed (the operating system holds the pages); only a power cut could
    lose the last commits.  Each commit then costs microseconds instead of an fsync (about
    20 ms on a busy disk, for every reported evaluation)."""
    import sqlite3

    conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def open_study(out: Path, spec: TuneSpec, create: bool = False) -> tuple[Any, Any]:
    """The study in ``out`` (SQLite, see :func:`_connect`) and its sampler."""
    optuna = _optuna()
    db = (Path(out) / STUDY_FILE).resolve()
    storage = optuna.storages.RDBStorage(
        storage_url(out), engine_kwargs={"creator": lambda: _connect(db)}, skip_compatibility_check=True
    )
    sampler = _Reseeded(spec)
    if create:
        study = optuna.create_study(
            storage=storage, study_name=STUDY_NAME, direction=spec.direction, sampler=sampler, pruner=make_pruner(spec)
        )
    else:
        study = optuna.load_study(storage=storage, study_name=STUDY_NAME, sampler=sampler, pruner=make_pruner(spec))
    return study, sampler


def counted(trial: Any) -> bool:
    """Whether a trial counts towards the budget: finished, running, or failed by its own run
    (not one interrupted by a killed tune, which is proposed again)."""
    state = trial.state.name
    return state in ("COMPLETE", "PRUNED", "RUNNING") or (state == "FAIL" and "error" in trial.user_attrs)


WORKERS_LOCK = ".workers.lock"
"""Held (shared) by every worker process for its life: a tune whose main process was killed
leaves its workers finishing the study, and no new tune may touch the study until they end."""


@contextlib.contextmanager
def _flock(path: Path, blocking: bool = True, shared: bool = False) -> Iterator[None]:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise FedriskError(
                f"{path.parent} is in use by another fedrisk tune (or its worker processes); wait for it or stop it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ============================================================================= trials


def prune_from(spec: TuneSpec, trials: Sequence[Any]) -> float:
    """The first round at which the pruner may stop a trial proposed after ``trials``: asking it
    earlier costs a read of the whole study per evaluation for a certain "no" (the median rule
    needs ``startup_trials`` complete trials and waits ``warmup`` rounds; with parallel workers,
    trials completing meanwhile are not counted, which only prunes later)."""
    if spec.pruner == "none":
        return math.inf
    if spec.pruner == "median":
        complete = sum(t.state.name == "COMPLETE" for t in trials)
        return spec.warmup if complete >= startup_trials(spec.trials) else math.inf
    return 0


class _MetricMissing(FedriskError):
    """The tuned metric is not in the evaluation records: a config error, which stops the study."""


class Pruned(Exception):
    """Raised from a trial's evaluation callback when Optuna prunes it."""

    def __init__(self, round: int) -> None:
        super().__init__(f"pruned at round {round}")
        self.round = round


class Reporter(Callback):
    """Reports every evaluation's ``metric`` to the Optuna trial and stops a pruned trial at once.

    ``on_start`` replays the evaluations a resumed run already holds (``metrics.jsonl`` is the
    checkpoint's history by then), so the pruner sees the same steps as in an unbroken run."""

    def __init__(self, trial: Any, metric: str, metrics_path: Path, prune_from: float = 0) -> None:
        self.trial = trial
        self.metric = metric
        self.metrics_path = metrics_path
        self.prune_from = prune_from  # no pruning decision before this round (inf: none can come)
        self.steps: dict[int, float] = {}
        self.cost = [0.0, 0.0]  # wall and CPU seconds spent talking to Optuna (the tuner's, not the trial's)

    def on_start(self, sim: Any) -> None:
        for record in read_jsonl(self.metrics_path):
            self.report(record)

    def on_evaluation(self, sim: Any, record: dict[str, Any]) -> None:
        self.report(record)

    def report(self, record: Mapping[str, Any]) -> None:
        if self.metric not in record:
            found = sorted(k for k in record if k.startswith("validation_"))
            raise _MetricMissing(
                f"metric {self.metric!r} is not evaluated by this run; allowed: {', '.join(found) or '(none)'} "
                "(set run.metrics to evaluate others)"
            )
        step, value = int(record["round"]), float(record[self.metric])
        if step in self.steps:
            return
        self.steps[step] = value
        t0, c0 = time.perf_counter(), time.process_time()
        self.trial.report(value, step)
        prune = step >= self.prune_from and self.trial.should_prune()
        self.cost[0] += time.perf_counter() - t0
        self.cost[1] += time.process_time() - c0
        if prune:
            raise Pruned(step)

    def best(self, lower: bool) -> tuple[float, int]:
        """The validation-selected value and its round (NaN when nothing finite was reported)."""
        finite = [(v, s) for s, v in self.steps.items() if math.isfinite(v)]
        if not finite:
            return math.nan, -1
        v, s = min(finite, key=lambda t: (t[0] if lower else -t[0], t[1]))  # ties: the earlier round
        return v, s


def run_trial(
    study: Any,
    sampler: Any,
    base: ExperimentConfig,
    spec: TuneSpec,
    out: Path,
    echo: Callable[[str], None],
    lock: Path,
) -> bool:
    """Propose, run and record one trial; False when the budget is spent."""
    optuna = _optuna()
    with _flock(lock):  # one proposal at a time across worker processes
        trials = study.get_trials(deepcopy=False)
        used = sum(counted(t) for t in trials)
        waiting = any(t.state.name == "WAITING" for t in trials)
        if used >= spec.trials and not waiting:
            return False
        sampler.reseed(used)
        trial = study.ask()
        params = {k: d.suggest(trial) for k, d in spec.space.items()}
        run_dir = trial.user_attrs.get("run_dir") or f"{TRIALS_DIR}/{trial.number:03d}"
        trial.set_user_attr("run_dir", run_dir)
    path = out / run_dir
    rd = RunDir(path)
    reporter = Reporter(trial, spec.metric, rd.metrics, prune_from(spec, trials))
    shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={short(v)}" for k, v in params.items())
    index = trial.user_attrs.get("index", used)
    trial.set_user_attr("index", index)
    t0, c0 = time.perf_counter(), time.process_time()
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # a proposal's warnings go to trials.md, once
            warnings.simplefilter("always")
            over = {**params, "run.seeds": [], "output.plots": False, **select_overrides(base, spec.metric)}
            cfg = base.with_overrides(over)
            status = rd.status()
            if status == "finished":  # killed after the run, before Optuna heard: replay its evaluations
                for record in read_jsonl(rd.metrics):
                    reporter.report(record)
            else:
                run_experiment(
                    cfg,
                    path,
                    resume=status == "checkpointed",
                    overwrite=status == "started",
                    progress="none",
                    callbacks=[reporter],
                )
    except Pruned as exc:
        _note_warnings(trial, caught, t0, c0, reporter.cost)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        echo(f"[trial {index + 1}/{spec.trials}] {shown}: pruned at round {exc.round}")
        return True
    except RunInterrupted:
        raise  # the trial stays RUNNING; --resume proposes it again and resumes its checkpoint
    except _MetricMissing:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    except FedriskError as exc:
        _note_warnings(trial, caught, t0, c0, reporter.cost)
        trial.set_user_attr("error", str(exc))
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        echo(f"[trial {index + 1}/{spec.trials}] {shown}: FAILED: {exc}")
        return True
    value, best_round = reporter.best(lower_is_better(spec.metric))
    _note_warnings(trial, caught, t0, c0, reporter.cost)
    trial.set_user_attr("round", best_round)
    if math.isnan(value):
        trial.set_user_attr("error", f"no finite {spec.metric}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        echo(f"[trial {index + 1}/{spec.trials}] {shown}: FAILED: no finite {spec.metric}")
        return True
    study.tell(trial, value)
    echo(f"[trial {index + 1}/{spec.trials}] {shown}: {spec.metric} = {value:.4f} (round {best_round})")
    return True


def _note_warnings(
    trial: Any, caught: Sequence[warnings.WarningMessage], t0: float, c0: float, cost: Sequence[float]
) -> None:
    """Keep a trial's wall and CPU seconds (without the reporter's exchanges with Optuna) and its
    distinct warnings (e.g. a step size beyond a theorem's bound) as user attributes."""
    trial.set_user_attr("seconds", time.perf_counter() - t0 - cost[0])
    trial.set_user_attr("cpu_seconds", time.process_time() - c0 - cost[1])
    seen = list(dict.fromkeys(w.category.__name__ for w in caught))
    if seen:
        trial.set_user_attr("warnings", seen)


# ============================================================================= the command


@dataclass
class TuneResult:
    """A finished study: the best values and where the outputs are."""

    out: Path
    best_params: dict[str, Any]
    best_value: float
    best_round: int
    trials: list[Any] = field(repr=False)
    table: str = ""
    files: list[Path] = field(default_factory=list)
    best_run: Path | None = None  # the best trial's run directory


def _spec_toml(base: ExperimentConfig, spec: TuneSpec) -> str:
    doc = {
        "study": spec.settings(),
        "source": str(base.source.resolve()) if base.source is not None else "",
        "config": to_toml_value(base.raw),
    }
    return "# A fedrisk tune study: its settings and base config (checked by --resume)\n" + tomli_w.dumps(doc)


def _read_spec_file(out: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads((out / SPEC_FILE).read_text())


def prepare_study(
    out: Path, base: ExperimentConfig, spec: TuneSpec, *, resume: bool, overwrite: bool
) -> tuple[Any, Any]:
    """Create the study in ``out``, or check that it is the same study and recover its
    interrupted trials (``resume``)."""
    with _flock(out / WORKERS_LOCK, blocking=False):  # no worker of an earlier tune is still running
        pass
    exists = (out / STUDY_FILE).is_file()
    if exists and overwrite:
        import shutil

        for name in (STUDY_FILE, SPEC_FILE, TRIALS_DIR):
            p = out / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        exists = False
    if exists and not resume:
        raise FedriskError(f"{out} already holds a tune; continue it with --resume or start again with --overwrite")
    if resume and not exists:
        raise FedriskError(f"{out} holds no tune ({STUDY_FILE}); nothing to resume - start without --resume")
    out.mkdir(parents=True, exist_ok=True)
    if not exists:
        atomic_write_text(out / SPEC_FILE, _spec_toml(base, spec))
        return open_study(out, spec, create=True)
    saved = _read_spec_file(out)
    now = spec.settings()
    diffs = [k for k in now if saved["study"].get(k) != to_toml_value(now[k])]
    from fedrisk.experiment.config import semantic_view

    was = resolve_config(saved["config"], source=base.source)
    if semantic_view(was.values) != semantic_view(base.values):
        diffs.append("config")
    if diffs:
        raise FedriskError(
            f"{out} holds a tune with other settings ({', '.join(diffs)} differ); resume with the same config and "
            "options, or start again with --overwrite"
        )
    atomic_write_text(out / SPEC_FILE, _spec_toml(base, spec))
    study, sampler = open_study(out, spec)
    optuna = _optuna()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        # a trial of a killed tune: failed (uncounted), then proposed again with the same values and run directory
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(
            dict(t.params), user_attrs={k: v for k, v in t.user_attrs.items() if k in ("run_dir", "index")}
        )
    return study, sampler


def run_tune(
    base: ExperimentConfig,
    out: str | Path,
    spec: TuneSpec,
    *,
    resume: bool = False,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = None,
    plots: bool = True,
) -> TuneResult:
    """Run (or continue) the study of ``spec`` on ``base`` into ``out`` and write its outputs.

    Example:
        >>> import tempfile
        >>> cfg = resolve_config({"data": {"dataset": "breast_cancer", "num_clients": 3, "validation_fraction": 0.3},
        ...     "model": {"name": "logreg"}, "run": {"rounds": 2, "splits": ["test", "validation"],
        ...     "metrics": ["auroc"]}, "objective": {"name": "binary_cross_entropy"}})
        >>> spec = tune_spec(cfg, space=["algorithm.lr=log:1e-2:1"], trials=2, metric="validation_auroc")
        >>> result = run_tune(cfg, tempfile.mkdtemp(), spec, plots=False)
        >>> len(result.trials), sorted(result.best_params)
        (2, ['algorithm.lr'])
    """
    out = Path(out)
    echo = echo or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    with _flock(out / ".tune.lock", blocking=False):
        study, sampler = prepare_study(out, base, spec, resume=resume, overwrite=overwrite)
        if spec.jobs <= 1:
            while run_trial(study, sampler, base, spec, out, echo, out / ".ask.lock"):
                pass
        else:
            _run_workers(out, spec, echo)
        return write_outputs(out, base, spec, plots=plots, study=study)


def _run_workers(out: Path, spec: TuneSpec, echo: Callable[[str], None]) -> None:
    """``spec.jobs`` worker processes (``python -m fedrisk.experiment.tune OUT``) share the study."""
    threads = max(1, (os.cpu_count() or 1) // spec.jobs)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    procs = []
    for i in range(spec.jobs):
        log = open(out / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
        cmd = [sys.executable, "-m", "fedrisk.experiment.tune", str(out), "--trials", str(spec.trials)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    stop: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        stop.append(signum)
        for p, _ in procs:
            p.send_signal(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    seen = 0
    try:
        while any(p.poll() is None for p, _ in procs):
            time.sleep(0.5)
            seen = _echo_new(out, seen, echo)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for _, log in procs:
            log.close()
    _echo_new(out, seen, echo)
    if stop:
        raise FedriskError(f"tune stopped by a signal; continue with --resume ({out})")
    bad = [(i, p.returncode) for i, (p, _) in enumerate(procs) if p.returncode != 0]
    if bad:
        i, code = bad[0]
        tail = (out / f"worker{i}.log").read_text().strip().splitlines()[-1:]
        raise FedriskError(f"tune worker {i} exited with status {code}: {' '.join(tail)} (log: {out}/worker{i}.log)")


def _echo_new(out: Path, seen: int, echo: Callable[[str], None]) -> int:
    lines = []
    for log in sorted(out.glob("worker*.log")):
        lines += [ln for ln in log.read_text().splitlines() if ln.startswith("[trial ")]
    for line in lines[seen:]:
        echo(line)
    return max(seen, len(lines))


def worker_main(argv: Sequence[str] | None = None) -> int:
    """A worker of a parallel tune: runs trials of the study in ``OUT`` until the budget is spent."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m fedrisk.experiment.tune")
    p.add_argument("out")
    p.add_argument("--trials", type=int, required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    saved = _read_spec_file(out)
    source = Path(saved["source"]) if saved["source"] else None
    base = resolve_config(saved["config"], source=source)
    st = saved["study"]
    spec = TuneSpec(
        space={k: parse_dimension(k, v) for k, v in st["space"].items()},
        trials=args.trials,
        metric=st["metric"],
        pruner=st["pruner"],
        sampler=st["sampler"],
        seed=st["seed"],
        warmup=st["warmup"],
    )
    with _flock(out / WORKERS_LOCK, shared=True):
        study, sampler = open_study(out, spec)
        try:
            while run_trial(study, sampler, base, spec, out, lambda line: print(line, flush=True), out / ".ask.lock"):
                pass
        except RunInterrupted as exc:
            print(str(exc), flush=True)
            return exc.exit_code
        except FedriskError as exc:
            print(f"error: {exc}", flush=True)
            return 2
    return 0


# ============================================================================= outputs


def best_trial(study: Any) -> Any | None:
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not done:
        return None
    lower = study.direction.name == "MINIMIZE"
    return min(done, key=lambda t: (t.value if lower else -t.value, t.user_attrs.get("index", t.number)))


def trials_table(trials: Sequence[Any], spec: TuneSpec, best_number: int | None) -> str:
    """Markdown: one row per trial (proposal order), the best one in bold."""
    keys = list(spec.space)
    head = ["trial", *(k.rsplit(".", 1)[-1] for k in keys), spec.metric, "round", "state", "seconds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for t in trials:
        if t.state.name == "FAIL" and "error" not in t.user_attrs:
            continue  # interrupted, proposed again
        if t.state.name == "COMPLETE":
            value, state = f"{t.value:.4f}", "complete"
        elif t.state.name == "PRUNED":
            last = max(t.intermediate_values) if t.intermediate_values else None
            value = f"({t.intermediate_values[last]:.4f})" if last is not None else "–"
            state = f"pruned at {last}"
        else:
            value, state = "–", t.state.name.lower()
        row = [
            str(t.user_attrs.get("index", t.number) + 1),
            *(short(t.params[k]) if k in t.params else "–" for k in keys),
            value,
            str(t.user_attrs.get("round", "–")),
            state,
            f"{t.user_attrs['seconds']:.1f}" if "seconds" in t.user_attrs else "–",
        ]
        if "warnings" in t.user_attrs:
            row[-2] += " (" + "; ".join(t.user_attrs["warnings"]) + ")"
        if t.number == best_number:
            row = [f"**{c}**" for c in row]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot_history(trials: Sequence[Any], spec: TuneSpec, path: Path) -> Path:
    """Each trial's value (pruned ones: their last reported value) and the best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lower = lower_is_better(spec.metric)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    best, xs, ys = None, [], []
    shown = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    for t in shown:
        i = t.user_attrs.get("index", t.number) + 1
        if t.state.name == "COMPLETE":
            ax.scatter([i], [t.value], color="C0", zorder=3)
            best = t.value if best is None else (min(best, t.value) if lower else max(best, t.value))
        elif t.intermediate_values:
            ax.scatter([i], [t.intermediate_values[max(t.intermediate_values)]], color="C3", marker="x", zorder=3)
        if best is not None:
            xs.append(i)
            ys.append(best)
    ax.step(xs, ys, where="post", color="C1", label="best so far")
    ax.scatter([], [], color="C0", label="complete")
    ax.scatter([], [], color="C3", marker="x", label="pruned (last value)")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(spec.metric)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(
    out: Path, base: ExperimentConfig, spec: TuneSpec, plots: bool = True, study: Any = None
) -> TuneResult:
    """``best.toml``, ``trials.md``, ``history.png`` (and ``best.json``) of the study in ``out``."""
    if study is None:
        study, _ = open_study(out, spec)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: (t.user_attrs.get("index", t.number), t.number))
    trials = [t for t in trials if not (t.state.name == "FAIL" and "error" not in t.user_attrs)]
    best = best_trial(study)
    table = trials_table(trials, spec, best.number if best is not None else None)
    counts = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
    header = (
        f"# Tune: {spec.metric} ({spec.direction}), {len(trials)} trials "
        f"({counts['COMPLETE']} complete, {counts['PRUNED']} pruned, {counts['FAIL']} failed); "
        f"sampler {spec.sampler} (seed {spec.seed}), pruner {spec.pruner}\n\n"
        + "\n".join(f"- `{k}`: `{d.spec}`" for k, d in spec.space.items())
        + "\n\n"
    )
    atomic_write_text(out / "trials.md", header + table + "\n")
    files = [out / "trials.md"]
    if best is None:
        raise FedriskError(f"no trial of the tune in {out} completed (see {out / 'trials.md'}); nothing to select")
    params = {k: best.params[k] for k in spec.space}
    raw = {k: v for k, v in apply_overrides(base.raw, {**params, **select_overrides(base, spec.metric)}).items()}
    raw.pop("sweep", None)
    note = (
        f"# The best of {len(trials)} fedrisk tune trials ({spec.metric} = {best.value:.6g} at round "
        f"{best.user_attrs.get('round')}, trial {best.user_attrs.get('index', best.number) + 1}):\n"
        + "".join(f"#   {k} = {format_value(v)}\n" for k, v in params.items())
    )
    atomic_write_text(out / "best.toml", note + tomli_w.dumps(to_toml_value(raw)))
    summary = {
        "metric": spec.metric,
        "value": best.value,
        "round": best.user_attrs.get("round"),
        "params": params,
        "trial": best.user_attrs.get("index", best.number),
        "run_dir": best.user_attrs.get("run_dir"),
        "trials": len(trials),
    }
    atomic_write_text(out / "best.json", json.dumps(summary, indent=2) + "\n")
    files += [out / "best.toml", out / "best.json"]
    if plots:
        files.append(plot_history(trials, spec, out / "history.png"))
    best_run = out / best.user_attrs["run_dir"] if "run_dir" in best.user_attrs else None
    return TuneResult(out, params, best.value, int(best.user_attrs.get("round", -1)), trials, table, files, best_run)


if __name__ == "__main__":  # a worker of a parallel tune (see _run_workers)
    sys.exit(worker_main())
