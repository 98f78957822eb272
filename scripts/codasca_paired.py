"""Paired CODA+ vs CODASCA comparison over seeds: mean ± std of the final test AUROC differences.

    python scripts/codasca_paired.py runs/codasca_seeds [docs/results/img/codasca_paired.png]

Reads ``<folder>/s<seed>/<setup>_<codaplus|codasca>_I<window>/metrics.jsonl`` and pairs the two
methods run with the same set-up, window and seed (same data split, same initial model).  Prints a
Markdown table per (set-up, window): the seeds, each method's mean ± sample std, the difference
CODASCA − CODA+ as mean ± sample std, how many seeds have it > 0, and the paired t-test's
two-sided p-value (scipy.stats.ttest_rel).  With a second argument, also plots the per-seed
differences.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<setup>.+)_(?P<alg>codaplus|codasca)_I(?P<window>\d+)$")


def final_auroc(run: Path) -> float | None:
    if not (run / "summary.json").is_file():
        return None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return float(rows[-1]["test_auroc"])


def collect(folder: Path) -> dict[tuple[str, int], dict[int, dict[str, float]]]:
    """``{(setup, window): {seed: {alg: final AUROC}}}`` for the runs under ``folder/s<seed>/``."""
    out: dict[tuple[str, int], dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for seed_dir in sorted(folder.glob("s[0-9]*")):
        seed = int(seed_dir.name[1:])
        for run in sorted(seed_dir.iterdir()):
            m = NAME.match(run.name)
            value = final_auroc(run) if m else None
            if value is not None:
                out[(m["setup"], int(m["window"]))][seed][m["alg"]] = value
    return out


def mean_std(xs: list[float], sign: str = "") -> str:
    mean = format(statistics.mean(xs), f"{sign}.4f")
    return f"{mean} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else mean


def main(folder: str, plot: str | None = None) -> None:
    from scipy.stats import ttest_rel

    data = collect(Path(folder))
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
    if plot and diffs:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(5.0, 1.4 + 1.3 * len(diffs)), 3.6))
        for i, d in enumerate(diffs.values()):
            ax.plot([i] * len(d), d, "o", color="C0", alpha=0.7)
            ax.errorbar(i + 0.15, statistics.mean(d), yerr=statistics.stdev(d) if len(d) > 1 else 0,
                        fmt="s", color="C3", capsize=4)  # fmt: skip
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(diffs)), list(diffs), rotation=20, fontsize=8)
        ax.set_ylabel("final test AUROC: CODASCA − CODA+")
        ax.set_title("paired differences per seed (dots), mean ± std (squares)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        fig.tight_layout()
        fig.savefig(plot, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
