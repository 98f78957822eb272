"""Per-seed values of a sweep and paired differences of one method against the others.

For each configuration (``SWEEP/<variant>/seed=<s>/summary.json``) and seed: the test metrics at
the validation-selected round (``summary.json``'s ``selected``) and at the last round.  Then, for
``--reference`` against every other variant, the per-seed differences of ``--metric`` (paired by
seed: the same data draw, partition and initialisation), their mean, a paired t-test and a
two-sided sign test.  With 3 seeds a sign test cannot go below p = 0.25: read its p-value as
"how consistent", not as significance.

    .venv/bin/python scripts/paired_seeds.py runs/fedxl_fmnist_pauc_tuned --reference fedxl2 \\
        --metric test_spauroc:0.3 --csv docs/results/fedxl_fmnist_pauc_tuned.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path


def collect(sweep: Path) -> dict[str, dict[int, dict]]:
    """``{variant: {seed: summary}}`` of the finished seed runs under ``sweep``."""
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(sweep.glob("*/seed=*/summary.json")):
        summary = json.loads(path.read_text())
        if summary.get("status") not in (None, "finished"):
            continue
        out.setdefault(path.parent.parent.name, {})[int(path.parent.name.split("=", 1)[1])] = summary
    if not out:
        raise SystemExit(f"no finished runs (<variant>/seed=<s>/summary.json) under {sweep}")
    return out


def tuned(sweep: Path, variant: str) -> str:
    path = sweep / variant / "tuned.json"
    if not path.is_file():
        return ""
    params = json.loads(path.read_text()).get("params", {})
    shown = [f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    return ", ".join(shown)


def paired(diffs: list[float]) -> tuple[float, float]:
    """(paired t-test p, two-sided sign-test p) of per-seed differences."""
    from scipy import stats

    n = len(diffs)
    t_p = float(stats.ttest_1samp(diffs, 0.0).pvalue) if n > 1 and statistics.pstdev(diffs) > 0 else math.nan
    nonzero = [d for d in diffs if d != 0]
    pos = sum(d > 0 for d in nonzero)
    sign_p = float(stats.binomtest(pos, len(nonzero), 0.5).pvalue) if nonzero else math.nan
    return t_p, sign_p


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path)
    p.add_argument("--reference", required=True, help="the variant compared with every other one")
    p.add_argument("--metric", default="test_auroc", help="the metric of the paired differences")
    p.add_argument("--csv", type=Path, help="write the per-seed values here")
    args = p.parse_args()
    runs = collect(args.sweep)
    if args.reference not in runs:
        raise SystemExit(f"--reference {args.reference!r} is not a variant of {args.sweep}; found: {', '.join(runs)}")
    summaries = [s for seeds in runs.values() for s in seeds.values()]
    metrics = sorted({m for s in summaries for m in s["final"] if m.startswith("test_")})
    rows = []
    for variant, seeds in runs.items():
        for seed, s in sorted(seeds.items()):
            sel = s.get("selected") or {}
            row = {"variant": variant, "tuned": tuned(args.sweep, variant), "seed": seed}
            row["selected_round"] = sel.get("round", "")
            row["selected_by"] = sel.get("selected_by", "")
            for m in metrics:
                row[f"selected {m}"] = sel.get("metrics", {}).get(m, "")
                row[f"final {m}"] = s["final"].get(m, "")
            rows.append(row)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv} ({len(rows)} rows)")
    key = f"selected {args.metric}"
    ref = {r["seed"]: r[key] for r in rows if r["variant"] == args.reference}
    print(f"\n{args.reference} minus each method, {args.metric} at the validation-selected round, paired by seed:\n")
    print("| method | per-seed difference | mean | paired t-test p | sign test p |")
    print("|---|---|---:|---:|---:|")
    for variant in runs:
        if variant == args.reference:
            continue
        other = {r["seed"]: r[key] for r in rows if r["variant"] == variant}
        seeds = sorted(set(ref) & set(other))
        diffs = [ref[s] - other[s] for s in seeds]
        t_p, sign_p = paired(diffs)
        shown = " / ".join(f"{d:+.4f}" for d in diffs)
        seeds_shown = ", ".join(map(str, seeds))
        mean = statistics.mean(diffs)
        print(f"| {variant} | {shown} (seeds {seeds_shown}) | {mean:+.4f} | {t_p:.3f} | {sign_p:.3f} |")


if __name__ == "__main__":
    main()
