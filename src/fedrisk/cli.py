"""The ``fedrisk`` command line (also ``python -m fedrisk``).

::

    fedrisk run CONFIG [--set key=value ...] [--variant NAME] [--out DIR] [--resume | --overwrite] [--plain | --quiet]
    fedrisk sweep CONFIG [--set key=value ...] [--variant NAME ...] [--grid key=v1,v2 ...]
                  [--seeds N | --seeds 0,3,7] [--jobs J] [--tune TRIALS] [--out DIR] [--plain | --quiet]
    fedrisk tune CONFIG [--set key=value ...] [--space KEY=SPEC ...] [--trials N] [--metric M]
                 [--pruner median|halving|none] [--sampler tpe|random] [--jobs J] [--out DIR]
                 [--resume | --overwrite] [--quiet]
    fedrisk report RUN_DIR... [--out DIR] [--metrics m1,m2] [--no-plots] [--at bytes=2e6] [--target m=0.9]
    fedrisk evaluate RUN_DIR [--split test|validation] [--config OTHER] [--model selected|final]
                     | RUN_DIR --new-clients CONFIG [--epochs E] [--rounds R]
    fedrisk list [KIND [NAME]]
    fedrisk deploy certs | node-key | register | superlink | supernode | run ...   (fedrisk.deploy.cli)

``--set`` is the last word: it is applied after a sweep variant's keys (``run --variant``,
``sweep``, ``sweep --tune``) and takes its key out of the config's ``[sweep.grid]``; a key given
to ``--set`` and ``--grid`` both is an error (``--set sweep.variants.NAME.KEY=...`` sets one
variant's key, kept over a general ``--set KEY=...``).

User errors (a bad config value, a name that does not exist, a run directory in the wrong
state) print ``error: <message>`` (a config: one such line per problem) and exit with status
2, never with a traceback.  A run
stopped by SIGINT / SIGTERM writes its checkpoint and exits with 130 / 143.

Example:
    >>> main(["list", "partitioners"])  # doctest: +ELLIPSIS
    partitioners
      by_attribute ...
    0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrisk import __version__
from fedrisk.cli_list import KINDS, cmd_list
from fedrisk.errors import FedriskError, check_range
from fedrisk.experiment.outputs import outputs_line  # below both CLIs (also used by `fedrisk deploy run`)

Sets = Sequence[str] | Mapping[str, Any]
"""The command line's ``--set`` overrides (``["run.rounds=8"]``, or already parsed: ``{"run.rounds": 8}``)."""


# ============================================================================= commands


def _progress(args: argparse.Namespace) -> str:
    if getattr(args, "quiet", False):
        return "none"
    return "plain" if getattr(args, "plain", False) else "auto"


def cmd_run(args: argparse.Namespace) -> int:
    from fedrisk.experiment.config import load_config

    cfg = load_config(args.config, args.set)  # config errors first: the runner imports torch
    cfg, variant = pick_variant(cfg, args.variant, args.set)
    from fedrisk.experiment.outputs import RunDir
    from fedrisk.experiment.runner import check_out_dir, default_out_dir, run_experiment

    out = Path(args.out) if args.out else default_out_dir(cfg)
    if variant and not args.out:
        out = out / variant
    seeds = cfg["run.seeds"]
    if len(seeds) > 1:
        from fedrisk.experiment.sweep import expand_sweep

        points = expand_sweep(cfg, out, seeds=seeds)
        for p in points:
            rd = RunDir(p.path)
            if args.overwrite:
                rd.clear()
            elif not args.resume and rd.status() != "empty":
                check_out_dir(rd, resume=False, overwrite=False)
        return _sweep(cfg, out, args, grid={}, variants={}, seeds=seeds, jobs=1)
    result = run_experiment(cfg, out, resume=args.resume, overwrite=args.overwrite, progress=_progress(args))
    if result.primary:
        print(run_table(result.summary, result.path))
    return 0


