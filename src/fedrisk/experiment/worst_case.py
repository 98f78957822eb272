"""The worst case over attacks: per method, the final metric under each attack, the worst attack,
and a method x attack heat map (``fedrisk report`` adds it when the runs vary ``attack.name``).

A run's *method* is its configuration label without the attack (a sweep's variant name, e.g.
``frpg`` in ``frpg,attack.name=ipm``); its *attack* is ``attack.name`` (``none`` without one).
For each method and seed, the worst-over-attacks value is the smallest final value over the
attacks that seed ran (the largest for a loss); the table gives its mean ± sample std over seeds,
beside the mean final value under every attack.  A run that stopped with an error (its
``failure.json``, e.g. NaN/inf replies that the method refuses) has no final value: its cell
reads ``stopped (round r)``, the worst case is taken over the attacks that left a model, the
column "stopped by" lists the attacks that stopped the method, and the errors are listed below
the table (one line per method and attack, the first seed's message).

Example:
    >>> rows = {("frpg", "ipm"): {0: 0.8, 1: 0.7}, ("frpg", "max_norm"): {0: 0.1, 1: 0.2}}
    >>> worst_over_attacks(rows, "test_accuracy")["frpg"]
    [0.1, 0.2]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "WorstCase",
    "final_by_method_attack",
    "heatmap",
    "stopped_by_method_attack",
    "worst_case_section",
    "worst_over_attacks",
]

NO_ATTACK = "none"


@dataclass
class WorstCase:
    """The markdown table and the heat map file (None without plots)."""

    table: str
    plot: Path | None


def _method_and_attack(group: Any) -> tuple[str, str]:
    attack = str(group.config.get("attack.name", NO_ATTACK))
    parts = [p for p in group.label.split(",") if not p.startswith("attack.name=")]
    return ",".join(parts) or str(group.config.get("algorithm.name", "?")), attack


def final_by_method_attack(groups: Sequence[Any], metric: str) -> dict[tuple[str, str], dict[int, float]]:
    """``(method, attack) -> {seed: final value}`` (runs without the metric left out)."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for g in groups:
        key = _method_and_attack(g)
        for run, seed in zip(g.runs, g.seeds, strict=True):
            finals = [float(r[metric]) for r in run.records if metric in r]
            if finals:
                out.setdefault(key, {})[seed] = finals[-1]
    return out


