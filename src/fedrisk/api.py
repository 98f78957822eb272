"""The Python entry point: run a federation from objects and get its history.

Example:
    >>> import torch
    >>> from fedrisk import run_federation
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(25)), s.subset(range(25, 50))], 2, test=s.subset(range(50, 60)))
    >>> alg = FedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, lr=0.1)
    >>> history = run_federation(fed, alg, rounds=3, metrics=["accuracy"])
    >>> [r["round"] for r in history.records], "test_accuracy" in history.last()
    ([1, 2, 3], True)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedrisk.algorithms.base import Algorithm
from fedrisk.attacks.base import Attack
from fedrisk.data.federation import Federation
from fedrisk.errors import FedriskError, check_range
from fedrisk.runtime.evaluation import default_metrics, evaluate, predict
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.simulation import RoundReport, Simulation
from fedrisk.tree import Tree


@dataclass
class History:
    """One record per evaluation: ``round`` (rounds completed), the metrics, the bytes sent
    down / up so far and the wall time."""

    records: list[dict[str, Any]] = field(default_factory=list)

    def last(self) -> dict[str, Any]:
        if not self.records:
            raise FedriskError("the history is empty (no evaluation has run)")
        return self.records[-1]

    def series(self, key: str) -> list[Any]:
        return [r[key] for r in self.records if key in r]


class Callback:
    """Hooks called by :func:`run_federation` (all optional)."""

    def on_start(self, sim: Simulation) -> None: ...

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None: ...

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None: ...

    def on_end(self, sim: Simulation, history: History) -> None: ...


class RoundDisplay(Callback):
    """A callback written as plain methods, ``start(round)``, ``round_end(round, train_metrics)``,
    ``evaluation(record)`` and ``close()``, which a display can also be driven by without a
    :class:`Simulation`; the hooks only forward to them."""

    def on_start(self, sim: Simulation) -> None:
        self.start(sim.round)

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        self.round_end(sim.round, report.train_metrics)

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        self.evaluation(record)

    def on_end(self, sim: Simulation, history: History) -> None:
        self.close()

    def start(self, round: int) -> None: ...

    def round_end(self, round: int, train_metrics: dict[str, float]) -> None: ...

    def evaluation(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def evaluation_record(sim: Simulation, metrics: Sequence[str], splits: Sequence[str], elapsed: float) -> dict[str, Any]:
    record: dict[str, Any] = {"round": sim.round}
    rows: list[dict[str, Any]] = []
    record.update(
        evaluate(sim.algorithm, sim.server_state, sim.client_states, sim.federation, metrics, splits, None, rows)
    )
    sim.client_scores = rows  # the per-client values of this evaluation (clients.csv)
    record["bytes_down"] = sim.ledger.total_down
    record["bytes_up"] = sim.ledger.total_up
    record["wall_time"] = elapsed
    return record


def resolve_metrics(sim: Simulation, metrics: Sequence[str] | None) -> list[str]:
    if metrics is not None:
        return list(metrics)
    probe = sim.federation.clients[0].x[:1]
    params = sim.algorithm.global_params(sim.server_state)
    if params is None:
        params = sim.algorithm.personal_params(sim.server_state, sim.client_states[0], 0)
    out = predict(sim.algorithm, params, probe)
    return default_metrics(sim.federation, int(out.reshape(1, -1).shape[1]))


def run_simulation(
    sim: Simulation,
    rounds: int,
    *,
    eval_every: int = 1,
    eval_at_start: bool = False,
    metrics: Sequence[str] | None = None,
    splits: Sequence[str] = ("test",),
    callbacks: Sequence[Callback] = (),
    history: History | None = None,
    elapsed_before: float = 0.0,
) -> History:
    """Advance ``sim`` until it has completed ``rounds`` rounds, evaluating every
    ``eval_every`` rounds and after the last one.  Resumes from ``sim.round``."""
    check_range("rounds", rounds, 0)
    check_range("eval_every", eval_every, 1)
    history = history if history is not None else History()
    names = resolve_metrics(sim, metrics)
    start = time.perf_counter() - elapsed_before
    for cb in callbacks:
        cb.on_start(sim)
    if eval_at_start and sim.round == 0:
        _record(sim, names, splits, start, history, callbacks)
    while sim.round < rounds:
        report = sim.step()
        for cb in callbacks:
            cb.on_round_end(sim, report)
        if sim.round % eval_every == 0 or sim.round == rounds:
            _record(sim, names, splits, start, history, callbacks)
    for cb in callbacks:
        cb.on_end(sim, history)
    return history


def _record(sim, names, splits, start, history, callbacks) -> None:
    record = evaluation_record(sim, names, splits, time.perf_counter() - start)
    history.records.append(record)
    for cb in callbacks:
        cb.on_evaluation(sim, record)


class ProgressBar(RoundDisplay):
    """A ``tqdm`` progress bar over the rounds (to standard error), with the last round's mean
    training loss and the latest evaluation's first metrics: what :func:`run_federation` shows
    when standard error is a terminal, and the bar of ``fedrisk run`` (``progress = "bar"``,
    :class:`fedrisk.experiment.progress.Progress`).  The bar is created when the run starts, so a
    resumed run starts part-way (``round``); its times (and rate) are this session's.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = ProgressBar(total_rounds=3, file=out, label="fedavg")
        >>> bar.start(round=1)
        >>> bar.round_end(2, {"loss": 0.5})
        >>> bar.evaluation({"round": 2, "test_accuracy": 0.75, "wall_time": 1.0})
        >>> bar.close()
        >>> line = out.getvalue().split(chr(13))[-1]
        >>> "fedavg" in line, "2/3" in line, "loss=0.5" in line, "test_accuracy=0.75" in line
        (True, True, True, True)
    """

    SKIPPED = ("round", "bytes_down", "bytes_up", "wall_time", "steps_per_client", "samples_seen")
    """Record keys that are not metrics (left off the bar)."""

    def __init__(
        self,
        total_rounds: int,
        file: Any = None,
        max_metrics: int = 2,
        leave: bool = True,
        label: str = "",
    ) -> None:
        self.total, self.file, self.max_metrics, self.leave = total_rounds, file, max_metrics, leave
        self.label = label
        self.bar: Any = None
        self._postfix: dict[str, str] = {}

    # -- plain methods (usable without a Simulation; the hooks come from RoundDisplay) --------
    def start(self, round: int) -> None:
        """Open the bar at ``round`` (a resumed run starts part-way)."""
        from tqdm.auto import tqdm

        if self.bar is not None:
            self.bar.close()
        self.bar = tqdm(
            total=self.total,
            initial=round,
            file=self.file if self.file is not None else sys.stderr,
            unit="round",
            leave=self.leave,
            desc=self.label or None,
            dynamic_ncols=True,
        )
        self._postfix = {}

    def round_end(self, round: int, train_metrics: Any) -> None:
        if self.bar is None:
            self.start(round - 1)
        if "loss" in train_metrics:
            self._postfix["loss"] = f"{float(train_metrics['loss']):.4g}"
        self.bar.set_postfix(self._postfix, refresh=False)
        self.bar.update(round - self.bar.n)

    def evaluation(self, record: Any) -> None:
        if self.bar is None:
            self.start(int(record.get("round", 0)))
        shown = [(k, v) for k, v in record.items() if k not in self.SKIPPED and not k.startswith("train_")]
        for k, v in shown[: self.max_metrics]:
            self._postfix[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
        self.bar.set_postfix(self._postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _attached_to_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def run_federation(
    federation: Federation,
    algorithm: Algorithm,
    *,
    rounds: int,
    seed: int = 0,
    executor: Executor | str = "sequential",
    dtype: torch.dtype = torch.float32,
    eval_every: int = 1,
    eval_at_start: bool = False,
    metrics: Sequence[str] | None = None,
    splits: Sequence[str] = ("test",),
    attack: Attack | None = None,
    byzantine: Sequence[int] = (),
    on_client_failure: str = "raise",
    callbacks: Sequence[Callback] = (),
    init_params: Tree | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    device: str | torch.device | None = None,
) -> History:
    """Run ``algorithm`` on ``federation`` for ``rounds`` rounds and return the history.

    Args:
        executor: ``"sequential"`` (default), ``"vectorized"``, ``"distributed"`` or an
            :class:`~fedrisk.runtime.executor.Executor`.
        init_params: the initial model parameters (default: the algorithm's seeded fresh
            initialisation); e.g. ``FunctionalModel(module, init="module").init_params()`` for a
            pretrained module's own weights.  A model with BatchNorm may carry its running
            statistics beside them (as ``global_params`` returns them).
        threads: torch's intra-op threads during the run (restored afterwards); None leaves
            torch's setting alone.
        progress: a ``tqdm`` bar on standard error; None (default) shows it when standard
            error is a terminal.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``: where the data, parameters
            and states live (see :mod:`fedrisk.runtime.device`); None leaves the federation
            where it is.
        The other arguments are those of :class:`~fedrisk.runtime.simulation.Simulation` and
        :func:`run_simulation`.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from fedrisk.algorithms.fedavg import FedAvg
        >>> from fedrisk.data.federation import Federation, Samples
        >>> from fedrisk.models import FunctionalModel
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> g = torch.Generator().manual_seed(0)
        >>> s = Samples(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))
        >>> fed = Federation("toy", [s.subset(range(25)), s.subset(range(25, 50))], 2, test=s.subset(range(50, 60)))
        >>> pretrained = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        >>> model = FunctionalModel(pretrained, init="module")
        >>> alg = FedAvg(model=model, loss=cross_entropy, lr=0.1, batch_size=8)
        >>> history = run_federation(fed, alg, rounds=2, executor="vectorized", threads=1, progress=False,
        ...                          init_params=model.init_params(), metrics=["accuracy"])
        >>> [r["round"] for r in history.records], 0.0 <= history.last()["test_accuracy"] <= 1.0
        ([1, 2], True)
    """
    if threads is not None:
        check_range("threads", threads, 1)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        sim = Simulation(
            algorithm,
            federation,
            seed=seed,
            executor=executor,
            dtype=dtype,
            attack=attack,
            byzantine=byzantine,
            on_client_failure=on_client_failure,
            init_params=init_params,
            device=device,
        )
        show = _attached_to_terminal() if progress is None else bool(progress)
        bar = [ProgressBar(rounds)] if show else []
        return run_simulation(
            sim,
            rounds,
            eval_every=eval_every,
            eval_at_start=eval_at_start,
            metrics=metrics,
            splits=splits,
            callbacks=[*callbacks, *bar],
        )
    finally:
        torch.set_num_threads(before)
