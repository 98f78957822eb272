"""The claims table (docs/results/claims.md): each paper's headline claim re-checked from run folders.

    python scripts/claims.py                       # every row from its run folder (runs/claims/...)
    python scripts/claims.py --row fessgda_kappa_mu0_1 --record   # ... and keep its per-seed CSV
    python scripts/claims.py --from-recorded --write # the table from docs/results/claims/*.csv into claims.md
    python scripts/claims.py --check-configs         # every row's config: variants and [tune] spaces resolve

The rows are declared in ``docs/results/claims/rows.toml`` (paper, claim, the paper's number, the
set-up, the config and the command that makes the runs, the compared variants, the test metric).
For a row whose runs exist, each seed's value is the test metric **at the round each run selected
on validation** (fedrisk's own :func:`~fedrisk.experiment.selection.selected_record` with the key
the run selected on: ``run_select_key``), so nothing here re-implements selection.  A baseline
given as a list is the one with the best mean *selection* value (validation, never test).

Statistics (per row, over the paired seeds): ``d_s = sign · (method_s − baseline_s)`` with
``sign = +1`` when larger is better and ``−1`` for losses (``scale = "log"`` compares
``log`` values: a ratio), so ``d > 0`` means the claimed method is better; mean ± sample std of
``d``; a one-sided paired t-test (H1: mean d > 0; ``scipy.stats.t``) and the exact one-sided sign
test (``P(Binomial(n≠0, 1/2) ≥ #d>0)``, by hand).

The verdict rule (:func:`verdict`), at level ``ALPHA = 0.05``:

1. fewer than 3 paired seeds: no verdict (the protocol needs ≥ 3);
2. ``|mean d| < 2 · std d`` with fewer than 5 seeds: no verdict (the issue: 5 seeds where the
   gap is within 2 std);
3. mean d > 0 and t-test p < ALPHA: **reproduced**, or **reproduced in direction** when the
   row gives the paper's effect (``paper_effect``, on the same scale as d) and the mean d is
   below half of it;
4. otherwise **not reproduced** (the table gives d and p: the evidence the set-up would have
   shown the effect);
5. a tuned value in the outer 5 % of its search range withholds the verdict that more tuning
   could overturn (a verdict is only as good as the tuning behind it: widen the range and
   re-tune): an edge of a baseline withholds *reproduced* (a better-tuned baseline could close
   the gap), an edge of the claimed method withholds *not reproduced* (a better-tuned method
   could open it).  A verdict that more tuning of the side at the edge can only strengthen stands.

Rows marked ``testable = false`` are *not testable here* (with what they need); rows whose runs
are missing are "not run yet under the protocol" in the table (with the command and the CPU
estimate), and ``--row ID`` on such a row stops with the missing runs and the command that
makes them.  Tuned values at the edge of their search range are flagged (rule 5).

``runs/`` is not kept in git, so ``--record`` writes each row's per-seed values to
``docs/results/claims/<row>.csv`` and ``--from-recorded`` recomputes the verdicts from them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "docs" / "results" / "claims" / "rows.toml"
RECORDED = ROOT / "docs" / "results" / "claims"
PAGE = ROOT / "docs" / "results" / "claims.md"
BEGIN, END = "<!-- claims table: begin (scripts/claims.py --write) -->", "<!-- claims table: end -->"
ALPHA = 0.05
REPRODUCED, IN_DIRECTION, NOT_REPRODUCED = "reproduced", "reproduced in direction", "not reproduced"
NOT_TESTABLE, NOT_RUN = "not testable here", "not run yet under the protocol"
CSV_COLUMNS = ("seed", "method", "baseline", "method_round", "baseline_round", "method_steps", "method_bytes")


class ClaimsError(Exception):
    """A row that cannot be checked: missing runs, too few seeds, a bad rows file (one line)."""


@dataclass
class Row:
    """One claim (a ``[[row]]`` of rows.toml)."""

    id: str
    paper: str
    claim: str
    paper_number: str
    setup: str
    command: str = ""
    runs: str = ""
    method: str = ""
    baseline: list[str] = field(default_factory=list)
    metric: str = ""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    scale: str = "linear"
    paper_effect: float | None = None
    testable: bool = True
    needs: str = ""
    cpu: str = ""
    section: str = ""
    config: str = ""
    overrides: dict = field(default_factory=dict)  # the command's --set KEY=VALUE


@dataclass
class Paired:
    """Per-seed values of a row: the claimed method and the (chosen) baseline."""

    baseline: str
    seeds: list[int]
    method: list[float]
    other: list[float]
    rounds: list[tuple[int | None, int | None]] = field(default_factory=list)
    steps: list[float | None] = field(default_factory=list)
    bytes: list[float | None] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


@dataclass
class Stats:
    n: int
    mean: float
    std: float
    t_p: float
    sign_p: float
    positive: int


def load_rows(path: Path = ROWS) -> list[Row]:
    """The rows of ``path``; an unknown key or a duplicate id is an error naming it."""
    data = tomllib.loads(path.read_text())
    rows, seen = [], set()
    known = set(Row.__dataclass_fields__)
    for i, raw in enumerate(data.get("row", [])):
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ClaimsError(f"{path}: row {i + 1} has unknown key(s) {unknown}; allowed: {sorted(known)}")
        if isinstance(raw.get("baseline"), str):
            raw = {**raw, "baseline": [raw["baseline"]]}
        row = Row(**raw)
        if row.id in seen:
            raise ClaimsError(f"{path}: duplicate row id {row.id!r}")
        if row.scale not in ("linear", "log"):
            raise ClaimsError(f"{path}: row {row.id!r}: scale = {row.scale!r}; allowed: linear, log")
        seen.add(row.id)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- statistics


def sign_test(diffs: Sequence[float]) -> float:
    """Exact one-sided sign test: P(#positive >= observed) under Binomial(n, 1/2), zeros dropped.

    Example:
        >>> sign_test([1.0, 2.0, 3.0]), sign_test([1.0, -1.0, 2.0, 0.0])
        (0.125, 0.5)
    """
    nonzero = [d for d in diffs if d != 0]
    n, k = len(nonzero), sum(d > 0 for d in nonzero)
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n else 1.0


def paired_t(diffs: Sequence[float]) -> float:
    """One-sided paired t-test p-value for H1: mean(d) > 0 (n - 1 degrees of freedom); a zero
    spread (identical differences) gives 0 for a positive mean and 1 otherwise.

    Example:
        >>> round(paired_t([0.02, 0.03, 0.01]), 4)  # t = 2 sqrt(3), 2 df: 1/2 - t / (2 sqrt(2 + t^2))
        0.0371
    """
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd <= 1e-12 * abs(mean) or sd == 0:  # identical differences (up to rounding)
        return 0.0 if mean > 0 else 1.0
    return float(stats.t.sf(mean / (sd / math.sqrt(n)), n - 1))


def differences(row: Row, method: Sequence[float], other: Sequence[float]) -> list[float]:
    """``d_s`` (> 0: the claimed method better) on the row's scale."""
    from fedrisk.experiment.selection import lower_is_better

    sign = -1.0 if lower_is_better(row.metric) else 1.0
    f = math.log if row.scale == "log" else float
    return [sign * (f(m) - f(b)) for m, b in zip(method, other, strict=True)]


def statistics(diffs: Sequence[float]) -> Stats:
    n = len(diffs)
    mean = sum(diffs) / n
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    return Stats(n, mean, std, paired_t(diffs) if n > 1 else 1.0, sign_test(diffs), sum(d > 0 for d in diffs))


def verdict(s: Stats, paper_effect: float | None = None, method_edge: bool = False, baseline_edge: bool = False) -> str:
    """The documented rule (module docstring), or a "no verdict: ..." reason; ``method_edge`` /
    ``baseline_edge``: a tuned value of the claimed method / of a baseline is at the edge of its
    search range (rule 5).

    Example:
        >>> verdict(Stats(3, 0.05, 0.01, 0.01, 0.125, 3)), verdict(Stats(3, 0.05, 0.01, 0.01, 0.125, 3), 0.2)
        ('reproduced', 'reproduced in direction')
        >>> verdict(Stats(3, 0.01, 0.02, 0.3, 0.5, 2))
        'no verdict: the gap is within 2 std over 3 seeds; run 5 seeds'
        >>> verdict(Stats(3, 0.05, 0.01, 0.01, 0.125, 3), method_edge=True)   # tuning the method more can only help
        'reproduced'
    """
    if s.n < 3:
        return f"no verdict: {s.n} paired seed(s); the protocol needs >= 3"
    if s.n < 5 and abs(s.mean) < 2 * s.std:
        return f"no verdict: the gap is within 2 std over {s.n} seeds; run 5 seeds"
    if s.mean > 0 and s.t_p < ALPHA:
        if baseline_edge:
            return "no verdict: a baseline's tuned value is at the edge of its search range; widen it and re-tune"
        return IN_DIRECTION if paper_effect is not None and s.mean < 0.5 * paper_effect else REPRODUCED
    if method_edge:
        return "no verdict: the claimed method's tuned value is at the edge of its search range; widen it and re-tune"
    return NOT_REPRODUCED


# ----------------------------------------------------------------------------- reading runs


@dataclass
class Picked:
    """One finished run read at its validation-selected round."""

    test: float  # the row's test metric at that round
    selection: float  # the value it was selected on
    key: str  # the record key it selected on
    round: int | None
    record: dict


def selected(run_dir: Path, metric: str) -> Picked:
    """Read ``run_dir`` at the round it selected on validation (fedrisk's selection code)."""
    from fedrisk.experiment.outputs import load_run
    from fedrisk.experiment.selection import record_key, run_select_key, selected_record

    run = load_run(run_dir)
    key = run_select_key(run)
    if not key:
        raise ClaimsError(f"{run_dir}: the run selected nothing (no validation split or run.select_by = 'none')")
    rec = selected_record(run.records, key)
    if rec is None or record_key(rec, metric) not in rec:
        raise ClaimsError(f"{run_dir}: no evaluation with {metric!r} at the round selected on {key!r}")
    return Picked(float(rec[record_key(rec, metric)]), float(rec[record_key(rec, key)]), key, rec.get("round"), rec)


def missing_runs(row: Row, base: Path = ROOT) -> list[str]:
    """The run folders of ``row`` that are not finished runs (``"<path> (<status>)"``)."""
    from fedrisk.experiment.outputs import RunDir

    out = []
    for variant in [row.method, *row.baseline]:
        for seed in row.seeds:
            d = RunDir(base / row.runs / variant / f"seed={seed}")
            if d.status() != "finished":
                out.append(f"{row.runs}/{variant}/seed={seed} ({d.status()})")
    return out


def edge_flags(row: Row, variant: str, base: Path = ROOT) -> list[str]:
    """Tuned values in the outer 5 % of their search range (log ranges on the log scale)."""
    folder = base / row.runs / variant
    if not (folder / "tuned.json").is_file() or not (folder / "tune" / "tune.toml").is_file():
        return []
    params = json.loads((folder / "tuned.json").read_text()).get("params", {})
    space = tomllib.loads((folder / "tune" / "tune.toml").read_text()).get("study", {}).get("space", {})
    flags = []
    for key, value in params.items():
        kind, *bounds = str(space.get(key, "")).split(":")
        if kind not in ("log", "float", "int", "logint") or len(bounds) != 2 or not isinstance(value, (int, float)):
            continue
        lo, hi = float(bounds[0]), float(bounds[1])
        f = math.log if kind.startswith("log") else float
        pos = (f(value) - f(lo)) / (f(hi) - f(lo))
        if pos < 0.05 or pos > 0.95:
            flags.append(f"{variant}: {key.rsplit('.', 1)[-1]}={value:.4g} at the edge of {space[key]}")
    return flags


def collect(row: Row, base: Path = ROOT) -> Paired:
    """The paired per-seed values of ``row`` from its run folders; missing runs are an error
    naming them and the command that makes them."""
    missing = missing_runs(row, base)
    if missing:
        raise ClaimsError(
            f"row {row.id}: {len(missing)} run(s) missing or unfinished: {', '.join(missing)}; "
            f"make them with: {row.command}"
        )

    from fedrisk.experiment.selection import lower_is_better

    def values(variant: str) -> list[Picked]:
        return [selected(base / row.runs / variant / f"seed={s}", row.metric) for s in row.seeds]

    method = values(row.method)
    options = {b: values(b) for b in row.baseline}

    def weakness(b: str) -> float:  # the baselines' mean selection (validation) value, best first
        vals = options[b]
        mean = sum(v.selection for v in vals) / len(vals)
        return mean if lower_is_better(vals[0].key) else -mean

    chosen = min(options, key=weakness)
    other = options[chosen]
    flags = [f for v in [row.method, *row.baseline] for f in edge_flags(row, v, base)]
    return Paired(
        chosen,
        list(row.seeds),
        [v.test for v in method],
        [v.test for v in other],
        [(m.round, o.round) for m, o in zip(method, other, strict=True)],
        [m.record.get("steps_per_client") for m in method],
        [m.record.get("bytes_down", 0) + m.record.get("bytes_up", 0) for m in method],
        flags,
    )


# ----------------------------------------------------------------------------- recorded CSVs


def record(row: Row, paired: Paired, folder: Path = RECORDED) -> Path:
    """Write ``folder/<row>.csv`` (one line per seed) and ``<row>.json`` (the baseline, flags)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{row.id}.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        for i, seed in enumerate(paired.seeds):
            r = paired.rounds[i] if paired.rounds else (None, None)
            w.writerow(
                [
                    seed,
                    repr(paired.method[i]),
                    repr(paired.other[i]),
                    r[0],
                    r[1],
                    paired.steps[i] if paired.steps else "",
                    paired.bytes[i] if paired.bytes else "",
                ]
            )
    meta = {"baseline": paired.baseline, "flags": paired.flags, "runs": row.runs}
    (folder / f"{row.id}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def recorded(row: Row, folder: Path = RECORDED) -> Paired | None:
    """The row's recorded values, or None when it has no CSV."""
    path = folder / f"{row.id}.csv"
    if not path.is_file():
        return None
    with path.open() as fh:
        lines = list(csv.DictReader(fh))
    if not lines or set(CSV_COLUMNS) - set(lines[0]):
        raise ClaimsError(f"{path}: expected the columns {', '.join(CSV_COLUMNS)}")
    meta_path = folder / f"{row.id}.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}

    def num(text: str) -> float | None:
        return float(text) if text not in ("", "None") else None

    return Paired(
        meta.get("baseline", ",".join(row.baseline)),
        [int(r["seed"]) for r in lines],
        [float(r["method"]) for r in lines],
        [float(r["baseline"]) for r in lines],
        [(num(r["method_round"]), num(r["baseline_round"])) for r in lines],
        [num(r["method_steps"]) for r in lines],
        [num(r["method_bytes"]) for r in lines],
        list(meta.get("flags", [])),
    )


# ----------------------------------------------------------------------------- the table


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.4f}"


def _mean_std(xs: Sequence[float]) -> str:
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return f"{_fmt(mean)} ± {_fmt(std)}"


def cells(row: Row, paired: Paired | None, missing: Sequence[str] = ()) -> list[str]:
    """The Markdown cells of one row: paper, claim, paper's number, set-up, result, difference, verdict."""
    link = f" ([section]({row.section}))" if row.section else ""
    head = [row.paper, f"{row.claim}{link}", row.paper_number, row.setup]
    if not row.testable:
        return [*head, "–", "–", f"**{NOT_TESTABLE}**: {row.needs}"]
    if paired is None:
        cmd = f"`{row.command}`" if row.command else "(no command)"
        note = f"; {len(missing)} run(s) missing" if missing else ""
        return [*head, "–", "–", f"**{NOT_RUN}**: {cmd} (estimated CPU: {row.cpu}){note}"]
    d = differences(row, paired.method, paired.other)
    s = statistics(d)
    scale = "log ratio" if row.scale == "log" else "difference"
    result = (
        f"{row.method}: {_mean_std(paired.method)}; {paired.baseline}: {_mean_std(paired.other)} "
        f"({row.metric} at the validation-selected round, {s.n} seeds)"
    )
    diff = (
        f"{scale} {_mean_std(d)} (> 0: {row.method} better; {s.positive}/{s.n} seeds), "
        f"paired t p = {s.t_p:.3g}, sign p = {s.sign_p:.3g}"
    )
    method_edge = any(f.startswith(f"{row.method}: ") for f in paired.flags)
    baseline_edge = any(not f.startswith(f"{row.method}: ") for f in paired.flags)
    v = verdict(s, row.paper_effect, method_edge=method_edge, baseline_edge=baseline_edge)
    flags = f" (⚠ {'; '.join(paired.flags)})" if paired.flags else ""
    cmd = f" `{row.command}`" if row.command else ""
    return [*head, result, diff, f"**{v}**{flags}{cmd}"]


