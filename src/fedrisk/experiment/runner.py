"""Run one experiment from a validated config: build, run with progress, write outputs,
checkpoint, resume.

This module owns a run's directory (checked, cleared for ``--overwrite``, read back for
``--resume``), the run itself and its ``summary.json``.  Building the run from the config is
:mod:`fedrisk.experiment.assemble`'s (:func:`build_simulation`: ``build_federation`` -> model ->
objective -> algorithm); the callbacks, signals and checkpoints are
:mod:`fedrisk.experiment.callbacks`'s.  Their public names are importable from here too.

:func:`run_experiment` runs the built simulation through :func:`fedrisk.api.run_simulation`
with these callbacks: :class:`TrainMetrics` (the round's training metrics into each evaluation
record), :class:`~fedrisk.experiment.selection.WorkMeter` (local steps per client and samples
seen), :class:`~fedrisk.experiment.selection.Selector` (model selection on validation,
``run.select_by``: ``DIR/selected.pt``), :class:`MetricsWriter` (``metrics.jsonl``),
:class:`~fedrisk.experiment.progress.Progress` and :class:`Checkpointer`.

Under the distributed executor (``torchrun ... -m fedrisk run CONFIG --set
run.executor=distributed``) every process runs this same code: the run directory is checked
and the checkpoint read once by rank 0 (``run_on_primary``), only rank 0 writes and shows
progress, and a signal seen by any process stops all of them after the same round
(``any_rank``).

Checkpoints and exact resume (:mod:`fedrisk.experiment.callbacks` has the details): a checkpoint
holds everything a run's state is (its seed and round decide every random draw), so ``--resume``
continues bit-exactly.  On SIGINT / SIGTERM the current round finishes, the checkpoint is written
and the run stops with :class:`RunInterrupted` (exit code 130 / 143 from the CLI).

Example:
    >>> import tempfile
    >>> from fedrisk.experiment.config import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 3},
    ...                       "run": {"rounds": 2}, "output": {"plots": False}})
    >>> result = run_experiment(cfg, tempfile.mkdtemp(), progress="none")
    >>> result.summary["status"], result.summary["rounds"], "test_accuracy" in result.summary["final"]
    ('finished', 2, True)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

import fedrisk
from fedrisk.api import Callback, History, resolve_metrics, run_simulation
from fedrisk.errors import FedriskError
from fedrisk.experiment.assemble import (
    MODEL_FILE,
    Built,
    build_aggregator,
    build_algorithm,
    build_attack,
    build_server_opt,
    build_simulation,
    load_init_params,
    run_seed,
    wants_scorer,
)
from fedrisk.experiment.callbacks import (
    CHECKPOINT_FORMAT,
    SIGNAL_NAMES,
    Checkpointer,
    MetricsWriter,
    SignalGuard,
    TrainMetrics,
    _Stop,
    load_checkpoint,
    save_checkpoint,
)
from fedrisk.experiment.checkpoint import unpack_global_rng
from fedrisk.experiment.config import ExperimentConfig, diff_configs
from fedrisk.experiment.outputs import (
    FAILURE,
    RECORD_KEYS,
    SELECTED_MODEL,
    RunDir,
    atomic_torch_save,
    atomic_write_text,
    best_round,
    load_run,
    write_json,
    write_jsonl,
)
from fedrisk.experiment.progress import Progress
from fedrisk.experiment.section_rules import check_select_by
from fedrisk.experiment.selection import (
    Selector,
    WorkMeter,
    budget,
    lower_is_better,
    record_key,
    selected_record,
)
from fedrisk.experiment.tracking import open_tracking
from fedrisk.runtime.evaluation import check_client_splits
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.simulation import Simulation, make_executor

__all__ = [
    "CHECKPOINT_FORMAT",
    "MODEL_FILE",
    "RESUMABLE_ACROSS",
    "SIGNAL_NAMES",
    "Built",
    "Checkpointer",
    "MetricsWriter",
    "RunInterrupted",
    "RunResult",
    "SignalGuard",
    "TrainMetrics",
    "best_values",
    "build_aggregator",
    "build_algorithm",
    "build_attack",
    "build_server_opt",
    "build_simulation",
    "check_out_dir",
    "default_out_dir",
    "load_checkpoint",
    "load_init_params",
    "make_summary",
    "run_experiment",
    "run_seed",
    "save_checkpoint",
    "wants_scorer",
]

RESUMABLE_ACROSS = ("run.executor",)
"""Config keys that may differ between a checkpoint and its resumed run (numbers then agree to
rounding, not bit for bit)."""


class RunInterrupted(Exception):
    """A run stopped on SIGINT / SIGTERM after writing its checkpoint."""

    def __init__(self, signum: int, round: int, run_dir: RunDir) -> None:
        self.signum = signum
        self.round = round
        self.path = run_dir.path
        name = SIGNAL_NAMES.get(signum, f"signal {signum}")
        super().__init__(
            f"{name} received: stopped after round {round}; checkpoint written to {run_dir.checkpoint}. "
            f"Continue with: fedrisk run {run_dir.config} --out {run_dir.path} --resume"
        )

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum)


@dataclass
class RunResult:
    """A finished run: its directory, ``summary.json`` content and history."""

    path: Path
    summary: dict[str, Any]
    history: History
    primary: bool = True  # False in the non-writing processes of a distributed run
    signal: int | None = None  # SIGINT / SIGTERM that arrived after the last round: the caller should stop


def default_out_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg["output.dir"] or f"runs/{cfg.name}")


def check_out_dir(rd: RunDir, *, resume: bool, overwrite: bool) -> str:
    """Refuse to clobber or to resume what is not there; returns the directory's status."""
    status = rd.status()
    where = str(rd.path)
    if resume and overwrite:
        raise FedriskError(
            "--resume and --overwrite exclude each other: resume continues a run, overwrite starts again"
        )
    if resume:
        if status == "finished":
            raise FedriskError(f"{where} holds a finished run; nothing to resume (use --overwrite to run it again)")
        if status != "checkpointed":
            raise FedriskError(
                f"{where} holds no checkpoint ({rd.checkpoint.name}); nothing to resume - "
                "start the run without --resume"
            )
        return status
    if status == "finished" and not overwrite:
        raise FedriskError(
            f"{where} already holds a finished run; choose another --out or pass --overwrite to replace it"
        )
    if status == "checkpointed" and not overwrite:
        raise FedriskError(
            f"{where} holds an interrupted run with a checkpoint; "
            "continue it with --resume or start again with --overwrite"
        )
    if status == "started" and not overwrite:
        raise FedriskError(f"{where} holds an unfinished run without a checkpoint; pass --overwrite to start again")
    return status


