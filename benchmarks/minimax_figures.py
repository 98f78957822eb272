"""Figures and tables of the minimax reproductions (docs/results/minimax_*.md) from sweep folders.

    python benchmarks/minimax_figures.py wgan runs/minimax_wgan_small docs/results/img/minimax_wgan.png
    python benchmarks/minimax_figures.py wgan_tune runs/minimax_wgan_tune docs/results/img/minimax_wgan_tune.png
    python benchmarks/minimax_figures.py fair runs/minimax_fmnist_fair_small docs/results/img/minimax_fmnist_fair.png
    python benchmarks/minimax_figures.py fair_groups runs/minimax_adult_fair docs/results/img/minimax_adult_fair.png
    python benchmarks/minimax_figures.py ncsc runs/minimax_ncsc_fig4_small docs/results/img/minimax_ncsc_fig4.png
    python benchmarks/minimax_figures.py kappa runs/minimax_ncsc_kappa docs/results/img/minimax_ncsc_kappa.png
    python benchmarks/minimax_figures.py kappa runs/minimax_ncsc_kappa_tuned docs/results/img/minimax_kappa_tuned.png
    python benchmarks/minimax_figures.py fair_groups runs/minimax_groups_toy docs/results/img/minimax_groups_toy.png
    python benchmarks/minimax_figures.py fig4 runs/minimax_fmnist_fair_fig4 docs/results/img/minimax_fair_fig4.png

``wgan``: for every λ and algorithm, the (local lr, global lr) with the lowest mean final
``generator_error`` over seeds is kept (the paper's "best tuned"); curves are the mean ± sample std over
seeds against iterations (SAGDA's two rounds per iteration halved).  ``fair``: mean ± std of
``test_accuracy`` and ``test_worst_class_accuracy`` against rounds for every configuration.
``fig4``: the Figure 4 analogue, one curve per (algorithm, K) and the rounds to reach each
target worst-class accuracy (per seed: the first evaluated round at which it is reached; mean ± std
over the seeds that reach it within the run).  Prints a Markdown table.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from fedrisk.experiment.outputs import find_runs, load_run


def groups(root: Path) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for path in find_runs([root]):
        run = load_run(path)
        if run.records:
            out[path.parent.name].append(run)
    return out


def series(runs: list, key: str, halve: bool = False) -> tuple[list[float], list[float], list[float]]:
    common = sorted(set.intersection(*({r["round"] for r in run.records if key in r} for run in runs)))
    vals = [[next(r[key] for r in run.records if r["round"] == t) for run in runs] for t in common]
    mean = [sum(v) / len(v) for v in vals]
    std = [math.sqrt(sum((x - m) ** 2 for x in v) / max(len(v) - 1, 1)) for v, m in zip(vals, mean)]
    xs = [t / 2 if halve else t for t in common]
    return xs, mean, std


def fmt(values: list[float], spec: str = ".2e", spec_std: str = ".1e") -> str:
    m = sum(values) / len(values)
    if len(values) == 1:
        return f"{m:{spec}}"
    s = math.sqrt(sum((x - m) ** 2 for x in values) / max(len(values) - 1, 1))
    return f"{m:{spec}} ± {s:{spec_std}}"


def wgan_setting(runs: list) -> tuple[str, float, float, float]:
    """(algorithm, λ, local lr, global lr) of a group of WGAN runs, read from the run's config."""
    alg = runs[0].config["algorithm"]
    return alg["name"], float(alg["wgan_lambda"]), float(alg["lr"]), float(alg.get("global_lr", 1.0))