def stopped_by_method_attack(groups: Sequence[Any]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """``(method, attack) -> {seed: failure}`` for the runs that stopped with an error (``failure.json``)."""
    out: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for g in groups:
        key = _method_and_attack(g)
        for run, seed in zip(g.runs, g.seeds, strict=True):
            if getattr(run, "failure", None) is not None:
                out.setdefault(key, {})[seed] = run.failure
    return out


def worst_over_attacks(
    values: Mapping[tuple[str, str], Mapping[int, float]],
    metric: str,
    stopped: Mapping[tuple[str, str], Mapping[int, Any]] | None = None,
) -> dict[str, list[float]]:
    """Per method, per seed (that every one of its attacks ran: to a value, or ``stopped`` with
    an error), the worst final value over the attacks that left a value in that seed."""
    from fedrisk.experiment.selection import lower_is_better

    pick = max if lower_is_better(metric) else min
    stopped = stopped or {}
    out: dict[str, list[float]] = {}
    for method in dict.fromkeys(m for m, _ in values):
        attacks = dict.fromkeys([*(a for m, a in values if m == method), *(a for m, a in stopped if m == method)])
        ran = [set(values.get((method, a), {})) | set(stopped.get((method, a), {})) for a in attacks]
        seeds = sorted(set.intersection(*ran))
        series = [v for (m, _), v in values.items() if m == method]
        out[method] = [pick(s[i] for s in series if i in s) for i in seeds if any(i in s for s in series)]
    return out


def _fmt(values: Sequence[float]) -> str:
    from fedrisk.experiment.report import format_mean_std

    return format_mean_std(list(values), digits=3) if values else "–"


def heatmap(
    values: Mapping[tuple[str, str], Mapping[int, float]],
    metric: str,
    path: Path,
    stopped: Mapping[tuple[str, str], Any] | None = None,
) -> Path:
    """A method x attack heat map of the mean final ``metric`` over seeds, each cell annotated;
    ``stopped`` cells (runs that stopped with an error and left no value) read "stopped"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stopped = stopped or {}
    methods = list(dict.fromkeys([*(m for m, _ in values), *(m for m, _ in stopped)]))
    attacks = list(dict.fromkeys([*(a for _, a in values), *(a for _, a in stopped)]))
    grid = [[math.nan] * len(attacks) for _ in methods]
    for (m, a), v in values.items():
        grid[methods.index(m)][attacks.index(a)] = sum(v.values()) / len(v)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(attacks), 1.0 + 0.45 * len(methods)))
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(attacks)), attacks, rotation=40, ha="right")
    ax.set_yticks(range(len(methods)), methods)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v == v:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.5 else "k")
            elif (methods[i], attacks[j]) in stopped:
                ax.text(j, i, "stopped", ha="center", va="center", fontsize=6, color="r")
    fig.colorbar(im, ax=ax, label=f"final {metric} (mean over seeds)")
    ax.set_title(f"final {metric}: method x attack")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def worst_case_section(groups: Sequence[Any], metrics: Sequence[str], out_dir: Path, plots: bool) -> WorstCase | None:
    """The worst-case table (and heat map) when the runs cover at least two attacks or some
    stopped with an error, else None.

    The metric is ``test_accuracy`` when present, else the first of ``metrics``.
    """
    several = len({_method_and_attack(g)[1] for g in groups}) >= 2
    if not metrics or not (several or any(getattr(r, "failure", None) for g in groups for r in g.runs)):
        return None
    metric = "test_accuracy" if "test_accuracy" in metrics else metrics[0]
    values = final_by_method_attack(groups, metric)
    stopped = stopped_by_method_attack(groups)
    if not values and not stopped:
        return None
    attacks = list(dict.fromkeys([*(a for _, a in values), *(a for _, a in stopped)]))
    methods = list(dict.fromkeys([*(m for m, _ in values), *(m for m, _ in stopped)]))
    worst = worst_over_attacks(values, metric, stopped)
    head = f"| method | worst {metric} over attacks | worst attack (mean) | stopped by | " + " | ".join(attacks) + " |"
    lines = [
        f"Worst case over attacks (final {metric}; per seed the worst attack, then mean ± std over seeds; "
        "runs that stopped with an error are listed under the table and left out of the worst case):",
        "",
        head,
        "|---|---:|---|---|" + "---:|" * len(attacks),
    ]
    from fedrisk.experiment.selection import lower_is_better

    for method in methods:
        means = {a: sum(v.values()) / len(v) for (m, a), v in values.items() if m == method}
        worst_attack = (max if lower_is_better(metric) else min)(means, key=lambda a: means[a]) if means else "–"
        stops = [a for (m, a) in stopped if m == method]
        cells = [_cell(values.get((method, a), {}), stopped.get((method, a), {})) for a in attacks]
        row = f"| {method} | {_fmt(worst.get(method, []))} | {worst_attack} | {', '.join(stops) or '–'} | "
        lines.append(row + " | ".join(cells) + " |")
    if stopped:
        lines += ["", "Runs that stopped with an error (no model; the first seed's message):", ""]
        for (method, attack), by_seed in stopped.items():
            failure = by_seed[min(by_seed)]
            seeds = ", ".join(map(str, sorted(by_seed)))
            lines.append(
                f"- {method} under {attack} (seeds {seeds}): round {failure.get('round')}: {failure.get('error')}"
            )
    plot = heatmap(values, metric, out_dir / "worst_case_heatmap.png", stopped) if plots else None
    return WorstCase("\n".join(lines), plot)


def _cell(values: Mapping[int, float], stopped: Mapping[int, Mapping[str, Any]]) -> str:
    """Mean ± std of the seeds that finished, and ``stopped (round r)`` for those that did not."""
    rounds = sorted({int(f.get("round", -1)) for f in stopped.values()})
    note = f"stopped (round {', '.join(map(str, rounds))})" if stopped else ""
    if not values:
        return note or "–"
    return _fmt(list(values.values())) + (f"; {len(stopped)} seed(s) {note}" if stopped else "")
