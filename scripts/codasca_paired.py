"""Paired CODA+ vs CODASCA comparison over seeds: mean ± std of the final test AUROC differences.

    python scripts/codasca_paired.py runs/codasca_seeds [--plot docs/results/img/codasca_paired.png]
    python scripts/codasca_paired.py mlp=runs/codasca_seeds cnn=runs/codasca_cnn \\
        --recorded docs/results/codasca_final_auroc.csv --plot docs/results/img/codasca_paired.png

Reads ``<folder>/s<seed>/<setup>_<codaplus|codasca>_I<window>/metrics.jsonl`` and pairs the two
methods run with the same set-up, window and seed (same data split, same initial model).  A folder
given as ``NAME=FOLDER`` names its set-ups ``NAME <setup>`` (e.g. ``mlp`` and ``cnn`` runs side by
side).  ``--recorded CSV`` adds final AUROCs recorded earlier (columns ``model, setup, window, seed,
algorithm, final_test_auroc``; ``model`` plays the role of ``NAME``) for runs that are not on disk;
a finished run on disk replaces its recorded value.  Prints a Markdown table per (set-up, window):
the seeds, each method's mean ± sample std, the difference CODASCA − CODA+ as mean ± sample std,
how many seeds have it > 0, and the paired t-test's two-sided p-value (scipy.stats.ttest_rel).
With ``--plot``, also plots the per-seed differences, one column per (set-up, window).

``--windows SETUP`` (e.g. ``"cnn base"``) prints instead one row per window of that set-up: each
method's mean ± std over seeds and its mean change from the same seed's I = 1 run (CODASCA with
I = 1 and η_g = 1 is CODA+ exactly, so the I = 1 run of either method is the baseline of both);
``--windows-plot PNG`` draws final AUROC against I for both methods.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<setup>.+)_(?P<alg>codaplus|codasca)_I(?P<window>\d+)$")
ALGORITHMS = ("codaplus", "codasca")
Runs = dict[tuple[str, int], dict[int, dict[str, float]]]


def final_auroc(run: Path) -> float | None:
    if not (run / "summary.json").is_file():
        return None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return float(rows[-1]["test_auroc"])


def _prefixed(prefix: str, setup: str) -> str:
    return f"{prefix} {setup}" if prefix else setup


def collect(folder: Path, prefix: str = "", into: Runs | None = None) -> Runs:
    """``{(setup, window): {seed: {alg: final AUROC}}}`` for the runs under ``folder/s<seed>/``."""
    out: Runs = defaultdict(lambda: defaultdict(dict)) if into is None else into
    for seed_dir in sorted(folder.glob("s[0-9]*")):
        seed = int(seed_dir.name[1:])
        for run in sorted(seed_dir.iterdir()):
            m = NAME.match(run.name)
            value = final_auroc(run) if m else None
            if value is not None:
                out[(_prefixed(prefix, m["setup"]), int(m["window"]))][seed][m["alg"]] = value
    return out


def recorded(path: Path, into: Runs | None = None) -> Runs:
    """The final AUROCs of a ``--recorded`` CSV, in :func:`collect`'s layout."""
    out: Runs = defaultdict(lambda: defaultdict(dict)) if into is None else into
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["algorithm"] not in ALGORITHMS:
                raise SystemExit(f"{path}: algorithm {row['algorithm']!r} is not one of {ALGORITHMS}")
            key = (_prefixed(row["model"], row["setup"]), int(row["window"]))
            out[key][int(row["seed"])][row["algorithm"]] = float(row["final_test_auroc"])
    return out


def gather(folders: list[str], recorded_csv: str | None = None) -> Runs:
    """Recorded values first, then every folder's finished runs over them."""
    data: Runs = defaultdict(lambda: defaultdict(dict))
    if recorded_csv:
        recorded(Path(recorded_csv), data)
    for spec in folders:
        prefix, _, folder = spec.rpartition("=")
        collect(Path(folder), prefix, data)
    return data


def mean_std(xs: list[float], sign: str = "") -> str:
    mean = format(statistics.mean(xs), f"{sign}.4f")
    return f"{mean} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else mean