def wgan(root: Path, png: Path) -> None:
    best: dict[tuple[float, str], tuple[float, str, list]] = {}
    for runs in groups(root).values():
        if runs[0].config["algorithm"].get("game") != "wgan":
            continue
        alg, lam, lr, glr = wgan_setting(runs)
        final = [run.records[-1]["generator_error"] for run in runs]
        score = sum(final) / len(final)
        diverged = any(run.summary.get("status") != "finished" for run in runs)  # stopped on NaN/inf
        score = math.inf if diverged or not math.isfinite(score) else score
        if (lam, alg) not in best or score < best[(lam, alg)][0]:
            best[(lam, alg)] = (score, f"lr {lr:g}, η_g {glr:g}", runs)
    lams = sorted({k[0] for k in best})
    fig, axes = plt.subplots(1, len(lams), figsize=(5 * len(lams), 3.8), squeeze=False)
    print("| λ | algorithm | best (local lr, global lr) | seeds | error @100 | error @250 | error @500 | final error |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for ax, lam in zip(axes[0], lams):
        for alg in ("fessgda", "fed_norm_sgda", "sagda"):
            if (lam, alg) not in best:
                continue
            _, hyper, runs = best[(lam, alg)]
            halve = alg == "sagda"
            xs, mean, std = series(runs, "generator_error", halve)
            ax.plot(xs, mean, label=alg)
            # mean ± sample std over seeds; the lower edge clipped to the axis where mean − std ≤ 0
            ax.fill_between(
                xs, [max(m - s, 1e-19) for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2
            )

            def at(t: int, runs=runs, halve=halve) -> str:
                want = 2 * t if halve else t
                vals = [r["generator_error"] for run in runs for r in run.records if r["round"] == want]
                return fmt(vals) if len(vals) == len(runs) else "–"

            final = [run.records[-1]["generator_error"] for run in runs]
            cells = [at(100), at(250), at(500), fmt(final)]
            print(f"| {lam} | {alg} | {hyper} | {len(runs)} | " + " | ".join(cells) + " |")
        ax.set_yscale("log")
        ax.set_ylim(1e-19, 10)
        ax.set_title(f"λ = {lam}")
        ax.set_xlabel("iteration (round; SAGDA: round / 2)")
        ax.set_ylabel("(μ − 0)² + (σ − 0.1)²")
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def wgan_tune(root: Path, png: Path) -> None:
    """Every (λ, algorithm, local lr, global lr) of a tuning sweep: the mean final error over its
    seeds (or the round it diverged in); then :func:`wgan`'s table and plot of the selected pairs."""
    rows = []
    for runs in groups(root).values():
        alg, lam, lr, glr = wgan_setting(runs)
        if any(run.summary.get("status") != "finished" for run in runs):
            cell = "diverged (last evaluated round " + ", ".join(str(run.records[-1]["round"]) for run in runs) + ")"
        else:
            cell = fmt([run.records[-1]["generator_error"] for run in runs])
        rows.append((lam, alg, lr, glr, len(runs), cell))
    print("| λ | algorithm | local lr | global lr | seeds | final error |")
    print("|---:|---|---:|---:|---:|---:|")
    for lam, alg, lr, glr, n, cell in sorted(rows):
        print(f"| {lam} | {alg} | {lr} | {glr} | {n} | {cell} |")
    print()
    wgan(root, png)


def fair(root: Path, png: Path, worst_key: str = "test_worst_class_accuracy") -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    print(f"| configuration | seeds | final test accuracy | final {worst_key} | final max y_c |")
    print("|---|---:|---:|---:|---:|")
    for label, runs in sorted(groups(root).items()):
        for ax, key in zip(axes, ("test_accuracy", worst_key)):
            xs, mean, std = series(runs, key)
            ax.plot(xs, mean, label=label)
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
            ax.set_xlabel("round")
            ax.set_ylabel(key)
        acc = [run.records[-1]["test_accuracy"] for run in runs]
        worst = [run.records[-1][worst_key] for run in runs]
        dual = [run.records[-1].get("dual_max", float("nan")) for run in runs]
        cells = [fmt(acc, ".4f", ".4f"), fmt(worst, ".4f", ".4f"), fmt(dual, ".3f", ".3f")]
        print(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def ncsc(root: Path, png: Path) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    print("| configuration | seeds | ‖∇Φ‖ @50 | ‖∇Φ‖ @100 | final ‖∇Φ‖ | min over rounds | first round mean ≤ 0.5 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, runs in sorted(groups(root).items(), key=lambda kv: int(kv[0].split("=")[-1])):
        xs, mean, std = series(runs, "grad_phi_norm")
        ax.plot(xs, mean, label=label)
        ax.fill_between(
            xs, [max(m - s, 1e-12) for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2
        )

        def at(t: int, runs=runs) -> str:
            vals = [r["grad_phi_norm"] for run in runs for r in run.records if r["round"] == t]
            return fmt(vals, ".3f", ".3f") if len(vals) == len(runs) else "–"

        hit = next((x for x, m in zip(xs, mean) if m <= 0.5), None)
        final = [run.records[-1]["grad_phi_norm"] for run in runs]
        low = [min(r["grad_phi_norm"] for r in run.records) for run in runs]
        cells = [at(50), at(100), fmt(final, ".3f", ".3f"), fmt(low, ".3f", ".3f"), str(hit) if hit else "–"]
        print(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("‖∇Φ(x)‖")
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def kappa(root: Path, png: Path, eps: tuple[float, ...] = (1.0, 0.1, 0.01)) -> None:
    """The condition-number sweep: ‖∇Φ‖ vs rounds per (algorithm, μ) and the rounds-to-ε table
    (the first evaluated round at which the seed-mean ‖∇Φ‖ is ≤ ε; "–": not within the run).
    With step sizes in the grid, the setting kept per (algorithm, μ) is the one whose seed-mean
    reaches the smallest ε, first (ties: the lower mean minimum); a diverged run ranks last."""
    pat = re.compile(r"^(\w+),.*algorithm\.quadratic_mu=([\d.e-]+)")
    best: dict[tuple[float, str], tuple[tuple, str, list]] = {}
    for label, runs in groups(root).items():
        m = pat.match(label)
        if not m:
            continue
        xs, mean, _ = series(runs, "grad_phi_norm")
        hits = [next((x for x, v in zip(xs, mean) if v <= e), math.inf) for e in eps]
        reached = [k for k, h in enumerate(hits) if h < math.inf]
        low = sum(min(r["grad_phi_norm"] for r in run.records) for run in runs) / len(runs)
        diverged = any(run.summary.get("status") != "finished" for run in runs)
        score = (diverged, -len(reached), hits[reached[-1]] if reached else 0, low if math.isfinite(low) else math.inf)
        hyper = ", ".join(p.replace("algorithm.", "") for p in label.split(",")[1:] if "quadratic_mu" not in p)
        key = (float(m.group(2)), m.group(1))
        if key not in best or score < best[key][0]:
            best[key] = (score, hyper or "–", runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    cols = " | ".join(f"first round ≤ {e:g}" for e in eps)
    print(f"| algorithm | μ | step sizes | seeds | ‖∇Φ‖ @0 | @100 | final | min over rounds | {cols} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(eps))
    for (mu, alg), (_, hyper, runs) in sorted(best.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        xs, mean, _ = series(runs, "grad_phi_norm")
        ax.plot(xs, mean, label=f"{alg}, μ = {mu:g}", linestyle="-" if alg == "fessgda" else "--")

        def at(t: int, runs=runs) -> str:
            vals = [r["grad_phi_norm"] for run in runs for r in run.records if r["round"] == t]
            return fmt(vals, ".3g", ".1g") if len(vals) == len(runs) else "–"

        final = [run.records[-1]["grad_phi_norm"] for run in runs]
        low = [min(r["grad_phi_norm"] for r in run.records) for run in runs]
        hits = [next((str(x) for x, v in zip(xs, mean) if v <= e), "–") for e in eps]
        cells = [at(0), at(100), fmt(final, ".3g", ".1g"), fmt(low, ".3g", ".1g"), *hits]
        print(f"| {alg} | {mu:g} | {hyper} | {len(runs)} | " + " | ".join(cells) + " |")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("‖∇Φ(x)‖")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def rounds_to(run, key: str, target: float) -> float:
    """The first evaluated round at which ``key`` is ≥ ``target`` (inf if never)."""
    return next((r["round"] for r in run.records if key in r and r[key] >= target), math.inf)


def fig4(root: Path, png: Path, targets: tuple[float, ...] = (0.3, 0.4, 0.5)) -> None:
    """Communication savings from K local steps: accuracy curves per (algorithm, K) and the rounds
    to reach each target worst-class test accuracy."""
    key, pat = "test_worst_class_accuracy", re.compile(r"^(\w+),algorithm\.local_steps=(\d+)$")
    found = sorted(
        ((m.group(1), int(m.group(2)), runs) for label, runs in groups(root).items() if (m := pat.match(label))),
        key=lambda t: (t[0], t[1]),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    cols = " | ".join(f"rounds to worst-class ≥ {t:g}" for t in targets)
    print(f"| algorithm | K | seeds | final test accuracy | final worst-class accuracy | {cols} |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(targets))
    hits_by_alg: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for alg, k, runs in found:
        style = "-" if alg == "fessgda" else "--"
        color = f"C{sorted({t[1] for t in found}).index(k)}"  # colour = K, line style = algorithm
        for ax, metric in zip(axes[:2], ("test_accuracy", key)):
            xs, mean, std = series(runs, metric)
            (line,) = ax.plot(xs, mean, style, color=color, label=f"{alg}, K = {k}")
            ax.fill_between(
                xs,
                [m - s for m, s in zip(mean, std)],
                [m + s for m, s in zip(mean, std)],
                alpha=0.15,
                color=line.get_color(),
            )
            ax.set_xlabel("communication round")
            ax.set_ylabel(metric)
        cells = []
        for t in targets:
            hits = [rounds_to(run, key, t) for run in runs]
            reached = [h for h in hits if math.isfinite(h)]
            cell = fmt(reached, ".1f", ".1f") if reached else "–"
            cells.append(cell if len(reached) == len(runs) else f"{cell} ({len(reached)}/{len(runs)} seeds)")
            if t == targets[len(targets) // 2] and len(reached) == len(runs):
                m = sum(reached) / len(reached)
                sd = math.sqrt(sum((h - m) ** 2 for h in reached) / max(len(reached) - 1, 1))
                hits_by_alg[alg].append((k, m, sd))
        acc = [run.records[-1]["test_accuracy"] for run in runs]
        worst = [run.records[-1][key] for run in runs]
        print(
            f"| {alg} | {k} | {len(runs)} | {fmt(acc, '.4f', '.4f')} | {fmt(worst, '.4f', '.4f')} | "
            + " | ".join(cells)
            + " |"
        )
    target = targets[len(targets) // 2]
    for alg, pts in sorted(hits_by_alg.items()):
        axes[2].errorbar(
            [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], marker="o", capsize=3, label=alg
        )
    axes[2].set_xlabel("local steps K")
    axes[2].set_ylabel(f"rounds to worst-class accuracy ≥ {target:g}")
    axes[2].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    kind, root, png = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    groups_fair = lambda r, p: fair(r, p, "test_worst_group_accuracy")  # noqa: E731
    {
        "wgan": wgan,
        "fair": fair,
        "fair_groups": groups_fair,
        "ncsc": ncsc,
        "kappa": kappa,
        "fig4": fig4,
        "wgan_tune": wgan_tune,
    }[kind](root, png)