def pick_variant(cfg: Any, name: str | None, sets: Sets = ()) -> tuple[Any, str]:
    """The config of sweep variant ``name`` (its overrides applied, then the command line's
    ``sets``: :func:`chosen_variants`; the base without a name).  A config with variants run
    without ``--variant`` says which exist and that the base runs."""
    variants = cfg["sweep.variants"]
    if name is None:
        if variants:
            print(
                f"note: the config defines sweep variants {', '.join(variants)}; running the base config "
                "(choose one with --variant NAME, or run them all with `fedrisk sweep`)",
                file=sys.stderr,
            )
        return cfg, ""
    return cfg.with_overrides(chosen_variants(cfg, [name], sets)[name]), name


def chosen_variants(cfg: Any, names: Sequence[str] | None, sets: Sets = ()) -> dict[str, dict[str, Any]]:
    """The config's ``[sweep.variants]`` named in ``names`` (in the config's order; all of them
    without names), each with the command line's ``--set`` (``sets``) applied after its keys
    (:func:`~fedrisk.experiment.config.after_set`; a note names each value it replaces).  A name
    that is not a variant is an error listing the variants."""
    variants = cfg["sweep.variants"]
    for name in names or ():
        if name not in variants:
            allowed = ", ".join(variants) if variants else "(none: the config has no [sweep.variants])"
            raise FedriskError(f"--variant {name!r} is not a variant of the config; allowed: {allowed}")
    chosen = {name: over for name, over in variants.items() if not names or name in names}
    return {name: _after_set(over, sets, name) for name, over in chosen.items()}


def _after_set(overrides: dict[str, Any], sets: Sets, variant: str | None = None) -> dict[str, Any]:
    """:func:`~fedrisk.experiment.config.after_set`, with a note naming the values ``--set`` replaces."""
    from fedrisk.experiment.config import after_set
    from fedrisk.experiment.schema import format_value

    kept, replaced = after_set(overrides, sets, variant)
    if replaced:
        whose = f"variant {variant}'s" if variant is not None else "the config's [sweep.grid]"
        shown = ", ".join(f"{k} = {format_value(overrides[k])}" for k in replaced)
        print(f"note: --set replaces {whose} {shown}", file=sys.stderr)
    return kept


def run_table(summary: dict[str, Any], path: Path) -> str:
    """The end-of-run summary printed by ``fedrisk run``."""
    from fedrisk.experiment.progress import format_duration, format_number

    lines = [
        f"finished {summary['algorithm']} on {summary['resolved']['federation']}: {summary['rounds']} rounds in "
        f"{format_duration(summary.get('wall_time'))} (seed {summary['seed']})",
        "",
    ]
    selected = summary.get("selected")
    if selected:
        lines += [f"| metric | final | selected (round {selected['round']}) |", "|---|---:|---:|"]
    else:
        lines += ["| metric | final |", "|---|---:|"]
    for k, v in summary["final"].items():
        row = f"| {k} | {format_number(v)} |"
        if selected:
            row += f" {format_number(selected['metrics'].get(k)) if k in selected['metrics'] else '–'} |"
        lines.append(row)
    if selected:
        lines += [
            "",
            f"selected: round {selected['round']} by {selected['selected_by']} = {format_number(selected['value'])} "
            "(run.select_by); its model is in selected.pt (fedrisk evaluate)",
        ]
    else:
        lines += ["", "no model selection (run.select_by: no validation split); the final round is reported"]
    lines += [
        "",
        f"communicated: {summary['bytes_down'] / 1e6:.2f} MB down, {summary['bytes_up'] / 1e6:.2f} MB up",
        outputs_line(path),
    ]
    return "\n".join(lines)


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedrisk.experiment.config import load_config, resolve_seeds

    cfg = load_config(args.config, args.set)  # config errors first: the sweep module imports torch
    variants = chosen_variants(cfg, args.variant, args.set)
    from fedrisk.experiment.config import assignments, overlapping_keys
    from fedrisk.experiment.sweep import parse_grid

    command_grid = parse_grid(args.grid)
    both = overlapping_keys(command_grid, assignments(args.set))
    if both:
        raise FedriskError(f"{', '.join(both)} is set both by --set and by --grid; set it in one place")
    grid = _after_set(dict(cfg["sweep.grid"]), args.set)
    grid.update(command_grid)
    seeds_spec = cfg["sweep.seeds"] if args.seeds is None else _parse_seeds(args.seeds)
    seeds = resolve_seeds(seeds_spec, cfg["run.seed"])
    jobs = args.jobs if args.jobs is not None else cfg["sweep.jobs"]
    check_range("--jobs", jobs, 1)
    out = Path(args.out) if args.out else Path(cfg["output.dir"] or f"runs/{cfg.name}")
    if args.tune is not None:
        check_range("--tune", args.tune, 1)
        if grid:
            raise FedriskError("--tune with a grid is ambiguous (the grid's keys would be tuned too); drop the grid")
        from fedrisk.experiment.sweep import run_tuned_sweep

        result = run_tuned_sweep(
            cfg,
            out,
            trials=args.tune,
            variants=variants,
            seeds=seeds,
            jobs=jobs,
            progress=_progress(args),
            fixed=list(assignments(args.set)),
        )
        return _show_sweep(result)
    return _sweep(cfg, out, args, grid=grid, variants=variants, seeds=seeds, jobs=jobs)