def run_experiment(
    cfg: ExperimentConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: str = "auto",
    stream: TextIO | None = None,
    label: str = "",
    seed: int | None = None,
    executor: Executor | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Run ``cfg`` into ``out`` (default ``output.dir`` or ``runs/<config name>``).

    Args:
        cfg: a validated config.
        out: the run directory.
        resume: continue from ``out``'s checkpoint (the config must match the checkpoint's).
        overwrite: replace a run already in ``out``.
        progress: ``"auto"``, ``"bar"``, ``"plain"`` or ``"none"``.
        stream: where progress goes (default standard error).
        label: a prefix for the progress line.
        seed: the run seed (default ``run.seed`` / the single entry of ``run.seeds``).
        executor: an executor object instead of ``run.executor`` (e.g. fedrisk.deploy's Flower executor).
        callbacks: more callbacks, called after the runner's own (``fedrisk tune`` reports each evaluation to
            Optuna and stops a pruned trial by raising from ``on_evaluation``).

    Raises:
        FedriskError: bad input (the directory, the checkpoint, the config).
        RunInterrupted: SIGINT / SIGTERM; the checkpoint was written.
    """
    seed = run_seed(cfg) if seed is None else seed
    if cfg["run.seeds"] or cfg["run.seed"] != seed:
        cfg = cfg.with_overrides({"run.seed": seed, "run.seeds": []})
    rd = RunDir(out if out is not None else default_out_dir(cfg))
    executor = make_executor(executor if executor is not None else cfg["run.executor"])
    # the run directory is decided (and the checkpoint read) once, by the primary process
    ckpt = executor.run_on_primary(lambda: _prepare_dir(rd, cfg, resume=resume, overwrite=overwrite))

    threads_before = torch.get_num_threads()
    if cfg["run.threads"]:
        torch.set_num_threads(cfg["run.threads"])
    show = Progress(cfg["run.rounds"], mode=progress if executor.is_primary else "none", stream=stream, label=label)
    try:
        with SignalGuard(stream=show.stream if show.mode != "none" else None, newline=show.mode == "bar") as guard:
            return _run(cfg, rd, ckpt, seed, executor, show, guard, callbacks)
    finally:
        torch.set_num_threads(threads_before)


def _prepare_dir(rd: RunDir, cfg: ExperimentConfig, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run directory; clear it for --overwrite; return the checkpoint for --resume."""
    check_out_dir(rd, resume=resume, overwrite=overwrite)
    if not resume:
        if overwrite:
            rd.clear()
        return None
    ckpt = load_checkpoint(rd.checkpoint, rd.client_states)
    # a checkpoint holds every client's state whatever wrote it: it resumes under any executor
    diffs = [d for d in diff_configs(ckpt["config"], cfg.semantic()) if d[0] not in RESUMABLE_ACROSS]
    if diffs:
        lines = ", ".join(f"{k} (checkpoint: {_show(a)}, now: {_show(b)})" for k, a, b in diffs)
        raise FedriskError(
            f"the config differs from the checkpoint's in {rd.path}: {lines}. Resume with the same config "
            f"(e.g. {rd.config}) or start again with --overwrite"
        )
    return ckpt


