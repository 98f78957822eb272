"""The runner's own callbacks and the plumbing that lets a run stop and resume: metrics to
``metrics.jsonl``, training metrics into the records, signals, checkpoints.

This module owns what a run keeps between rounds and across an interruption;
:mod:`fedrisk.experiment.runner` wires these into :func:`~fedrisk.experiment.runner.run_experiment`,
and :mod:`fedrisk.experiment.checkpoint` owns the file format (manifest, previous file, safe loading).
:class:`MetricsWriter` appends each evaluation record to ``metrics.jsonl``; :class:`TrainMetrics`
adds the round's training metrics (``train_*``) to each evaluation record; :class:`SignalGuard`
turns SIGINT / SIGTERM into a flag; :class:`Checkpointer` writes checkpoints after completed
rounds and stops the run (``_Stop``) once a signal was seen; :func:`save_checkpoint` /
:func:`load_checkpoint` write and read one checkpoint.

Checkpoints and exact resume.  Every random draw of a run comes from a generator derived from
``(seed, round, client, stream)`` by :mod:`fedrisk.rng`, so the random state of a run *is* its
seed and its round.  A checkpoint therefore holds the round, the seed, the server state, every
client's state, the communication ledger and the evaluation history (plus the global
torch / NumPy / Python generator states, so that code drawing from them resumes too), and
``--resume`` continues bit-exactly: a run of 10 rounds and a run interrupted after 5 and
resumed end with identical metrics.  Checkpoints are written after a round once
``run.checkpoint_seconds`` (30 s) have passed since the last one, every ``run.checkpoint_every``
rounds if set, at the end, and on SIGINT / SIGTERM: the handler only sets a flag, the current round
(and its evaluation, if one is due) finishes, the checkpoint is written and the run stops with
:class:`~fedrisk.experiment.runner.RunInterrupted` (exit code 130 / 143 from the CLI).  A second
SIGINT stops at once.  Checkpoint files carry a SHA-256 manifest, the previous one is kept as
``checkpoint.pt.prev`` and they are read without running code (:mod:`fedrisk.experiment.checkpoint`):
a damaged newest file falls back to the previous one with a warning, so ``kill -9`` at any moment
is safe.

Example (the handler a signal reaches inside the guard; tests/experiment send real signals):
    >>> import signal
    >>> with SignalGuard() as guard:
    ...     guard._handle(signal.SIGTERM, None)  # what SIGTERM does: only the flag, the round finishes
    >>> SIGNAL_NAMES[guard.signum]
    'SIGTERM'
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

import fedrisk
from fedrisk.api import Callback, History
from fedrisk.errors import FedriskError
from fedrisk.experiment.checkpoint import (
    load_newest,
    pack_global_rng,
    previous_path,
    read_manifest,
    replace_with_previous,
    verify,
    write_checkpoint,
)
from fedrisk.experiment.outputs import append_jsonl
from fedrisk.runtime.client_store import DiskClientStates, is_snapshot_ref, snapshot_problem
from fedrisk.runtime.simulation import RoundReport, Simulation

__all__ = [
    "CHECKPOINT_FORMAT",
    "SIGNAL_NAMES",
    "Checkpointer",
    "MetricsWriter",
    "SignalGuard",
    "TrainMetrics",
    "load_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = 1
SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class MetricsWriter(Callback):
    """Appends every evaluation record to ``metrics.jsonl`` (flushed line by line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        append_jsonl(self.path, record)


class TrainMetrics(Callback):
    """Adds the last round's mean training metrics to each evaluation record as
    ``train_<name>`` (e.g. ``train_loss``: the mean over the round's participating clients of
    their mean local loss).  The record is the one the history keeps, so ``metrics.jsonl``,
    the history and the checkpoint agree."""

    def __init__(self) -> None:
        self._last: tuple[int, dict[str, float]] | None = None

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        self._last = (sim.round, dict(report.train_metrics))

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        if self._last is not None and self._last[0] == record.get("round"):
            for name, value in self._last[1].items():
                record[f"train_{name}"] = value


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


class SignalGuard:
    """Within ``with``: SIGINT / SIGTERM only set :attr:`signum` (the run finishes its round);
    a second SIGINT raises ``KeyboardInterrupt``.  Handlers are installed only in the main
    thread and restored on exit."""

    def __init__(self, stream: TextIO | None = None, newline: bool = False) -> None:
        self.signum: int | None = None
        self.stream = stream
        self.newline = newline  # end a progress bar's line before the message
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        if self.stream is not None:
            try:
                self.stream.write(
                    ("\n" if self.newline else "")
                    + f"{SIGNAL_NAMES.get(signum, signum)} received: finishing the current round, then writing a "
                    "checkpoint (press Ctrl-C again to stop at once)\n"
                )
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Checkpointer(Callback):
    """Writes checkpoints after completed rounds: every ``every`` rounds, after the first round
    that ends ``seconds`` or more after the last checkpoint (wall clock; 0 = never, likewise
    ``every = 0``) and, when ``guard`` has seen a signal, once more before stopping the run.
    A time interval keeps the cost of checkpoints small whatever a round costs: a run of many
    millisecond rounds writes one every 30 s, not every 10 rounds.

    A round counts as completed after its evaluation when one is due, so the checkpoint's
    history always holds every evaluation up to its round.  With ``agree`` (the distributed
    executor's ``any_rank``) a signal seen by any process stops every process after the same
    round; only the primary process writes.
    """

    def __init__(
        self,
        path: Path,
        config: Mapping[str, Any],
        rounds: int,
        eval_every: int,
        every: int,
        guard: SignalGuard | None,
        history: History,
        elapsed: Any,
        agree: Callable[[bool], bool] | None = None,
        seconds: float = 0.0,
        extra: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.path = path
        self.extra = extra
        self.seconds = seconds
        self._last = time.monotonic()
        self.agree = agree
        self.config = dict(config)
        self.rounds = rounds
        self.eval_every = eval_every
        self.every = every
        self.guard = guard
        self.history = history
        self.elapsed = elapsed

    def _is_eval_round(self, r: int) -> bool:
        return r % self.eval_every == 0 or r == self.rounds

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        if not self._is_eval_round(sim.round):
            self._completed(sim)

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        if sim.round > 0 and record.get("round") == sim.round:
            self._completed(sim)

    def _completed(self, sim: Simulation) -> None:
        seen = self.guard is not None and self.guard.signum is not None
        if self.agree is not None:  # every process stops after the same round
            seen = self.agree(seen)
        if seen:
            self.save(sim)
            signum = self.guard.signum if self.guard is not None and self.guard.signum is not None else signal.SIGTERM
            raise _Stop(signum)
        due = bool(self.every) and sim.round % self.every == 0
        due = due or (self.seconds > 0 and time.monotonic() - self._last >= self.seconds)
        if due and sim.round < self.rounds:
            self.save(sim)

    def save(self, sim: Simulation) -> None:
        self._last = time.monotonic()
        if not sim.executor.is_primary:
            return
        save_checkpoint(self.path, sim, self.config, self.history, self.elapsed(), self.extra() if self.extra else None)


def save_checkpoint(
    path: Path,
    sim: Simulation,
    config: Mapping[str, Any],
    history: History,
    elapsed: float,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the checkpoint of ``sim`` atomically (see the module docstring for its content);
    ``extra`` adds the run's own bookkeeping (the work counters, the selected model)."""
    state = sim.state_dict()  # client states on disk: a snapshot of linked files, not loaded
    disk = isinstance(sim.client_states, DiskClientStates)
    if not disk:
        state["client_states"] = sim.executor.collect_states(sim.client_states)
    write_checkpoint(
        path,
        {
            "format": CHECKPOINT_FORMAT,
            "fedrisk_version": fedrisk.__version__,
            "config": dict(config),
            "round": sim.round,
            "simulation": state,
            "history": [dict(r) for r in history.records],
            "elapsed": float(elapsed),
            "rng": pack_global_rng(),
            **dict(extra or {}),
        },
        format=CHECKPOINT_FORMAT,
        round=sim.round,
        **({"states_snapshot": state["client_states"]["snapshot"]} if disk else {}),
    )
    if disk:  # keep the snapshots of the newest and the previous checkpoint only
        keep = [read_manifest(p).get("states_snapshot") for p in (path, previous_path(path))]
        sim.client_states.prune(name for name in keep if name)


def load_checkpoint(path: Path, states_folder: Path | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (checked and loaded without running
    code; a bad newest file falls back to the previous one with a warning, see
    :mod:`fedrisk.experiment.checkpoint`).

    With client states on disk (in ``states_folder``), a checkpoint is good only if every file of
    its snapshot is there with its recorded SHA-256: when the newest one's snapshot is damaged,
    the previous checkpoint and its snapshot are used with a warning, and the newest file is
    replaced by the previous one (so that the next checkpoint keeps a usable previous one)."""

    newest = path

    def snapshot_ok(ckpt: Any) -> str | None:
        states = ckpt.get("simulation", {}).get("client_states") if isinstance(ckpt, dict) else None
        if states_folder is None or not is_snapshot_ref(states):
            return None
        problem = snapshot_problem(states_folder, states)
        return None if problem is None else f"{newest}: {problem}"

    ckpt, path = load_newest(newest, check=snapshot_ok)
    if path != newest and newest.is_file() and verify(newest) is None:  # whole file, unusable snapshot
        replace_with_previous(newest)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise FedriskError(f"{path} is not a fedrisk checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt
