"""Budgeted hyper-parameter tuning on Optuna: ``fedrisk tune``.

A study proposes values for a few config keys (the *search space*), runs each proposal as an
ordinary fedrisk run (``OUT/trials/<n>/``, any executor) and scores it by a metric of the
**validation** split at its best evaluation (the validation-selected round; never the test
split).  Every evaluation is reported to Optuna as it happens, so the pruner (the median rule
or successive halving) stops an unpromising trial right after the evaluation that condemns it.

The study lives in the run folder::

    OUT/tune.toml     the base config and the study's settings (what --resume checks)
    OUT/study.journal Optuna's journal storage: every change to the study, one JSON line each
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
(even ``kill -9``) continues with ``--resume``: finished trials are kept in the journal; a
trial that was running is marked failed-interrupted (not counted) and proposed again with the
same values, in the same run directory (resumed from its checkpoint when it has one).  With
one job a resumed tune therefore ends with the same trials as an uninterrupted one.  With
``--jobs J`` trials run in J worker processes sharing the study (faster, but which trial sees
which finished ones depends on timing).

A trial whose run fails (a diverging step size stops the run with a non-finite state) is
recorded as failed with its message, counts towards the budget and does not stop the study.

The search-space strings are parsed by :mod:`fedrisk.experiment.tune_space` (examples there).

Example (the random start-up trials before TPE and the median pruner take over):
    >>> startup_trials(8), startup_trials(16), startup_trials(100)
    (2, 4, 10)
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from fedrisk.api import Callback
from fedrisk.data.build import reuse_federations
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig, resolve_config
from fedrisk.experiment.outputs import RunDir, atomic_write_text, read_jsonl
from fedrisk.experiment.runner import RunInterrupted, run_experiment
from fedrisk.experiment.schema import to_toml_value
from fedrisk.experiment.selection import lower_is_better
from fedrisk.experiment.tune_outputs import TuneResult, write_outputs
from fedrisk.experiment.tune_space import (
    Dimension,
    check_metric,
    check_space,
    config_space,
    parse_dimension,
    parse_space,
    select_overrides,
    short,
)
from fedrisk.experiment.tune_storage import (
    OLD_STUDY_FILE,
    STUDY_FILE,
    STUDY_NAME,
    has_study,
    journal_storage,
    migrate,
    new_journal,
    repair,
)
from fedrisk.experiment.tune_storage import flock as _flock
from fedrisk.experiment.tune_storage import optuna_module as _optuna

__all__ = [
    "Dimension",
    "Pruned",
    "Reporter",
    "TuneResult",
    "TuneSpec",
    "has_study",
    "open_study",
    "parse_dimension",
    "parse_space",
    "run_tune",
    "select_overrides",
    "short",
    "tune_spec",
    "write_outputs",
]

SPEC_FILE = "tune.toml"
TRIALS_DIR = "trials"


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
    fixed: Sequence[str] = (),
) -> TuneSpec:
    """The study of ``cfg``: ``[tune]`` values, replaced by the given ones; checked.  ``fixed``:
    the keys the command line sets (``--set``), which must not also be tuned (the command line is
    the last word, so a tuned value would silently replace it or be replaced by it)."""
    from fedrisk.experiment.config import overlapping_keys

    dims = parse_space(space) if space else config_space(cfg)
    if not dims:
        raise FedriskError(
            f"{where or 'the config'} has no tunable key: no --space given and tune.space is empty; allowed: "
            "--space 'algorithm.lr=log:1e-3:1' or a [tune.space] table"
        )
    clash = overlapping_keys(dims, fixed)
    if clash:
        raise FedriskError(
            f"{where + ': ' if where else ''}{', '.join(clash)} is both set by --set and tuned; set it in one place "
            "(drop the --set, or take the key out of the search space: tune.keys / --space)"
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


def open_study(out: Path, spec: TuneSpec, create: bool = False) -> tuple[Any, Any]:
    """The study in ``out`` (its journal, see :mod:`fedrisk.experiment.tune_storage`) and its sampler."""
    optuna = _optuna()
    sampler = _Reseeded(spec)
    if create:
        new_journal(out, lambda s: optuna.create_study(storage=s, study_name=STUDY_NAME, direction=spec.direction))
    elif not (Path(out) / STUDY_FILE).is_file():  # Optuna's backend would create an empty one
        raise FedriskError(f"{out} holds no tune ({STUDY_FILE})")
    study = optuna.load_study(
        storage=journal_storage(out), study_name=STUDY_NAME, sampler=sampler, pruner=make_pruner(spec)
    )
    return study, sampler


def counted(trial: Any) -> bool:
    """Whether a trial counts towards the budget: finished, running, or failed by its own run
    (not one interrupted by a killed tune, which is proposed again)."""
    state = trial.state.name
    return state in ("COMPLETE", "PRUNED", "RUNNING") or (state == "FAIL" and "error" in trial.user_attrs)


WORKERS_LOCK = ".workers.lock"
"""Held (shared) by every worker process for its life: a tune whose main process was killed
leaves its workers finishing the study, and no new tune may touch the study until they end."""


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
    out: Path,
    base: ExperimentConfig,
    spec: TuneSpec,
    *,
    resume: bool,
    overwrite: bool,
    echo: Callable[[str], None] = lambda line: None,
) -> tuple[Any, Any]:
    """Create the study in ``out``, or check that it is the same study and recover its
    interrupted trials (``resume``; an older fedrisk's ``study.db`` is copied first, see
    :func:`~fedrisk.experiment.tune_storage.migrate`)."""
    with _flock(out / WORKERS_LOCK, blocking=False):  # no worker of an earlier tune is still running
        pass
    exists = has_study(out)
    if exists and overwrite:
        import shutil

        for name in (STUDY_FILE, OLD_STUDY_FILE, SPEC_FILE, TRIALS_DIR):
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
    if (out / STUDY_FILE).is_file():
        if cut := repair(out / STUDY_FILE):
            echo(f"{STUDY_FILE}: dropped {cut} record(s) cut short by a killed process")
    else:
        migrate(out, echo)
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
    plots: bool | None = None,
) -> TuneResult:
    """Run (or continue) the study of ``spec`` on ``base`` into ``out`` and write its outputs
    (``history.png`` when ``plots``, by default the config's ``output.plots``).

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
    with _flock(out / ".tune.lock", blocking=False), reuse_federations():  # the data is loaded once
        study, sampler = prepare_study(out, base, spec, resume=resume, overwrite=overwrite, echo=echo)
        if spec.jobs <= 1:
            while run_trial(study, sampler, base, spec, out, echo, out / ".ask.lock"):
                pass
        else:
            from fedrisk.experiment.tune_workers import run_workers

            run_workers(out, spec, echo, base=base)
        plots = bool(base["output.plots"]) if plots is None else plots
        return write_outputs(out, base, spec, plots=plots, study=study)
