"""Test AUROC against local iterations for CODA+ / CODASCA runs named ``<setup>_<algorithm>_I<window>``.

    python scripts/plot_codasca_windows.py runs/codasca_window docs/results/img/codasca_window_claim.png
    python scripts/plot_codasca_windows.py runs/codasca_cnn/s0 out.png imratio30 k16   # only these set-ups

One panel per set-up (every set-up in the folder, or only those named after the output file);
CODA+ dashed, CODASCA solid, one colour per window; prints the final AUROC of every run as a
Markdown table.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

NAME = re.compile(r"^(?P<setup>.+)_(?P<alg>codaplus|codasca)_I(?P<window>\d+)$")
LABEL = {"codaplus": "CODA+", "codasca": "CODASCA"}


def main(folder: str, out: str, *only: str) -> None:
    runs: dict[str, dict[tuple[str, int], list[dict]]] = defaultdict(dict)
    for run in sorted(Path(folder).iterdir()):
        m = NAME.match(run.name)
        if not m or not (run / "summary.json").is_file() or (only and m["setup"] not in only):
            continue
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        runs[m["setup"]][(m["alg"], int(m["window"]))] = rows
    setups = sorted(runs)
    if not setups:
        raise SystemExit(f"no runs named <setup>_<codaplus|codasca>_I<window> with a summary.json in {folder}")
    cols = min(3, len(setups))
    rows = -(-len(setups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(setups) :]:
        ax.set_visible(False)
    print("| set-up | I | CODA+ | CODASCA |\n|---|---:|---:|---:|")
    for ax, setup in zip(axes.flat, setups):
        windows = sorted({w for _, w in runs[setup]})
        colours = {w: f"C{i}" for i, w in enumerate(windows)}
        for (alg, w), rows in sorted(runs[setup].items()):
            x = [r["round"] * w for r in rows]
            y = [r["test_auroc"] for r in rows]
            ax.plot(x, y, "--" if alg == "codaplus" else "-", color=colours[w], marker="o", ms=3,
                    label=f"{LABEL[alg]} I={w}")  # fmt: skip
        for w in windows:
            final = {a: runs[setup][(a, w)][-1]["test_auroc"] for a in LABEL if (a, w) in runs[setup]}
            cells = [f"{final[a]:.4f}" if a in final else "-" for a in LABEL]
            print(f"| {setup} | {w} | {cells[0]} | {cells[1]} |")
        ax.set_title(setup)
        ax.set_xlabel("local iterations")
        ax.set_ylabel("test AUROC")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:])
