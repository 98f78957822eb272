"""Reports over runs: group run directories by configuration (the config minus its seed),
tabulate final and best metrics as mean ± std over seeds, and plot one curve per configuration.

* Grouping compares the resolved configs on every key that changes the numbers (see
  :func:`fedrisk.experiment.config.semantic_view`), minus ``run.seed`` / ``run.seeds``.
* A configuration's label is its sweep directory name (``DIR/<label>/seed=<s>``) when the runs
  come from a sweep, else the keys in which the configurations differ (``lr=0.1``; the
  algorithm name alone for ``algorithm.name``; keys that only some configurations have, such
  as one algorithm's own hyper-parameters, are implied by the algorithm name and left out).
* "final" is the last evaluation of each run; "selected" the evaluation of each run's round
  selected on validation (``run.select_by``: the best validation value, never a test one), so a
  run's test metrics are reported at a round its test data did not choose.  The best value of
  a test metric over the rounds (an oracle) is not tabulated (``summary.json`` keeps it as
  ``oracle``).  Standard deviations are sample standard deviations (``ddof = 1``) over seeds;
  with one seed only the mean is shown.
* Budgets: every table gives, per configuration, the local gradient steps per client, the
  training rows drawn, the bytes communicated and the wall time of its runs.  ``at`` cuts the
  runs at an equal budget (``bytes=2e6``, ``steps=100``, ``samples=...``, ``rounds=...``,
  ``seconds=...``): each metric at the last evaluation within the budget.  ``targets``
  (``validation_auroc=0.9``) add the rounds and bytes each run needed to reach a value.
* Curves average over seeds at the rounds every seed evaluated.
* By default the table and plots show the evaluation metrics (``test_*``, ``validation_*``,
  ``personal_*``); training metrics (``train_*``) on request (``metrics=[...]``).

Example:
    >>> [round(v, 6) for v in mean_std([0.5, 0.7])]
    [0.6, 0.141421]
    >>> format_mean_std([0.5, 0.7]), format_mean_std([0.5]), format_mean_std([5e-13, 6e-13])
    ('0.6000 ± 0.1414', '0.5000', '5.50e-13 ± 7.1e-14')
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import semantic_view
from fedrisk.experiment.outputs import PERSONAL_STATS, RunData, atomic_write_text, find_runs, load_run, markdown_rows
from fedrisk.experiment.plots import MB, Curve, plot_curves
from fedrisk.experiment.schema import format_value
from fedrisk.experiment.selection import Budget, Target, reach, run_select_key, selected_record, within

SEED_KEYS = ("run.seed", "run.seeds")
_SEED_DIR = re.compile(r"^seed=\d+$")


@dataclass
class Group:
    """Runs of one configuration (differing only in the seed)."""

    label: str
    runs: list[RunData]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return [int(r.config.get("run", {}).get("seed", 0)) for r in self.runs]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def format_mean_std(values: Sequence[float], digits: int = 4, scientific: bool = True) -> str:
    """``mean ± std`` with ``digits`` decimals; with ``scientific``, a mean that would print as 0
    (``0 < |mean| < 10^-digits / 2``, e.g. a game's ``generator_error`` of 5e-13) in scientific notation."""
    if not values:
        return "–"
    mean, std = mean_std(values)
    if scientific and mean != 0 and abs(mean) < 0.5 * 10.0**-digits:
        return f"{mean:.2e}" if len(values) == 1 else f"{mean:.2e} ± {std:.1e}"
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def group_runs(runs: Sequence[RunData]) -> list[Group]:
    """Group runs whose configs agree on every semantic key but the seed, in first-seen order."""
    keyed: dict[tuple, Group] = {}
    for run in runs:
        view = {k: v for k, v in semantic_view(run.config).items() if k not in SEED_KEYS}
        key = tuple(sorted((k, repr(v)) for k, v in view.items()))
        if key not in keyed:
            keyed[key] = Group("", [], view)
        keyed[key].runs.append(run)
    groups = list(keyed.values())
    _label(groups)
    return groups


def _label(groups: list[Group]) -> None:
    # keys every configuration has and that differ between them; keys only some algorithms have
    # are implied by algorithm.name (shown alone, first)
    shared = set.intersection(*(set(g.config) for g in groups)) if groups else set()
    differing = sorted(
        (k for k in shared if len({repr(g.config[k]) for g in groups}) > 1),
        key=lambda k: (k != "algorithm.name", k),
    )
    for g in groups:
        parents = {r.path.parent for r in g.runs}
        if len(parents) == 1 and all(_SEED_DIR.match(r.path.name) for r in g.runs):
            parent = next(iter(parents))
            if parent.name and len(groups) > 1:
                g.label = parent.name
                continue
        parts = []
        for k in differing:
            v = g.config.get(k)
            shown = v if isinstance(v, str) else format_value(v)
            parts.append(str(shown) if k == "algorithm.name" else f"{k.rsplit('.', 1)[-1]}={shown}")
        g.label = ", ".join(parts) or str(g.config.get("algorithm.name", g.runs[0].path.name))


def metric_names(groups: Sequence[Group]) -> list[str]:
    names: dict[str, None] = {}
    for g in groups:
        for r in g.runs:
            for m in r.metric_names:
                names.setdefault(m, None)
    return list(names)


def _final(run: RunData, metric: str) -> float | None:
    for r in reversed(run.records):
        if metric in r:
            return float(r[metric])
    return None


def _selected(run: RunData) -> dict[str, Any] | None:
    return selected_record(run.records, run_select_key(run))


def _cell(values: Sequence[float | None], digits: int = 4, scientific: bool = True) -> str:
    return format_mean_std([v for v in values if v is not None], digits, scientific)


def _get(record: Mapping[str, Any] | None, key: str) -> float | None:
    if record is None or not isinstance(record.get(key), (int, float)):
        return None
    return float(record[key])


def _mb(record: Mapping[str, Any] | None) -> float | None:
    return None if record is None else (record.get("bytes_down", 0) + record.get("bytes_up", 0)) / MB


def tuned_values(group: Group) -> str:
    """The values ``fedrisk sweep --tune`` selected for a group (its folder's ``tuned.json``), or ""."""
    import json

    parents = {r.path.parent for r in group.runs}
    if len(parents) != 1 or not (next(iter(parents)) / "tuned.json").is_file():
        return ""
    info = json.loads((next(iter(parents)) / "tuned.json").read_text())
    return ", ".join(
        f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={format_value(v)}"
        for k, v in info.get("params", {}).items()
    )


def markdown_table(groups: Sequence[Group], metrics: Sequence[str]) -> str:
    """The results table: one row per configuration (with the values ``fedrisk sweep --tune``
    selected, for tuned sweeps); each metric at the validation-selected round (when any run
    selects) and at the last evaluation; the selected rounds; the budgets spent (local steps per
    client, samples seen, MB communicated, wall time)."""
    selecting = any(_selected(r) is not None for g in groups for r in g.runs)
    tuned = [tuned_values(g) for g in groups]
    head = ["configuration", *(["tuned"] if any(tuned) else []), "seeds", "rounds"]
    for m in metrics:
        head += ([f"selected {m}"] if selecting else []) + [f"final {m}"]
    if selecting:
        head += ["selected round"]
    head += ["steps/client", "samples seen", "MB communicated", "wall time (s)"]
    rows = []
    for g in groups:
        rounds = sorted({int(r.records[-1]["round"]) for r in g.runs if r.records})
        row = [g.label, *([tuned[len(rows)] or "–"] if any(tuned) else []), str(len(g.runs))]
        row.append("/".join(map(str, rounds)) or "0")
        lasts = [r.records[-1] if r.records else None for r in g.runs]
        chosen = [_selected(r) for r in g.runs]
        for m in metrics:
            if selecting:
                row.append(_cell([_get(c, m) for c in chosen]))
            row.append(_cell([_final(r, m) for r in g.runs]))
        if selecting:
            row.append("/".join(str(c["round"]) if c else "–" for c in chosen))
        row += [
            _cell([_get(x, "steps_per_client") for x in lasts], digits=1, scientific=False),
            _cell([_get(x, "samples_seen") for x in lasts], digits=0, scientific=False),
            _cell([_mb(x) for x in lasts], digits=2, scientific=False),
            _cell([_get(x, "wall_time") for x in lasts], digits=1, scientific=False),
        ]
        unfinished = sum(not r.finished for r in g.runs)
        if unfinished:
            row[0] += f" ({unfinished} unfinished)"
        rows.append(row)
    return markdown_rows(head, rows, text_columns=2 if any(tuned) else 1)


def budget_table(groups: Sequence[Group], metrics: Sequence[str], at: Budget) -> str:
    """Each metric at the last evaluation of each run within the budget ``at`` (mean ± std over
    seeds), with the round and the budget that evaluation had used; "–" where a run has no
    evaluation within it.

    Example:
        >>> from fedrisk.experiment.selection import parse_budget
        >>> budget_table([], ["test_auroc"], parse_budget("bytes=1e6")).splitlines()[0]
        '| configuration | test_auroc at bytes ≤ 1e+06 | round | bytes used |'
    """
    head = ["configuration"] + [f"{m} at {at.label}" for m in metrics] + ["round", f"{at.name} used"]
    rows = []
    for g in groups:
        cut = [within(r.records, at) for r in g.runs]
        row = [g.label] + [_cell([_get(c, m) for c in cut]) for m in metrics]
        row.append("/".join(str(c["round"]) if c else "–" for c in cut))
        row.append(_cell([at.value(c) if c else None for c in cut], digits=0 if at.integral else 2, scientific=False))
        rows.append(row)
    return markdown_rows(head, rows)


def target_table(groups: Sequence[Group], targets: Sequence[Target]) -> str:
    """Rounds and MB each configuration needed to reach each target (mean ± std over the seeds
    that reached it, and how many did).

    Example:
        >>> from fedrisk.experiment.selection import parse_target
        >>> target_table([], [parse_target("validation_auroc=0.9")]).splitlines()[0]
        '| configuration | rounds to validation_auroc ≥ 0.9 | MB to validation_auroc ≥ 0.9 | reached |'
    """
    head = ["configuration"]
    for t in targets:
        head += [f"rounds to {t.label}", f"MB to {t.label}", "reached"]
    rows = []
    for g in groups:
        row = [g.label]
        for t in targets:
            hits = [reach(r.records, t) for r in g.runs]
            row += [
                _cell([_get(h, "round") for h in hits], digits=1, scientific=False),
                _cell([_mb(h) for h in hits], digits=2, scientific=False),
                f"{sum(h is not None for h in hits)}/{len(hits)}",
            ]
        rows.append(row)
    return markdown_rows(head, rows)


def _personal_detail(metric: str) -> bool:
    """``personal_accuracy_std`` and kin (also on the clients' validation splits,
    ``validation_personal_*``): shown in the personalised table, not the main one."""
    metric = metric.removeprefix("validation_")
    return (
        metric.startswith("personal_")
        and metric.rsplit("_", 1)[-1] in (*PERSONAL_STATS, "worst")
        and not (metric.endswith("_mean") and not metric.endswith("_wmean"))
    )


def personal_table(groups: Sequence[Group], metric: str = "accuracy") -> str:
    """Per configuration: ``personal_{metric}_{wmean,mean,std,bottom10}`` (each client's model
    on its own test split) at the last evaluation and at each run's validation-selected round
    (mean ± std over seeds; "" when no run has personalised metrics).

    Example:
        >>> personal_table([])
        ''
    """
    keys = [f"personal_{metric}_{s}" for s in PERSONAL_STATS]
    if not any(keys[1] in r for g in groups for run in g.runs for r in run.records):
        return ""
    selecting = any(_selected(r) is not None for g in groups for r in g.runs)
    head = ["configuration"] + [f"last {s}" for s in PERSONAL_STATS]
    if selecting:
        head += [f"selected {s}" for s in PERSONAL_STATS] + ["selected round"]
    rows = []
    for g in groups:
        last = [run.records[-1] for run in g.runs if run.records]
        row = [g.label] + [format_mean_std([float(r[k]) for r in last if k in r]) for k in keys]
        if selecting:
            chosen = [_selected(run) for run in g.runs]
            row += [_cell([_get(c, k) for c in chosen]) for k in keys]
            row.append("/".join(str(c["round"]) if c else "–" for c in chosen))
        rows.append(row)
    return markdown_rows(head, rows)


def group_curve(group: Group, metrics: Sequence[str]) -> Curve:
    """Mean ± std over the group's runs at the rounds every run evaluated."""
    common = None
    for r in group.runs:
        rounds = {int(rec["round"]) for rec in r.records}
        common = rounds if common is None else common & rounds
    rounds = sorted(common or [])
    by_round = [{int(rec["round"]): rec for rec in r.records} for r in group.runs]
    values = {}
    for m in metrics:
        means, stds = [], []
        for t in rounds:
            vals = [float(b[t][m]) for b in by_round if m in b[t]]
            mu, sd = mean_std(vals)
            means.append(mu)
            stds.append(sd)
        if rounds and any(m in b[rounds[0]] for b in by_round):
            values[m] = (means, stds)
    mb = [mean_std([(b[t]["bytes_down"] + b[t]["bytes_up"]) / MB for b in by_round])[0] for t in rounds]
    return Curve(group.label, rounds, mb, values)


@dataclass
class Report:
    """A rendered report: the Markdown text, its groups and the plot files."""

    markdown: str
    table: str
    groups: list[Group]
    plots: list[Path]
    path: Path | None
    extra_tables: list[str] = field(default_factory=list)


def make_report(
    paths: Sequence[str | Path],
    out: str | Path | None = None,
    metrics: Sequence[str] | None = None,
    plots: bool = True,
    at: Sequence[Budget] = (),
    targets: Sequence[Target] = (),
) -> Report:
    """Read every run at or below ``paths``, group, tabulate and plot.

    ``at``: equal-budget cuts (:func:`~fedrisk.experiment.selection.parse_budget`), one table
    each; ``targets``: rounds / bytes to reach a metric value
    (:func:`~fedrisk.experiment.selection.parse_target`), one table.  Writes ``report.md`` and
    ``comparison_vs_round.png`` / ``comparison_vs_bytes.png`` into ``out`` (default: the single
    path given, or the common parent of several).  Runs under two or more attacks add the worst
    case over attacks (:mod:`fedrisk.experiment.worst_case`) to the table and
    ``worst_case_heatmap.png``.
    """
    runs = [load_run(p) for p in find_runs(paths)]
    groups = group_runs(runs)
    available = metric_names(groups)
    if metrics:
        unknown = [m for m in metrics if m not in available]
        if unknown:
            raise FedriskError(
                f"--metrics: {', '.join(map(repr, unknown))} not found in the runs; available: {', '.join(available)}"
            )
        chosen = list(metrics)
    else:
        chosen = [m for m in available if not m.startswith("train_") and not _personal_detail(m)] or available
    for t in targets:
        if t.metric not in available:
            raise FedriskError(f"--target: {t.metric!r} not found in the runs; available: {', '.join(available)}")
    table = markdown_table(groups, chosen)
    extra = [
        (
            f"At an equal budget, {b.label} (each metric at the last evaluation within it):",
            budget_table(groups, chosen, b),
        )
        for b in at
    ]
    if targets:
        extra.append(
            (
                "Rounds and MB communicated to reach a target (first evaluation at or past it):",
                target_table(groups, targets),
            )
        )
    personal = personal_table(groups)
    from fedrisk.experiment.personal_outputs import cluster_table  # clusters.csv (IFCA)

    clusters = cluster_table([(g.label, [r.path for r in g.runs]) for g in groups])
    out_dir = Path(out) if out is not None else _default_out(paths)
    plot_files: list[Path] = []
    if plots and any(r.records for r in runs):
        plot_files = plot_curves([group_curve(g, chosen) for g in groups], chosen, out_dir, "comparison")
        from fedrisk.experiment.personal_outputs import plot_personal  # clients.csv / alpha.csv

        plot_files += plot_personal([(g.label, [r.path for r in g.runs]) for g in groups], out_dir)
    from fedrisk.experiment.worst_case import worst_case_section  # runs under several attacks

    worst = worst_case_section(groups, chosen, out_dir, plots and any(r.records for r in runs))
    if worst is not None:
        table += "\n\n" + worst.table
        plot_files += [worst.plot] if worst.plot is not None else []
    lines = [
        "# fedrisk report",
        "",
        f"{len(runs)} run(s) in {len(groups)} configuration(s); mean ± sample std over seeds. "
        + _selection_note(groups),
        "",
        table,
        "",
    ]
    for title, text in extra:
        lines += [title, "", text, ""]
    if personal:
        lines += [
            "Personalised models, each client's model on its own test split (weighted mean by test size, "
            "unweighted mean, std and bottom-10% over clients), at the last evaluation and at each run's round "
            "selected on validation:",
            "",
            personal,
            "",
        ]
    shown = [f"{h}\n\n{t}" for h, t in extra]
    if clusters:
        title = "Cluster memberships (clusters.csv) at the last evaluation, against the clients' true groups:"
        lines += [title, "", clusters, ""]
        shown.append(f"{title}\n\n{clusters}")
    lines += [f"![{p.stem}]({p.name})" for p in plot_files]
    lines += ["", "Runs:", ""] + [f"- `{r.path}`" for r in runs]
    markdown = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", markdown)
    return Report(markdown, table, groups, plot_files, out_dir / "report.md", shown)


def _selection_note(groups: Sequence[Group]) -> str:
    keys = sorted({run_select_key(r) for g in groups for r in g.runs if _selected(r) is not None})
    if not keys:
        return "No run selects a round on validation (no validation split): the last evaluation is reported."
    return (
        f'"selected" = the round chosen on validation ({", ".join(keys)}; run.select_by), never on test; '
        "the best round on test would be an oracle and is not tabulated (summary.json: oracle)."
    )


def _default_out(paths: Sequence[str | Path]) -> Path:
    if len(paths) == 1:
        return Path(paths[0])
    try:
        return Path(os.path.commonpath([str(p) for p in paths]))
    except ValueError:  # a mix of absolute and relative paths
        return Path(os.path.commonpath([str(Path(p).resolve()) for p in paths]))
