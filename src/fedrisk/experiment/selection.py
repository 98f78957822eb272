"""Model selection on validation and the budgets a run spends (issue 24: fair comparisons).

* :class:`Selector` (``run.select_by``): after each evaluation, the round whose validation
  metric beats every earlier one is selected and its model saved to ``DIR/selected.pt``; the
  summary, ``fedrisk report`` and the sweep tables give the test metrics *at that round* beside
  the last round.  Selection reads only the validation key, never a test metric.
* :class:`WorkMeter`: local gradient steps per client and training rows drawn, added to every
  evaluation record beside the bytes and the wall time, so methods can be compared at equal
  budgets (``fedrisk report --at steps=...``).

Example:
    >>> recs = [{"round": 1, "validation_auroc": 0.9, "test_auroc": 0.70},
    ...         {"round": 2, "validation_auroc": 0.8, "test_auroc": 0.95}]
    >>> selected_record(recs, "validation_auroc")["test_auroc"]  # not the test-best round 2
    0.7
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedrisk.api import Callback
from fedrisk.errors import FedriskError
from fedrisk.experiment.outputs import atomic_torch_save
from fedrisk.runtime.evaluation import LOWER_IS_BETTER
from fedrisk.runtime.simulation import RoundReport, Simulation


def lower_is_better(metric: str) -> bool:
    """``test_log_loss`` -> True (losses are minimised), ``test_accuracy`` -> False."""
    return any(metric.endswith(name) or f"_{name}_" in metric for name in LOWER_IS_BETTER)


def record_key(record: Mapping[str, Any], key: str) -> str:
    """The key under which ``record`` holds the selection metric ``key``: personalised runs name
    their global model's metrics ``global_*`` (``global_validation_accuracy``).

    Example:
        >>> record_key({"global_validation_auroc": 0.9}, "validation_auroc")
        'global_validation_auroc'
    """
    return key if key in record else "global_" + key


def selected_record(records: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any] | None:
    """The evaluation that ``run.select_by`` (the record key ``key``) selects: the best value,
    the earliest round among ties, losses minimised; None without one.  Reads only ``key``, so
    the test metrics of the record it returns never influenced the choice.

    Example:
        >>> recs = [{"round": 1, "validation_auroc": 0.8, "test_auroc": 0.9},
        ...         {"round": 2, "validation_auroc": 0.85, "test_auroc": 0.7}]
        >>> selected_record(recs, "validation_auroc")["round"]
        2
    """
    if not key:
        return None
    lower = lower_is_better(key)
    best: Mapping[str, Any] | None = None
    best_value = 0.0
    for r in records:
        v = r.get(record_key(r, key))
        if not isinstance(v, (int, float)) or v != v:
            continue
        if best is None or (v < best_value if lower else v > best_value):
            best, best_value = r, v
    return None if best is None else dict(best)


def budget(record: Mapping[str, Any]) -> dict[str, Any]:
    """The budgets spent up to ``record``: rounds, local steps per client, samples, bytes, seconds."""
    return {
        "rounds": record.get("round"),
        "steps_per_client": record.get("steps_per_client"),
        "samples_seen": record.get("samples_seen"),
        "bytes": record.get("bytes_down", 0) + record.get("bytes_up", 0),
        "wall_time": record.get("wall_time"),
    }


def draw_work(draws: Any, num_samples: int) -> tuple[int, int]:
    """(local gradient steps, training rows drawn) of one client's round, read from the shapes
    of its draws: a draw tensor of two or more dimensions is ``[steps, rows, ...]`` (minibatch
    indices, FeDXL's positive / negative picks); a one-dimensional one is one pass over its rows
    (CODA's dual-reset batch); a round without draw tensors (a full-batch client) counts as
    one step over all ``num_samples`` rows.  An algorithm whose draws do not show its work may
    define ``work(ctx, draws, num_samples) -> (steps, rows)`` instead.

    Example:
        >>> draw_work({"batches": torch.zeros(5, 32, dtype=torch.long)}, 1000)
        (5, 160)
        >>> draw_work({"pos": torch.zeros(3, 4), "neg": torch.zeros(3, 8)}, 100), draw_work({}, 70)
        ((3, 36), (1, 70))
        >>> draw_work({"batch": torch.zeros(64, dtype=torch.long)}, 500)
        (1, 64)
    """
    from fedrisk.tree import tree_leaves

    leaves = [t for t in tree_leaves(draws) if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not leaves:
        return 1, int(num_samples)
    steps = max(int(t.shape[0]) if t.dim() >= 2 else 1 for t in leaves)
    return steps, sum(int(t.numel()) for t in leaves)


class WorkMeter(Callback):
    """Counts the computation a run spent and adds it to every evaluation record as
    ``steps_per_client`` (local gradient steps summed over the clients' rounds, divided by the
    number of clients) and ``samples_seen`` (training rows drawn, all clients), beside the bytes
    and the wall time: the budgets that ``fedrisk report --at`` compares methods at.

    A round's work is read from the shapes of the participating clients' draws
    (:func:`draw_work`; one draw per distinct client size: shapes depend on the round and the
    size only), so no algorithm needs to report it.  The totals are kept in the checkpoint.
    """

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        from fedrisk.algorithms.base import RoundContext
        from fedrisk.rng import client_generator

        ctx = RoundContext(report.round, sim.info, report.kind)
        by_size: dict[int, list[int]] = {}
        for k in report.clients:
            by_size.setdefault(int(sim.data[k].size), []).append(k)
        for size, ks in by_size.items():
            draws = sim.algorithm.draw(ctx, ks[0], size, client_generator(sim.seed, report.round, ks[0]))
            work = getattr(sim.algorithm, "work", None)
            steps, rows = work(ctx, draws, size) if work is not None else draw_work(draws, size)
            self.steps += steps * len(ks)
            self.samples += rows * len(ks)

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        record["steps_per_client"] = self.steps / sim.federation.num_clients
        record["samples_seen"] = self.samples

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "samples": self.samples}

    def load_state_dict(self, state: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> None:
        if state:
            self.steps, self.samples = int(state["steps"]), int(state["samples"])


class Selector(Callback):
    """Model selection on validation (``run.select_by``): after every evaluation, when the
    record's ``key`` beats every earlier one (strictly: ties keep the earlier round; losses are
    minimised), the round is selected and its model written to ``path``
    (:data:`~fedrisk.experiment.outputs.SELECTED_MODEL`, a ``torch.save`` of plain tensors read
    back with ``weights_only=True``): ``{"round", "selected_by", "value", "global"}`` plus
    ``"personal"`` (one parameter tree per client) for personalised algorithms.  The selected
    model is also kept in the checkpoint, so a resumed run selects exactly as an uninterrupted one.
    """

    def __init__(self, key: str, path: Path, primary: bool = True) -> None:
        self.key = key
        self.path = path
        self.primary = primary
        self.lower = lower_is_better(key)
        self.best: dict[str, Any] | None = None

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        key = record_key(record, self.key)
        if key not in record:
            evaluated = [k for k in record if k.startswith("validation_")]
            raise FedriskError(
                f"run.select_by: {self.key!r} was not evaluated at round {record.get('round')}; evaluated on "
                f"validation: {', '.join(evaluated) or '(nothing)'}"
            )
        v = record[key]
        if not isinstance(v, (int, float)) or v != v:
            return
        if self.best is not None and not (v < self.best["value"] if self.lower else v > self.best["value"]):
            return
        self.best = {"round": int(record["round"]), "selected_by": self.key, "value": float(v)}
        if not self.primary:  # only the writing process keeps the model (file and checkpoint)
            return
        alg = sim.algorithm
        params = alg.global_params(sim.server_state)
        self.best["global"] = {} if params is None else params
        if alg.personalized:
            states = sim.client_states
            self.best["personal"] = [
                alg.personal_params(sim.server_state, states[k], k) for k in range(sim.federation.num_clients)
            ]
        self._write()

    def _write(self) -> None:
        if self.primary and self.best is not None:
            atomic_torch_save(self.best, self.path)

    def state_dict(self) -> dict[str, Any] | None:
        return self.best

    def load_state_dict(self, state: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> None:
        self.best = dict(state) if state else None
        if self.best is not None and self.best.get("selected_by") != self.key:
            self.best = None
        self._write()  # a newer file from rounds after the checkpoint is replaced


# ----------------------------------------------------------------------------- reading runs back


def run_select_key(run: Any) -> str:
    """The record key a run directory (:class:`~fedrisk.experiment.outputs.RunData`) selected
    on: its summary's, or for an unfinished run the one its config resolves to (``"auto"``
    takes the first metric its records evaluate on validation); ``""`` for none."""
    from fedrisk.experiment.schema import AUTO
    from fedrisk.experiment.section_rules import check_select_by

    chosen = (run.summary or {}).get("selected")
    if isinstance(chosen, Mapping) and chosen.get("selected_by"):
        return str(chosen["selected_by"])
    cfg_run, data = run.config.get("run", {}), run.config.get("data", {})
    select_by = cfg_run.get("select_by", AUTO)
    metrics = list(cfg_run.get("metrics") or [])
    first = run.records[0] if run.records else {}
    if not metrics:
        metrics = [k[len("validation_") :] for k in first if k.startswith("validation_") and "personal_" not in k]
        metrics = metrics or [
            k[len("validation_personal_") : -len("_mean")]
            for k in first
            if k.startswith("validation_personal_") and k.endswith("_mean") and not k.endswith("_wmean")
        ]
    fractions = {
        "validation_fraction": float(data.get("validation_fraction", 0.0)),
        "client_validation_fraction": float(data.get("client_validation_fraction", 0.0)),
    }
    try:
        return check_select_by(select_by, fractions, metrics) if metrics else ""
    except FedriskError:
        return ""


BUDGETS = {
    "bytes": ("bytes communicated (down + up)", True),
    "steps": ("local gradient steps per client", False),
    "samples": ("training rows drawn, all clients", True),
    "rounds": ("communication rounds", True),
    "seconds": ("wall time", False),
}
"""The budgets ``fedrisk report --at NAME=LIMIT`` cuts runs at: name -> (meaning, integral)."""


class Budget:
    """An equal-budget cut: ``bytes=2e6`` keeps the evaluations that had used at most 2e6 bytes.

    Example:
        >>> b = parse_budget("steps=100")
        >>> within([{"round": 1, "steps_per_client": 50}, {"round": 2, "steps_per_client": 100},
        ...         {"round": 3, "steps_per_client": 150}], b)["round"]
        2
    """

    def __init__(self, name: str, limit: float) -> None:
        self.name, self.limit = name, float(limit)
        self.integral = BUDGETS[name][1]

    @property
    def label(self) -> str:
        return f"{self.name} ≤ {self.limit:g}"

    def value(self, record: Mapping[str, Any]) -> float | None:
        """The amount of this budget that ``record`` had used (None when not recorded)."""
        if self.name == "bytes":
            return float(record.get("bytes_down", 0) + record.get("bytes_up", 0))
        key = {"steps": "steps_per_client", "samples": "samples_seen", "rounds": "round", "seconds": "wall_time"}
        v = record.get(key[self.name])
        return None if v is None else float(v)


def parse_budget(text: str) -> Budget:
    """``"bytes=2e6"`` -> a :class:`Budget` (names: bytes, steps, samples, rounds, seconds)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    try:
        limit = float(value)
    except ValueError:
        limit = float("nan")
    if not sep or name not in BUDGETS or not limit >= 0:
        raise FedriskError(
            f"--at {text!r} is not allowed; allowed: NAME=LIMIT with NAME one of {', '.join(BUDGETS)} and a number "
            "LIMIT >= 0, e.g. --at bytes=2e6"
        )
    return Budget(name, limit)


