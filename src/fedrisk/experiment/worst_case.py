"""The worst case over attacks: per method, the final metric under each attack, the worst attack,
and a method x attack heat map (``fedrisk report`` adds it when the runs vary ``attack.name``).

A run's *method* is its configuration label without the attack (a sweep's variant name, e.g.
``frpg`` in ``frpg,attack.name=ipm``); its *attack* is ``attack.name`` (``none`` without one).
For each method and seed, the worst-over-attacks value is the smallest final value over the
attacks that seed ran (the largest for a loss); the table gives its mean ± sample std over seeds,
beside the mean final value under every attack.

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

__all__ = ["WorstCase", "final_by_method_attack", "heatmap", "worst_case_section", "worst_over_attacks"]

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


def worst_over_attacks(values: Mapping[tuple[str, str], Mapping[int, float]], metric: str) -> dict[str, list[float]]:
    """Per method, per seed (that every one of its attacks ran), the worst final value over the attacks."""
    from fedrisk.experiment.runner import lower_is_better

    pick = max if lower_is_better(metric) else min
    out: dict[str, list[float]] = {}
    for method in dict.fromkeys(m for m, _ in values):
        series = [v for (m, _), v in values.items() if m == method]
        seeds = sorted(set.intersection(*(set(s) for s in series)))
        out[method] = [pick(s[i] for s in series) for i in seeds]
    return out


def _fmt(values: Sequence[float]) -> str:
    from fedrisk.experiment.report import format_mean_std

    return format_mean_std(list(values), digits=3) if values else "–"


def heatmap(values: Mapping[tuple[str, str], Mapping[int, float]], metric: str, path: Path) -> Path:
    """A method x attack heat map of the mean final ``metric`` over seeds, each cell annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(m for m, _ in values))
    attacks = list(dict.fromkeys(a for _, a in values))
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
    fig.colorbar(im, ax=ax, label=f"final {metric} (mean over seeds)")
    ax.set_title(f"final {metric}: method x attack")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def worst_case_section(groups: Sequence[Any], metrics: Sequence[str], out_dir: Path, plots: bool) -> WorstCase | None:
    """The worst-case table (and heat map) when the runs cover at least two attacks, else None.

    The metric is ``test_accuracy`` when present, else the first of ``metrics``.
    """
    if len({_method_and_attack(g)[1] for g in groups}) < 2 or not metrics:
        return None
    metric = "test_accuracy" if "test_accuracy" in metrics else metrics[0]
    values = final_by_method_attack(groups, metric)
    if not values:
        return None
    attacks = list(dict.fromkeys(a for _, a in values))
    worst = worst_over_attacks(values, metric)
    head = f"| method | worst {metric} over attacks | worst attack (mean) | " + " | ".join(attacks) + " |"
    lines = [
        f"Worst case over attacks (final {metric}; per seed the worst attack, then mean ± std over seeds):",
        "",
        head,
        "|---|---:|---|" + "---:|" * len(attacks),
    ]
    from fedrisk.experiment.runner import lower_is_better

    for method, w in worst.items():
        means = {a: sum(v.values()) / len(v) for (m, a), v in values.items() if m == method}
        worst_attack = (max if lower_is_better(metric) else min)(means, key=lambda a: means[a])
        cells = [_fmt(list(values.get((method, a), {}).values())) for a in attacks]
        lines.append(f"| {method} | {_fmt(w)} | {worst_attack} | " + " | ".join(cells) + " |")
    plot = heatmap(values, metric, out_dir / "worst_case_heatmap.png") if plots else None
    return WorstCase("\n".join(lines), plot)