def cmd_evaluate(args: argparse.Namespace) -> int:
    if args.new_clients:
        return _evaluate_new_clients(args)
    from fedrisk.experiment.scoring import evaluate_run

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    scored = evaluate_run(args.run, split=args.split, config=args.config, model=args.model, metrics=metrics)
    print(scored.table())
    return 0


def _parse_seeds(text: str) -> int | list[int]:
    try:
        if "," in text or text.startswith("["):
            return [int(s) for s in text.strip("[]").split(",") if s.strip()]
        n = int(text)
    except ValueError:
        raise FedriskError(f"--seeds = {text!r} is not allowed; allowed: a count N >= 1 or a list like 0,1,2") from None
    if n < 1:
        raise FedriskError(f"--seeds = {n} is out of range; allowed: a count N >= 1 or a list like 0,1,2")
    return n


def _sweep(cfg: Any, out: Path, args: argparse.Namespace, *, grid: Any, variants: Any, seeds: Any, jobs: int) -> int:
    from fedrisk.experiment.sweep import run_sweep

    result = run_sweep(cfg, out, grid=grid, variants=variants, seeds=seeds, jobs=jobs, progress=_progress(args))
    return _show_sweep(result)


def _show_sweep(result: Any) -> int:
    if result.report is not None:
        print()
        print(f"results ({_over_seeds(result.report)}):")
        print(result.report.table)
        print()
        for p in result.report.plots:
            print(f"plot: {p}")
        print(f"report: {result.report.path}")
    if result.failed:
        print(f"\n{len(result.failed)} run(s) failed:", file=sys.stderr)
        for point, message in result.failed:
            print(f"  {point.name} ({point.path}): {message}", file=sys.stderr)
        return 1
    return 0


def _over_seeds(report: Any) -> str:
    runs = sum(len(g.runs) for g in report.groups)
    return f"{runs} run(s) in {len(report.groups)} configuration(s); mean ± sample std over seeds"


def cmd_tune(args: argparse.Namespace) -> int:
    from fedrisk.experiment.config import load_config

    cfg = load_config(args.config, args.set)  # config errors first: the tuner imports torch and optuna
    from fedrisk.experiment.config import assignments
    from fedrisk.experiment.tune import run_tune, tune_spec

    spec = tune_spec(
        cfg,
        fixed=list(assignments(args.set)),
        space=args.space,
        trials=args.trials,
        metric=args.metric,
        pruner=args.pruner,
        sampler=args.sampler,
        jobs=args.jobs,
    )
    out = Path(args.out) if args.out else Path(cfg["output.dir"] or f"runs/{cfg.name}") / "tune"
    echo = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if echo is not None:
        space = ", ".join(f"{k}={d.spec}" for k, d in spec.space.items())
        echo(f"tune: {spec.trials} trials of {space} on {spec.metric} ({spec.direction}) in {out}, jobs={spec.jobs}")
    result = run_tune(
        cfg, out, spec, resume=args.resume, overwrite=args.overwrite, echo=echo, plots=False if args.no_plots else None
    )
    print(result.table)
    print()
    shown = ", ".join(f"{k} = {v!r}" for k, v in result.best_params.items())
    print(f"best: {shown} ({spec.metric} = {result.best_value:.4f} at round {result.best_round})")
    print(f"outputs in {out}: " + " ".join(p.name for p in result.files) + " study.journal trials/")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedrisk.experiment.report import make_report
    from fedrisk.experiment.selection import parse_budget, parse_target

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    at = [parse_budget(a) for a in args.at]
    targets = [parse_target(t) for t in args.target]
    report = make_report(args.runs, out=args.out, metrics=metrics, plots=not args.no_plots, at=at, targets=targets)
    print(f"results ({_over_seeds(report)}):")
    print(report.table)
    print()
    for table in report.extra_tables:
        print(table)
        print()
    for p in report.plots:
        print(f"plot: {p}")
    print(f"report: {report.path}")
    return 0


