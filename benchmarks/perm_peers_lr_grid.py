"""Equal-budget step-size choice for a comparison of personalised methods (issue 28).

``grid`` writes a sweep config in which every variant of CONFIG's ``[sweep.variants]`` appears
once per step size (``<variant>,lr=<v>``), with the method's step ``algorithm.lr`` and, where the
method has one, its personal step tied to it (FedAvg-FT's ``finetune_lr``, Ditto's and pFedMe's
``personal_lr``, Per-FedAvg's ``inner_lr``): every method gets the same values, so the same
budget.  ``choose`` reads the finished grid (``summary.json`` of every run) and prints, per
variant, each value's validation score at its selected round (``run.select_by``, per-client
validation) and the best value, as a table and as the ``"algorithm.lr" = v`` lines to put into
CONFIG's variants.  Test metrics are printed beside, never used.

    python benchmarks/perm_peers_lr_grid.py grid configs/perm/fmnist_peers.toml --lrs 0.03,0.1,0.3 \
        --out runs/perm_fmnist_peers_grid.toml
    fedrisk sweep runs/perm_fmnist_peers_grid.toml --seeds 0 --out runs/perm_fmnist_peers_grid
    python benchmarks/perm_peers_lr_grid.py choose runs/perm_fmnist_peers_grid
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tomli_w
import tomllib

TIED = {"fedavg_ft": "finetune_lr", "ditto": "personal_lr", "pfedme": "personal_lr", "perfedavg": "inner_lr"}


def grid(config: Path, lrs: list[float], out: Path, only: list[str] | None = None) -> None:
    raw = tomllib.loads(config.read_text(encoding="utf-8"))
    variants = {k: v for k, v in raw["sweep"]["variants"].items() if not only or k in only}
    new = {}
    for name, keys in variants.items():
        for lr in lrs:
            v = dict(keys)
            v["algorithm.lr"] = lr
            tied = TIED.get(v.get("algorithm.name", ""))
            if tied:
                v[f"algorithm.{tied}"] = lr
            new[f"{name},lr={lr:g}"] = v
    raw["sweep"]["variants"] = new
    raw.setdefault("output", {})["dir"] = str(out.with_suffix(""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# generated from {config} by benchmarks/perm_peers_lr_grid.py\n" + tomli_w.dumps(raw))
    print(f"{out}: {len(new)} variants ({len(variants)} methods x {len(lrs)} step sizes)")


def choose(sweep: Path, config: Path | None = None, write: Path | None = None, only: list[str] | None = None) -> None:
    by_method: dict[str, list[tuple[float, float, float, int]]] = {}
    for summary in sorted(sweep.glob("*/seed=*/summary.json")):
        label = summary.parent.parent.name
        name, _, lr = label.rpartition(",lr=")
        s = json.loads(summary.read_text())
        sel = s.get("selected") or {}
        if s.get("status") != "finished" or "value" not in sel:
            continue
        test = sel["metrics"].get("personal_accuracy_mean", float("nan"))
        by_method.setdefault(name, []).append((float(lr), float(sel["value"]), float(test), int(sel["round"])))
    print("| method | step size: validation score (selected round) [test, not used] | chosen |")
    print("|---|---|---:|")
    chosen = {}
    for name, rows in by_method.items():
        rows.sort()
        best = max(rows, key=lambda r: (r[1], -r[0]))  # ties: the smaller step
        chosen[name] = best[0]
        cells = "; ".join(f"{lr:g}: {v:.4f} (r{rnd}) [{t:.4f}]" for lr, v, t, rnd in rows)
        print(f"| {name} | {cells} | {best[0]:g} |")
    print()
    for name, lr in chosen.items():
        print(f'[sweep.variants.{name}] "algorithm.lr" = {lr:g}')
    if config is not None and write is not None:  # CONFIG with the chosen values (tied keys included)
        raw = tomllib.loads(config.read_text(encoding="utf-8"))
        if only:
            raw["sweep"]["variants"] = {k: v for k, v in raw["sweep"]["variants"].items() if k in only}
        for name, keys in raw["sweep"]["variants"].items():
            if name in chosen:
                keys["algorithm.lr"] = chosen[name]
                tied = TIED.get(keys.get("algorithm.name", ""))
                if tied:
                    keys[f"algorithm.{tied}"] = chosen[name]
        write.write_text(f"# {config} with the step sizes chosen on validation in {sweep}\n" + tomli_w.dumps(raw))
        print(f"wrote {write}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="write the step-size grid sweep config")
    g.add_argument("config", type=Path)
    g.add_argument("--lrs", required=True, help="comma-separated step sizes")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--only", help="comma-separated variants (default: all)")
    c = sub.add_parser("choose", help="the best step size per method on validation")
    c.add_argument("sweep", type=Path)
    c.add_argument("--config", type=Path, help="with --write: the comparison config to fill in")
    c.add_argument("--write", type=Path, help="write CONFIG with the chosen step sizes here")
    c.add_argument("--only", help="with --write: keep only these variants (comma-separated)")
    args = parser.parse_args()
    only = args.only.split(",") if args.only else None
    if args.command == "grid":
        grid(args.config, [float(x) for x in args.lrs.split(",")], args.out, only)
    else:
        choose(args.sweep, args.config, args.write, only)


if __name__ == "__main__":
    main()
