"""Bar chart of the scaled Fashion-MNIST comparison (paper 003, Fig. 2 setting; section 3.3 of
``docs/results/perm.md``): personal accuracy and bottom-10% client accuracy at the last round,
mean ± sample std over seeds, one bar per method.

The numbers are read from the results table of that section (the first table after the
``### 3.3`` heading whose header starts with ``| method |``), because the run folders of the
earlier passes were not kept; the table is the record.  Writes ``perm_fmnist_scaled.png`` into
``--out``.

    python benchmarks/perm_fmnist_scaled_plot.py docs/results/perm.md --out docs/results/img
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_NUM = re.compile(r"([0-9.]+)(?:\s*±\s*([0-9.]+))?")


def save_figure(fig: plt.Figure, out: Path, name: str) -> None:
    """Write ``fig`` as ``out/name`` (creating ``out``) and say so."""
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / name, dpi=110)
    print(f"wrote {out / name}")


def parse_cell(cell: str) -> tuple[float, float]:
    """``'0.8808 ± 0.0031'`` or ``'**0.9737**'`` -> (mean, std); std 0 for a single value.

    >>> parse_cell("0.8808 ± 0.0031"), parse_cell("**0.9737**")
    ((0.8808, 0.0031), (0.9737, 0.0))
    """
    m = _NUM.search(cell.replace("*", ""))
    if m is None:
        raise ValueError(f"no number in table cell {cell!r}")
    return float(m.group(1)), float(m.group(2) or 0.0)


def markdown_table(doc: Path, heading: str) -> list[dict[str, str]]:
    """Rows (column name -> cell) of the first ``| method |`` table after the line starting with ``heading``."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    head = next(i for i in range(start, len(lines)) if lines[i].startswith("| method |"))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = []
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(cols, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def read_table(doc: Path, heading: str = "### 3.3") -> list[dict[str, object]]:
    """Rows of the first ``| method |`` table after ``heading``."""
    rows = []
    for cells in markdown_table(doc, heading):
        rows.append(
            {
                "method": cells["method"].replace("†", "").strip(),
                "seeds": cells["seeds"].replace("†", "").replace(" ,", ","),
                "accuracy": parse_cell(cells["personal accuracy (mean)"]),
                "bottom10": parse_cell(cells["bottom-10%"]),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("doc", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/results/img"))
    args = parser.parse_args()
    rows = read_table(args.doc)
    labels = [f"{r['method']} ({r['seeds']})" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5), sharey=True)
    ys = list(range(len(rows)))[::-1]
    for ax, key, title in zip(
        axes, ("accuracy", "bottom10"), ("personal accuracy (mean over clients)", "bottom-10% clients")
    ):
        means = [r[key][0] for r in rows]
        stds = [r[key][1] for r in rows]
        colors = ["tab:red" if str(r["method"]).startswith("PERM") else "tab:blue" for r in rows]
        ax.barh(ys, means, xerr=stds, color=colors, alpha=0.8, capsize=3)
        for y, m, sd in zip(ys, means, stds, strict=True):
            ax.text(m + sd + 0.01, y, f"{m:.3f}", va="center", fontsize=8)
        ax.set_xlim(0.3 if key == "accuracy" else 0.0, 1.05)
        ax.set_title(f"{title}, round 102")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys, labels, fontsize=8)
    fig.suptitle("Fashion-MNIST, 2 classes per client, 50 clients (scaled: 102 rounds, K = 5); mean ± std over seeds")
    fig.tight_layout()
    save_figure(fig, args.out, "perm_fmnist_scaled.png")


if __name__ == "__main__":
    main()