def _run(
    cfg: ExperimentConfig,
    rd: RunDir,
    ckpt: dict[str, Any] | None,
    seed: int,
    executor: Executor,
    show: Progress,
    guard: SignalGuard,
    user_callbacks: Sequence[Callback] = (),
) -> RunResult:
    built = build_simulation(cfg, seed, executor=executor, client_store=rd.client_states)
    sim = built.simulation
    primary = executor.is_primary
    if primary:
        rd.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(rd.config, cfg.to_toml())
        _write_partition(rd, sim)

    history = History()
    elapsed_before = 0.0
    if ckpt is not None:
        sim.load_state_dict(ckpt["simulation"])
        history.records = [dict(r) for r in ckpt["history"]]
        elapsed_before = float(ckpt["elapsed"])
        unpack_global_rng(ckpt["rng"])
    if primary:
        write_jsonl(rd.metrics, history.records)

    rounds = cfg["run.rounds"]
    show.elapsed_before = elapsed_before
    metrics = cfg["run.metrics"] or resolve_metrics(sim, None)
    select_key = check_select_by(cfg["run.select_by"], cfg.section("data"), metrics)
    splits = list(cfg["run.splits"])
    if select_key.startswith("validation_") and not select_key.startswith("validation_personal_"):
        splits += [] if "validation" in splits else ["validation"]  # selection needs it evaluated
    check_client_splits(sim.federation, metrics, splits)
    work = WorkMeter()
    selector = Selector(select_key, rd.path / SELECTED_MODEL, primary) if select_key else None
    if ckpt is not None:
        work.load_state_dict(ckpt.get("work"), history.records)
        if selector is not None:
            selector.load_state_dict(ckpt.get("selected"), history.records)

    def extra() -> dict[str, Any]:
        out: dict[str, Any] = {"work": work.state_dict()}
        if selector is not None:
            out["selected"] = selector.state_dict()
        return out

    checkpointer = Checkpointer(
        rd.checkpoint,
        cfg.semantic(),
        rounds,
        cfg["run.eval_every"],
        cfg["run.checkpoint_every"],
        guard,
        history,
        show.elapsed,
        agree=executor.any_rank,
        seconds=cfg["run.checkpoint_seconds"],
        extra=extra,
    )
    callbacks: list[Callback] = [TrainMetrics(), work]
    if selector is not None:
        callbacks.append(selector)
    tracking = None
    if primary:
        callbacks.append(MetricsWriter(rd.metrics))
        from fedrisk.experiment.personal_outputs import personal_callbacks  # clients.csv, alpha.csv

        callbacks += personal_callbacks(rd.path, stream=None if show.mode == "none" else show.stream)
        from fedrisk.experiment.game_samples import game_callbacks  # a GAN's samples over the rounds

        callbacks += game_callbacks(sim, rd.path, cfg["output.plots"])
        tracking = open_tracking(cfg, rd.path, seed=seed, resume_round=None if ckpt is None else sim.round)
        if tracking is not None:  # TensorBoard / MLflow ([output] tensorboard, mlflow)
            callbacks.append(tracking)
    callbacks += [show, checkpointer, *user_callbacks]
    finished = False
    (rd.path / FAILURE).unlink(missing_ok=True)
    try:
        run_simulation(
            sim,
            rounds,
            eval_every=cfg["run.eval_every"],
            eval_at_start=cfg["run.eval_at_start"],
            metrics=metrics,
            splits=splits,
            callbacks=callbacks,
            history=history,
            elapsed_before=elapsed_before,
        )
        finished = True
    except _Stop as stop:
        show.close()
        raise RunInterrupted(stop.signum, sim.round, rd) from None
    except FedriskError as exc:  # e.g. NaN/inf replies that the aggregation refuses: reports show it
        if primary:
            write_json(rd.path / FAILURE, {"round": sim.round, "error": str(exc), "type": type(exc).__name__})
        raise
    finally:
        if tracking is not None:
            tracking.close(finished)
    checkpointer.save(sim)
    summary = make_summary(cfg, built.resolved, sim, history, select_key)
    if primary:
        params = sim.algorithm.global_params(sim.server_state)
        if params is not None:  # what run.init_from of a later run reads
            atomic_torch_save(params, rd.path / MODEL_FILE)
        write_json(rd.summary, summary)
        if cfg["output.plots"] and history.records:
            from fedrisk.experiment.plots import plot_run

            plot_run(load_run(rd.path), rd.plots)
    return RunResult(rd.path, summary, history, primary, guard.signum)


