"""PNG plots of runs (matplotlib, Agg backend): metrics vs round and vs bytes communicated.

One figure per x-axis with one panel per metric and one curve per configuration (the mean
over seeds, shaded +- one standard deviation).  Bytes are the totals sent down and up so far,
in megabytes (10^6 bytes).

Example:
    >>> import tempfile
    >>> c = Curve("fedavg", [1, 2], [0.1, 0.2], {"test_accuracy": ([0.5, 0.6], [0.0, 0.1])})
    >>> [p.name for p in plot_curves([c], ["test_accuracy"], tempfile.mkdtemp(), "metrics")]
    ['metrics_vs_round.png', 'metrics_vs_bytes.png']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedrisk.experiment.outputs import RunData

MB = 1e6


@dataclass
class Curve:
    """One configuration's curves: x positions and, per metric, the mean and std over seeds."""

    label: str
    rounds: list[int]
    megabytes: list[float]
    values: dict[str, tuple[list[float], list[float]]]


def run_curve(run: RunData, label: str = "") -> Curve:
    """The curves of a single run (std 0)."""
    recs = run.records
    values = {m: ([float(r.get(m, math.nan)) for r in recs], [0.0] * len(recs)) for m in run.metric_names}
    mb = [(r.get("bytes_down", 0) + r.get("bytes_up", 0)) / MB for r in recs]
    return Curve(label or run.path.name, [int(r["round"]) for r in recs], mb, values)


def plot_curves(curves: Sequence[Curve], metrics: Sequence[str], out_dir: str | Path, prefix: str) -> list[Path]:
    """Write ``<prefix>_vs_round.png`` and ``<prefix>_vs_bytes.png`` into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = [m for m in metrics if any(m in c.values for c in curves)]
    paths = []
    if not metrics:
        return paths
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    for axis, xlabel in (("round", "round"), ("bytes", "MB communicated (down + up)")):
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.6 * nrows), squeeze=False)
        for ax, metric in zip(axes.flat, metrics):
            for c in curves:
                if metric not in c.values:
                    continue
                x = c.rounds if axis == "round" else c.megabytes
                mean, std = c.values[metric]
                (line,) = ax.plot(x, mean, label=c.label, marker="." if len(x) <= 30 else None)
                if any(s > 0 for s in std):
                    lo = [m - s for m, s in zip(mean, std)]
                    hi = [m + s for m, s in zip(mean, std)]
                    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_title(metric)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(metrics) :]:
            ax.set_visible(False)
        if len(curves) > 1 or curves[0].label:
            axes.flat[0].legend(fontsize="small")
        fig.tight_layout()
        path = out / f"{prefix}_vs_{axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_run(run: RunData, out_dir: str | Path) -> list[Path]:
    """``metrics_vs_round.png`` and ``metrics_vs_bytes.png`` of one run."""
    label = str(run.config.get("algorithm", {}).get("name", ""))
    return plot_curves([run_curve(run, label)], run.metric_names, out_dir, "metrics")