def _evaluate_new_clients(args: argparse.Namespace) -> int:
    from fedrisk.experiment.new_clients import evaluate_new_clients, format_new_clients

    out = evaluate_new_clients(args.run, args.new_clients, epochs=args.epochs, rounds=args.rounds)
    print(format_new_clients(out, args.run))
    return 0


# ============================================================================= parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedrisk",
        description="Federated optimisation beyond averaging: run, sweep and report experiments from TOML configs.",
    )
    parser.add_argument("--version", action="version", version=f"fedrisk {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def progress_flags(p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group()
        g.add_argument("--plain", action="store_true", help="one line per evaluation (automatic when not a terminal)")
        g.add_argument("--quiet", action="store_true", help="no progress output")

    def set_flag(p: argparse.ArgumentParser, after: str = "") -> None:
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config key (dotted, TOML value), e.g. --set algorithm.lr=0.05; repeatable" + after,
        )

    p = sub.add_parser("run", help="run one experiment from a config", description="Run one experiment from a config.")
    p.add_argument("config", metavar="CONFIG", help="a TOML config file")
    set_flag(p, "; applied after the variant's keys (--variant): the command line wins")
    p.add_argument(
        "--variant",
        metavar="NAME",
        help="run one of the config's [sweep.variants] (into runs/<config name>/NAME by default)",
    )
    p.add_argument("--out", metavar="DIR", help="the run directory (default: output.dir or runs/<config name>)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue the interrupted run in --out from its checkpoint")
    mode.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    progress_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep",
        help="run a grid of configs over seeds, then report",
        description="Run variants x grid x seeds (finished runs are skipped, interrupted ones resumed).",
    )
    p.add_argument("config", metavar="CONFIG", help="a TOML config file (its [sweep] table is the default grid)")
    set_flag(
        p,
        "; applied after the variants' keys and the config's [sweep.grid] (the command line wins; "
        "a key also in --grid is an error)",
    )
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="values of one key to sweep, e.g. --grid algorithm.lr=0.01,0.1; repeatable",
    )
    p.add_argument(
        "--variant",
        action="append",
        metavar="NAME",
        help="run only this one of the config's [sweep.variants] (repeatable; a later sweep without it reuses "
        "the finished runs)",
    )
    p.add_argument("--seeds", metavar="N|LIST", help="number of seeds (from run.seed) or a list like 0,1,2")
    p.add_argument("--jobs", type=int, metavar="J", help="runs in parallel (subprocesses; default sweep.jobs or 1)")
    p.add_argument(
        "--tune",
        type=int,
        metavar="TRIALS",
        help="first tune every variant with TRIALS trials ([tune] table; each variant's tune.keys), then run the "
        "selected configs over the seeds",
    )
    p.add_argument("--out", metavar="DIR", help="the sweep directory (default: output.dir or runs/<config name>)")
    progress_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "tune",
        help="tune hyper-parameters on the validation split (Optuna)",
        description="Tune config keys with Optuna: each trial is a fedrisk run scored on a validation metric; "
        "unpromising trials are pruned; the study (an Optuna journal file) resumes with --resume.",
    )
    p.add_argument("config", metavar="CONFIG", help="a TOML config file (its [tune] table is the default study)")
    set_flag(p)
    p.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="KEY=SPEC",
        help="a tuned key: log:LO:HI, float:LO:HI, int:LO:HI, logint:LO:HI or choice:A,B,...; repeatable "
        "(replaces the config's tune.space)",
    )
    p.add_argument("--trials", type=int, metavar="N", help="number of trials (default tune.trials)")
    p.add_argument("--metric", metavar="M", help="validation metric to optimise, e.g. validation_auroc")
    p.add_argument("--pruner", metavar="P", help="median, halving or none (default tune.pruner)")
    p.add_argument("--sampler", metavar="S", help="tpe or random (default tune.sampler)")
    p.add_argument("--jobs", type=int, metavar="J", help="trials in parallel (worker processes; default tune.jobs)")
    p.add_argument("--out", metavar="DIR", help="the study folder (default: output.dir or runs/<config name>, /tune)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume", action="store_true", help="continue the study in --out (a killed tune loses no trial)"
    )
    mode.add_argument("--overwrite", action="store_true", help="replace a study already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--no-plots",
        action="store_true",
        help="skip history.png (drawing it, importing matplotlib included, is most of the tuner's own time)",
    )
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "report",
        help="tables and plots over run directories",
        description="Group runs by config (minus seed): Markdown table (mean ± std) and comparison plots.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or folders holding them (e.g. a sweep)")
    p.add_argument("--out", metavar="DIR", help="where report.md and the plots go (default: the directory given)")
    p.add_argument("--metrics", metavar="M1,M2", help="metrics to tabulate and plot (default: all)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="BUDGET=LIMIT",
        help="also compare at an equal budget: each metric at the last evaluation within it; BUDGET is bytes, "
        "steps (per client), samples, rounds or seconds, e.g. --at bytes=2e6; repeatable",
    )
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="rounds and MB each run needed to reach a value, e.g. --target validation_auroc=0.9; repeatable",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "evaluate",
        help="score a finished run's saved model on a split or other data, or personalise new clients",
        description="Score the model of a finished run's validation-selected round (selected.pt), or its final "
        "model, on the test or validation split of its own data or of another config's [data]; with "
        "--new-clients, personal models and metrics of clients that did not train, from the run's checkpoint.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="a finished run directory")
    p.add_argument("--split", default="test", choices=("test", "validation"), help="which split (default: test)")
    p.add_argument("--config", metavar="OTHER", help="evaluate on the [data] of this config instead of the run's")
    p.add_argument(
        "--model", default="selected", choices=("selected", "final"), help="the selected model (default) or the last"
    )
    p.add_argument("--metrics", metavar="M1,M2", help="metrics (default: the run's)")
    p.add_argument("--new-clients", metavar="CONFIG", help="a config whose [data] gives the new clients")
    p.add_argument("--epochs", type=int, metavar="E", help="PERM: epochs of a new model's visits (default: the run's)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="R",
        help="other methods: rounds of their client update (APPLE: of its DR vector)",
    )
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "list",
        help="algorithms, datasets, partitioners, models, aggregators, ...",
        description="List the registered components; with KIND NAME, show its config keys.",
    )
    p.add_argument("kind", nargs="?", metavar="KIND", help=", ".join(KINDS))
    p.add_argument("name", nargs="?", metavar="NAME", help="show the config keys of one component")
    p.set_defaults(func=cmd_list)

    from fedrisk.deploy.cli import add_parser as add_deploy  # stdlib only: no torch, no flwr

    add_deploy(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 failed runs in a sweep, 2 user
    error, 130 / 143 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error
        return int(exc.code or 0)
    try:
        return int(args.func(args))
    except FedriskError as exc:
        for problem in getattr(exc, "problems", None) or [str(exc)]:  # a config: one line per problem
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted (no new checkpoint written; the last periodic one can be resumed)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `fedrisk list | head`
        return 0
    except Exception as exc:
        if not _interrupted(exc):
            raise
        print(str(exc), file=sys.stderr)
        return int(exc.exit_code)  # type: ignore[attr-defined]


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a run or sweep stopped by a signal (``RunInterrupted`` /
    ``SweepInterrupted``), without importing the runner (which imports torch) for commands
    that never load it: ``--help``, ``list`` and config errors answer in a fraction of a second."""
    runner = sys.modules.get("fedrisk.experiment.runner")
    sweep = sys.modules.get("fedrisk.experiment.sweep")
    kinds = tuple(c for c in (getattr(runner, "RunInterrupted", None), getattr(sweep, "SweepInterrupted", None)) if c)
    return bool(kinds) and isinstance(exc, kinds)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
