"""Bar chart of the time per communication round (paper 003, Fig. 3 analogue; section 5 of
``docs/results/perm.md``): each method's median seconds per round relative to FedAvg.

The numbers are read from that section's table (the first table after the ``## 5.`` heading
whose header starts with ``| method |``), which ``benchmarks/perm_round_cost.py`` measured.
Writes ``perm_round_cost.png`` into ``--out``.

    python benchmarks/perm_round_cost_plot.py docs/results/perm.md --out docs/results/img
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from perm_fmnist_scaled_plot import markdown_table, save_figure


def read_costs(doc: Path, heading: str = "## 5.") -> list[tuple[str, float]]:
    """(method, time relative to FedAvg) per row of the section's ``| method |`` table."""
    return [(cells["method"], float(list(cells.values())[-1])) for cells in markdown_table(doc, heading)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("doc", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/results/img"))
    args = parser.parse_args()
    rows = read_costs(args.doc)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.2))
    ys = list(range(len(rows)))[::-1]
    colors = ["tab:red" if m.startswith("PERM") else "tab:blue" for m, _ in rows]
    ax.barh(ys, [r for _, r in rows], color=colors, alpha=0.8)
    for y, (_, r) in zip(ys, rows, strict=True):
        ax.text(r + 0.05, y, f"{r:.2f}", va="center", fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yticks(ys, [m for m, _ in rows], fontsize=8)
    ax.set_xlabel("median seconds per communication round / FedAvg's")
    ax.set_title("Time per round vs FedAvg (synthetic, 20 clients, K = 20)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, args.out, "perm_round_cost.png")


if __name__ == "__main__":
    main()
