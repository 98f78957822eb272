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


def plot(diffs: dict[str, list[float]], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    args = parser.parse_args(argv)
    if len(args.folders) == 2 and args.folders[1].endswith(".png") and not args.plot:  # the old form: FOLDER PNG
        args.folders, args.plot = args.folders[:1], args.folders[1]
    main(args.folders[0], args.plot, *args.folders[1:], recorded_csv=args.recorded)


if __name__ == "__main__":
    cli()