def _show(value: Any) -> str:
    from fedrisk.experiment.schema import format_value

    return "(absent)" if not isinstance(value, (str, int, float, bool, list, dict)) else format_value(value)


def _write_partition(rd: RunDir, sim: Simulation) -> None:
    fed = sim.federation
    report: dict[str, Any] = {"name": fed.name, "client_sizes": list(fed.client_sizes)}
    if all(not c.y.is_floating_point() for c in fed.clients):
        part = fed.partition_report()
        report.update(part.to_dict())
        atomic_write_text(rd.partition_md, f"# Partition: {fed.name}\n\n{part.to_markdown()}\n")
    report["info"] = fed.info
    atomic_write_text(rd.partition_json, json.dumps(report, indent=2, default=str) + "\n")


def best_values(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per evaluation metric: the best value over the evaluations and its round (min for
    losses).  Training metrics (``train_*``) have no "best" and are left out."""
    best: dict[str, dict[str, Any]] = {}
    for r in records:
        for k, v in r.items():
            if k in RECORD_KEYS or k.startswith("train_") or not isinstance(v, (int, float)) or v != v:
                continue
            lower = lower_is_better(k)
            cur = best.get(k)
            if cur is None or (v < cur["value"] if lower else v > cur["value"]):
                best[k] = {"value": v, "round": r["round"]}
    return best


def make_summary(
    cfg: ExperimentConfig,
    resolved: Mapping[str, Any],
    sim: Simulation,
    history: History,
    select_key: str = "",
) -> dict[str, Any]:
    last = history.records[-1] if history.records else {}
    chosen = selected_record(history.records, select_key)
    selected = None
    if chosen is not None:
        selected = {
            "round": chosen["round"],
            "selected_by": select_key,
            "value": chosen.get(record_key(chosen, select_key)),
            "metrics": {k: v for k, v in chosen.items() if k not in RECORD_KEYS},
            "budget": budget(chosen),
        }
    return {
        "status": "finished",
        "fedrisk_version": fedrisk.__version__,
        "algorithm": cfg["algorithm.name"],
        "dataset": cfg["data.dataset"],
        "seed": resolved["seed"],
        "rounds": sim.round,
        "evaluations": len(history.records),
        "final": {k: v for k, v in last.items() if k not in RECORD_KEYS},
        "selected": selected,  # the round chosen on validation (run.select_by); None without selection
        "budget": budget(last),
        # the best of every metric over the rounds, test included: an oracle, not a result
        "oracle": best_values(history.records),
        "oracle_round": best_round(history.records),  # personalised runs: every client statistic at one round
        "bytes_down": sim.ledger.total_down,
        "bytes_up": sim.ledger.total_up,
        "wall_time": last.get("wall_time"),
        "resolved": dict(resolved),
    }