def table(data: Runs) -> dict[str, list[float]]:
    """Print the Markdown table; return the per-seed differences by column label."""
    from scipy.stats import ttest_rel

    print("| set-up | I | seeds | CODA+ | CODASCA | CODASCA − CODA+ | > 0 | paired t-test p |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    diffs: dict[str, list[float]] = {}
    for (setup, window), by_seed in sorted(data.items()):
        seeds = sorted(s for s, v in by_seed.items() if len(v) == 2)
        if not seeds:
            continue
        a = [by_seed[s]["codaplus"] for s in seeds]
        b = [by_seed[s]["codasca"] for s in seeds]
        d = [y - x for x, y in zip(a, b)]
        diffs[f"{setup} I={window}"] = d
        p = f"{ttest_rel(b, a).pvalue:.3g}" if len(seeds) > 1 else "–"
        print(f"| {setup} | {window} | {','.join(map(str, seeds))} | {mean_std(a)} | {mean_std(b)} | "
              f"{mean_std(d, '+')} | "
              f"{sum(x > 0 for x in d)}/{len(d)} | {p} |")  # fmt: skip
    return diffs


def baseline(by_seed: dict[int, dict[str, float]]) -> dict[int, float]:
    """The I = 1 final AUROC per seed (either method's run: the two are the same algorithm)."""
    return {s: v.get("codaplus", v.get("codasca")) for s, v in by_seed.items() if v}


def window_table(data: Runs, setup: str) -> dict[str, dict[int, list[float]]]:
    """Print one row per window of ``setup``; return ``{alg: {window: [final AUROC per seed]}}``."""
    windows = sorted(w for (name, w) in data if name == setup)
    if 1 not in windows:
        raise SystemExit(f"no I = 1 run of set-up {setup!r}: the window table compares with it")
    base = baseline(data[(setup, 1)])
    print(f"{setup}; the I = 1 baseline has seeds {','.join(map(str, sorted(base)))}\n")
    print("| I | seeds | CODA+ | CODASCA | CODA+ − I=1 | CODASCA − I=1 |")
    print("|---:|---|---:|---:|---:|---:|")
    values: dict[str, dict[int, list[float]]] = {alg: {} for alg in ALGORITHMS}
    for w in windows:
        by_seed = data[(setup, w)]
        cells, changes = [], []
        for alg in ALGORITHMS:
            seeds = sorted(base if w == 1 else (s for s, v in by_seed.items() if alg in v))
            xs = [by_seed[s].get(alg, base.get(s)) for s in seeds]  # at I = 1: either method's run
            values[alg][w] = xs
            cells.append(mean_std(xs) if xs else "–")
            d = [x - base[s] for s, x in zip(seeds, xs) if s in base]
            changes.append(mean_std(d, "+") if d and w != 1 else "–")
        seeds = sorted(by_seed)
        print(f"| {w} | {','.join(map(str, seeds))} | {cells[0]} | {cells[1]} | {changes[0]} | {changes[1]} |")
    return values


def _pyplot():  # matplotlib is imported only where a plot is asked for
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def window_plot(values: dict[str, dict[int, list[float]]], setup: str, out: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, (alg, label) in enumerate(zip(ALGORITHMS, ("CODA+", "CODASCA"))):
        ws = [w for w, xs in values[alg].items() if xs]
        shift = 0.93 if i == 0 else 1.07  # the two methods side by side
        for w in ws:
            ax.plot([w * shift] * len(values[alg][w]), values[alg][w], ".", color=f"C{i}", alpha=0.5)
        means = [statistics.mean(values[alg][w]) for w in ws]
        ax.plot([w * shift for w in ws], means, "o-", color=f"C{i}", label=f"{label} (mean)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window I (local iterations per round, same total T)")
    ax.set_ylabel("final test AUROC")
    ax.set_title(f"{setup}: final AUROC against the window (dots: seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot(diffs: dict[str, list[float]], out: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 + 0.9 * len(diffs)), 4.0))
    groups = list(dict.fromkeys(k.split(" ")[0] if " " in k.split(" I=")[0] else "" for k in diffs))
    for i, (label, d) in enumerate(diffs.items()):
        group = label.split(" ")[0] if " " in label.split(" I=")[0] else ""
        ax.plot([i] * len(d), d, "o", color=f"C{groups.index(group)}", alpha=0.7)
        if len(d) > 1:
            ax.errorbar(i + 0.15, statistics.mean(d), yerr=statistics.stdev(d), fmt="s", color="C3", capsize=4)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(diffs)), [f"{k}\n({len(d)} seed{'s' * (len(d) > 1)})" for k, d in diffs.items()],
                  rotation=35, ha="right", fontsize=7)  # fmt: skip
    ax.set_ylabel("final test AUROC: CODASCA − CODA+")
    ax.set_title("paired differences per seed (dots), mean ± sample std over seeds (squares)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(folder: str, plot_path: str | None = None, *more: str, recorded_csv: str | None = None) -> None:
    """Table (and plot) for ``folder`` and ``more`` folders, each ``FOLDER`` or ``NAME=FOLDER``."""
    diffs = table(gather([folder, *more], recorded_csv))
    if plot_path and diffs:
        plot(diffs, plot_path)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", help="FOLDER or NAME=FOLDER holding s<seed>/<setup>_<alg>_I<window>")
    parser.add_argument("--recorded", help="CSV of final AUROCs recorded earlier, for runs not on disk")
    parser.add_argument("--plot", help="PNG of the per-seed differences")
    parser.add_argument("--windows", metavar="SETUP", help="one row per window of SETUP, against I = 1")
    parser.add_argument("--windows-plot", metavar="PNG", help="with --windows: final AUROC against I")
    args = parser.parse_args(argv)
    if args.windows:
        values = window_table(gather(args.folders, args.recorded), args.windows)
        if args.windows_plot:
            window_plot(values, args.windows, args.windows_plot)
        return
    if len(args.folders) == 2 and args.folders[1].endswith(".png") and not args.plot:  # the old form: FOLDER PNG
        args.folders, args.plot = args.folders[:1], args.folders[1]
    main(args.folders[0], args.plot, *args.folders[1:], recorded_csv=args.recorded)


if __name__ == "__main__":
    cli()
