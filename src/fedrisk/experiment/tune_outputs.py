"""The outputs of a ``fedrisk tune`` study: ``trials.md``, ``best.toml`` / ``best.json`` and
``history.png`` (see :mod:`fedrisk.experiment.tune`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig, apply_overrides
from fedrisk.experiment.outputs import atomic_write_text, markdown_rows
from fedrisk.experiment.schema import format_value, to_toml_value
from fedrisk.experiment.selection import lower_is_better
from fedrisk.experiment.tune_space import select_overrides, short

if TYPE_CHECKING:
    from fedrisk.experiment.tune import TuneSpec


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
    rows = []
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
        rows.append(row)
    return markdown_rows(head, rows, text_columns=0)


def plot_history(trials: Sequence[Any], spec: TuneSpec, path: Path) -> Path:
    """Each trial's value (pruned ones: their last reported value) and the best so far.

    Drawn on a matplotlib ``Figure`` with the Agg canvas, without pyplot (no global figure
    state to close; importing pyplot on top costs about 15 ms of CPU)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    lower = lower_is_better(spec.metric)
    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    best, xs, ys = None, [], []
    done: tuple[list[int], list[float]] = ([], [])
    pruned: tuple[list[int], list[float]] = ([], [])
    for t in trials:
        i = t.user_attrs.get("index", t.number) + 1
        if t.state.name == "COMPLETE":
            done[0].append(i)
            done[1].append(t.value)
            best = t.value if best is None else (min(best, t.value) if lower else max(best, t.value))
        elif t.state.name == "PRUNED" and t.intermediate_values:
            pruned[0].append(i)
            pruned[1].append(t.intermediate_values[max(t.intermediate_values)])
        if best is not None and t.state.name in ("COMPLETE", "PRUNED"):
            xs.append(i)
            ys.append(best)
    ax.step(xs, ys, where="post", color="C1", label="best so far")
    ax.scatter(*done, color="C0", zorder=3, label="complete")
    ax.scatter(*pruned, color="C3", marker="x", zorder=3, label="pruned (last value)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel(spec.metric)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_outputs(
    out: Path, base: ExperimentConfig, spec: TuneSpec, plots: bool = True, study: Any = None
) -> TuneResult:
    """``best.toml``, ``trials.md``, ``history.png`` (and ``best.json``) of the study in ``out``."""
    if study is None:
        from fedrisk.experiment.tune import open_study

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