HEAD = [
    "paper",
    "claim",
    "paper's number",
    "set-up here",
    "fedrisk (tuned, mean ± std)",
    "paired difference, test",
    "verdict",
]


def table(rows: Sequence[Row], from_recorded: bool, base: Path = ROOT, folder: Path = RECORDED) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for row in rows:
        paired, missing = None, []
        if row.testable:
            if from_recorded:
                paired = recorded(row, folder)
            else:
                missing = missing_runs(row, base)
                paired = None if missing else collect(row, base)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(row, paired, missing)) + " |")
    return "\n".join(lines) + "\n"


def write_page(text: str, page: Path = PAGE) -> None:
    """Replace the table between the markers of ``page``."""
    body = page.read_text()
    if BEGIN not in body or END not in body:
        raise ClaimsError(f"{page}: the markers {BEGIN!r} and {END!r} are missing")
    start, stop = body.index(BEGIN) + len(BEGIN), body.index(END)
    page.write_text(body[:start] + "\n" + text + body[stop:])


def check_configs(rows: Sequence[Row]) -> list[str]:
    """Resolve every variant of every row's config and its tune spec (what ``fedrisk sweep
    --tune`` checks before its first trial; the row's ``--set`` applied after the variants' keys,
    as the command does); returns one line per config."""
    from fedrisk.cli import chosen_variants
    from fedrisk.experiment.config import load_config
    from fedrisk.experiment.tune import tune_spec

    out = []
    for config in dict.fromkeys(r.config for r in rows if r.config):
        row = next(r for r in rows if r.config == config)
        cfg = load_config(ROOT / config).with_overrides(row.overrides)
        variants = chosen_variants(cfg, None, row.overrides)
        for name, over in variants.items():
            vcfg = cfg.with_overrides(over)
            tune_spec(vcfg, where=f"{config} variant {name!r}")
        out.append(f"{config}: {len(variants)} variant(s) resolve, tune spaces check")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from fedrisk.errors import FedriskError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", action="append", default=[], help="only these row ids (repeatable)")
    p.add_argument("--rows", default=str(ROWS), help="the rows file (default docs/results/claims/rows.toml)")
    p.add_argument("--base", default=str(ROOT), help="the folder the rows' runs/ paths are relative to")
    p.add_argument("--record", action="store_true", help="write docs/results/claims/<row>.csv from the runs")
    p.add_argument("--from-recorded", action="store_true", help="read the recorded CSVs instead of runs/")
    p.add_argument("--recorded-dir", default=str(RECORDED), help="where the CSVs are (default docs/results/claims)")
    p.add_argument("--write", action="store_true", help="write the table into docs/results/claims.md")
    p.add_argument("--check-configs", action="store_true", help="resolve every row's config and tune spaces")
    args = p.parse_args(argv)
    try:
        rows = load_rows(Path(args.rows))
        if args.check_configs:
            print("\n".join(check_configs(rows)))
            return 0
        chosen = rows
        if args.row:
            unknown = sorted(set(args.row) - {r.id for r in rows})
            if unknown:
                raise ClaimsError(f"unknown row(s) {unknown}; allowed: {', '.join(r.id for r in rows)}")
            chosen = [r for r in rows if r.id in args.row]
        base, folder = Path(args.base), Path(args.recorded_dir)
        if args.row and not args.from_recorded:  # a named row must be checkable: missing runs are an error
            for row in chosen:
                if row.testable:
                    paired = collect(row, base)
                    if args.record:
                        print(f"recorded {record(row, paired, folder)}")
        elif args.record:
            for row in chosen:
                if row.testable and not missing_runs(row, base):
                    print(f"recorded {record(row, collect(row, base), folder)}")
        text = table(chosen, args.from_recorded, base, folder)
        print(text, end="")
        if args.write:
            write_page(text)
    except (ClaimsError, FedriskError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