def within(records: Sequence[Mapping[str, Any]], budget: Budget) -> Mapping[str, Any] | None:
    """The last evaluation that had used at most ``budget`` (None if even the first used more
    or the runs did not record that budget).  Budgets only grow, so this is the evaluation a
    run would have ended with under that budget."""
    last = None
    for r in records:
        v = budget.value(r)
        if v is None or v > budget.limit:
            break
        last = r
    return last


class Target:
    """A value of a metric to reach: ``validation_auroc=0.9`` is reached at the first
    evaluation with ``validation_auroc >= 0.9`` (``<=`` for losses)."""

    def __init__(self, metric: str, value: float) -> None:
        self.metric, self.value = metric, float(value)
        self.lower = lower_is_better(metric)

    @property
    def label(self) -> str:
        return f"{self.metric} {'≤' if self.lower else '≥'} {self.value:g}"


def parse_target(text: str) -> Target:
    """``"validation_auroc=0.9"`` -> a :class:`Target`.

    Example:
        >>> t = parse_target("test_log_loss=0.3")
        >>> t.label, reach([{"round": 1, "test_log_loss": 0.5}, {"round": 2, "test_log_loss": 0.25}], t)["round"]
        ('test_log_loss ≤ 0.3', 2)
    """
    metric, sep, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not sep or not metric.strip() or v != v:
        raise FedriskError(
            f"--target {text!r} is not allowed; allowed: METRIC=VALUE with a number VALUE, e.g. "
            "--target validation_auroc=0.9"
        )
    return Target(metric.strip(), v)


def reach(records: Sequence[Mapping[str, Any]], target: Target) -> Mapping[str, Any] | None:
    """The first evaluation at or past ``target`` (None if no evaluation reached it)."""
    for r in records:
        v = r.get(target.metric)
        if isinstance(v, (int, float)) and v == v and (v <= target.value if target.lower else v >= target.value):
            return r
    return None
