"""Tables and figures of a Byzantine sweep (``configs/byzantine/*.toml``) for ``docs/results``.

    .venv/bin/python scripts/byzantine_figures.py runs/byzantine_digits --name byzantine_digits --target 0.7

Reads ``<sweep>/<method>,attack.name=<attack>/seed=<s>/metrics.jsonl`` and prints Markdown:
final / peak / worst-over-attacks test accuracy (mean +- std over seeds) and the communication
rounds each method needs to first reach each ``--target`` accuracy; writes accuracy-vs-round and
log-loss-vs-round figures (mean over seeds, min-max band) to ``docs/results/img/<name>_*.png``.

RSA variants named ``rsa_<lambda_R>`` (a lambda_R grid) get their own table; "RSA (tuned)" is,
per attack, the lambda_R with the best mean final accuracy.  When the runs recorded
``accuracy_on:<classes>`` (the classes the reliable workers hold, spec P13) its final value is
tabulated as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METHODS = ["frpg", "lfrpg", "sgd", "krum", "geomed", "rsa"]
ATTACKS = ["gaussian", "label_flip", "alie", "ipm"]
LABELS = {
    "frpg": "FRPG",
    "lfrpg": "LFRPG (T=10)",
    "sgd": "SGD (mean)",
    "krum": "Krum",
    "geomed": "GeoMed",
    "rsa": "RSA",
}


def load(sweep: Path) -> dict[tuple[str, str], list[list[dict]]]:
    runs: dict[tuple[str, str], list[list[dict]]] = {}
    for folder in sorted(sweep.iterdir()):
        if not folder.is_dir() or ",attack.name=" not in folder.name:
            continue
        method, attack = folder.name.split(",attack.name=")
        for seed in sorted(folder.glob("seed=*")):
            path = seed / "metrics.jsonl"
            if path.exists():
                records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                runs.setdefault((method, attack), []).append(records)
    return runs


def tune_rsa(runs: dict[tuple[str, str], list[list[dict]]]) -> None:
    """Print the lambda_R grid of RSA (``rsa_<lambda>`` variants) and add "rsa" = the best per attack."""
    grid = sorted({m for m, _ in runs if m.startswith("rsa_")}, key=lambda m: float(m[4:]))
    if not grid:
        return
    attacks = [a for a in ATTACKS if any((m, a) in runs for m in grid)]
    print("### RSA: final test accuracy (%) for each lambda_R, mean ± std over seeds\n")
    print("| lambda_R | " + " | ".join(attacks) + " |")
    print("|---:|" + "---:|" * len(attacks))
    for m in grid:
        print(
            f"| {m[4:]} | "
            + " | ".join(fmt([r[-1]["test_accuracy"] for r in runs.get((m, a), [])]) for a in attacks)
            + " |"
        )
    best = []
    for a in attacks:
        scored = [(statistics.mean(r[-1]["test_accuracy"] for r in runs[(m, a)]), m) for m in grid if (m, a) in runs]
        _, m = max(scored)
        runs[("rsa", a)] = runs[(m, a)]
        best.append(f"{a}: {m[4:]}")
    LABELS["rsa"] = "RSA (tuned)" if len(grid) > 1 else f"RSA (lambda_R = {grid[0][4:]})"
    print("\nRSA (tuned) below uses, per attack, lambda_R = " + ", ".join(best) + ".\n")


def fmt(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "–"
    m = statistics.mean(values) * scale
    if len(values) == 1:
        return f"{m:.1f}"
    return f"{m:.1f} ± {statistics.stdev(values) * scale:.1f}"


def first_round(records: list[dict], target: float) -> int | None:
    return next((r["round"] for r in records if r.get("test_accuracy", 0.0) >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--name", default="byzantine_digits")
    ap.add_argument("--target", type=float, nargs="+", default=[0.7])
    ap.add_argument("--img", type=Path, default=Path("docs/results/img"))
    args = ap.parse_args()
    runs = load(args.sweep)
    tune_rsa(runs)
    methods = [m for m in METHODS if any((m, a) in runs for a in ATTACKS)]
    attacks = [a for a in ATTACKS if any((m, a) in runs for m in METHODS)]

    print("### Final test accuracy (%), mean ± std over seeds (last evaluated round)\n")
    print("| method | " + " | ".join(attacks) + " | worst over attacks |")
    print("|---|" + "---:|" * (len(attacks) + 1))
    for m in methods:
        cells, means = [], []
        for a in attacks:
            finals = [recs[-1]["test_accuracy"] for recs in runs.get((m, a), [])]
            cells.append(fmt(finals) + (f" (r{runs[(m, a)][0][-1]['round']})" if finals else ""))
            if finals:
                means.append(statistics.mean(finals))
        worst = f"{100 * min(means):.1f}" if means else "–"
        print(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + f" | {worst} |")

    print("\n### Peak test accuracy (%) over the run, mean ± std over seeds\n")
    print("*Selected on test (an oracle):* each run's best test evaluation, an upper bound, not a result.\n")
    print("| method | " + " | ".join(attacks) + " |")
    print("|---|" + "---:|" * len(attacks))
    for m in methods:
        cells = [fmt([max(r["test_accuracy"] for r in recs) for recs in runs.get((m, a), [])]) for a in attacks]
        print(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")

    subset = next((k for recs in runs.values() for k in recs[0][-1] if k.startswith("test_accuracy_on:")), None)
    if subset:
        classes = subset.split(":", 1)[1]
        print(f"\n### Final test accuracy (%) on the classes {classes} only, mean ± std over seeds\n")
        print("| method | " + " | ".join(attacks) + " | worst over attacks |")
        print("|---|" + "---:|" * (len(attacks) + 1))
        for m in methods:
            cells, means = [], []
            for a in attacks:
                finals = [recs[-1][subset] for recs in runs.get((m, a), []) if subset in recs[-1]]
                cells.append(fmt(finals))
                if finals:
                    means.append(statistics.mean(finals))
            worst = f"{100 * min(means):.1f}" if means else "–"
            print(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + f" | {worst} |")

    for tgt in args.target:
        target = f"{100 * tgt:.0f}%"
        print(f"\n### Communication rounds to first reach {target} test accuracy (per seed; – = not reached)\n")
        print("| method | " + " | ".join(attacks) + " |")
        print("|---|" + "---|" * len(attacks))
        for m in methods:
            cells = []
            for a in attacks:
                hits = [first_round(recs, tgt) for recs in runs.get((m, a), [])]
                cells.append(", ".join("–" if h is None else str(h) for h in hits) or "–")
            print(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.img.mkdir(parents=True, exist_ok=True)
    panels = (("test_accuracy", "test accuracy", "accuracy"), ("test_log_loss", "test log-loss", "loss"))
    for metric, ylabel, fname in panels:
        fig, axes = plt.subplots(1, len(attacks), figsize=(4.2 * len(attacks), 3.6), sharey=True)
        axes = axes if len(attacks) > 1 else [axes]
        for ax, a in zip(axes, attacks):
            for m in methods:
                seeds = runs.get((m, a), [])
                if not seeds:
                    continue
                length = min(len(s) for s in seeds)
                xs = [seeds[0][i]["round"] for i in range(length)]
                vals = [[s[i].get(metric, float("nan")) for s in seeds] for i in range(length)]
                mean = [statistics.mean(v) for v in vals]
                ax.plot(xs, mean, label=LABELS.get(m, m))
                ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], alpha=0.2)
            ax.set_title(f"attack: {a}")
            ax.set_xlabel("communication rounds")
            if metric == "test_log_loss":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[-1].legend(fontsize=8)
        fig.tight_layout()
        out = args.img / f"{args.name}_{fname}.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"\n![{ylabel}](img/{out.name})")


if __name__ == "__main__":
    main()
