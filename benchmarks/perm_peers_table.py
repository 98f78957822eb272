"""The table and per-client plot of a personalised comparison at each run's validation-selected
round (docs/results/perm.md, section 7).

For every finished run ``SWEEP/<method>/seed=<s>/`` it reads ``summary.json`` (the round chosen
on ``run.select_by`` and the personal metrics there) and ``clients.csv`` (every client's own
test-split accuracy at that round), and prints one Markdown row per method: the step size, the
selected rounds, personal accuracy mean, bottom-10 % and worst client, personal log-loss (mean ±
sample std over seeds), MB communicated and wall time per run.  ``--plot`` writes the ECDF of
the per-client accuracies (seeds pooled) at the selected rounds, one curve per method.

    python benchmarks/perm_peers_table.py runs/perm_fmnist_peers --plot docs/results/img/perm_fmnist_peers_ecdf.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import tomllib

from fedrisk.experiment.outputs import markdown_rows
from fedrisk.experiment.personal_outputs import read_clients

KEYS = ("personal_accuracy_mean", "personal_accuracy_bottom10", "personal_accuracy_worst", "personal_log_loss_mean")


def cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def collect(sweep: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for summary in sorted(sweep.glob("*/seed=*/summary.json")):
        s = json.loads(summary.read_text())
        if s.get("status") != "finished" or not s.get("selected"):
            continue
        sel = s["selected"]
        rows = read_clients(summary.parent / "clients.csv")
        accs = [r["accuracy"] for r in rows if r["round"] == sel["round"] and r.get("split", "test") == "test"]
        out.setdefault(summary.parent.parent.name, []).append(
            {
                "seed": s["seed"],
                "lr": tomllib.loads((summary.parent / "config.toml").read_text())["algorithm"]["lr"],
                "round": sel["round"],
                "metrics": sel["metrics"],
                "mb": (s["bytes_down"] + s["bytes_up"]) / 1e6,
                "wall": s["wall_time"],
                "clients": accs,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    runs = collect(args.sweep)
    order = sorted(runs, key=lambda m: -statistics.mean(r["metrics"]["personal_accuracy_mean"] for r in runs[m]))
    head = [
        "method",
        "step",
        "seeds",
        "selected round",
        "personal accuracy (mean)",
        "bottom-10 %",
        "worst client",
        "personal log-loss",
        "MB / run",
        "wall s / run",
    ]
    rows = []
    for m in order:
        rs = sorted(runs[m], key=lambda r: r["seed"])
        rows.append(
            [
                m,
                "/".join(f"{x:g}" for x in sorted({r["lr"] for r in rs})),
                ",".join(str(r["seed"]) for r in rs),
                "/".join(str(r["round"]) for r in rs),
                *(cell([r["metrics"][k] for r in rs]) for k in KEYS),
                f"{statistics.mean(r['mb'] for r in rs):.1f}",
                f"{statistics.mean(r['wall'] for r in rs):.0f}",
            ]
        )
    print(markdown_rows(head, rows))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for m in order:
            xs = sorted(a for r in runs[m] for a in r["clients"])
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=m)
        ax.set_xlabel("client's accuracy on its own test split (selected round)")
        ax.set_ylabel("share of clients (seeds pooled)")
        ax.set_title("per-client accuracy, ECDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
