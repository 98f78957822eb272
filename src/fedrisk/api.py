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


def evaluation_record(sim: Simulation, metrics: Sequence[str], splits: Sequence[str], elapsed: float) -> dict[str, Any]:
    record: dict[str, Any] = {"round": sim.round}
    rows: list[dict[str, float]] = []
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
) -> History:
    """Run ``algorithm`` on ``federation`` for ``rounds`` rounds and return the history."""
    sim = Simulation(
        algorithm,
        federation,
        seed=seed,
        executor=executor,
        dtype=dtype,
        attack=attack,
        byzantine=byzantine,
        on_client_failure=on_client_failure,
    )
    return run_simulation(
        sim,
        rounds,
        eval_every=eval_every,
        eval_at_start=eval_at_start,
        metrics=metrics,
        splits=splits,
        callbacks=callbacks,
    )
