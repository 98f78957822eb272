"""The cost of ``fedrisk tune`` beyond its trials, and what ``--jobs 2`` buys (issue 24).

Overhead: one 16-trial study (median pruner, TPE, journal storage, ``history.png``) of a
config.  Two readings of "beyond the trials":

- **beyond the rounds** (the strict one): the study's wall time minus the time its trials
  spend in their rounds (training and evaluation: each trial's last ``wall_time`` in
  ``metrics.jsonl``).  Everything else is the tuner's: proposals, Optuna's storage, the pruning
  checks, each trial's set-up (config, data, model, run directory) and the outputs.
- **beyond the runs**: minus each trial's whole ``run_experiment`` call (set-up included), as
  the tuner records it in the trial's ``seconds``.

Target: <= 5 % of the study's wall time.

Jobs (``--jobs``): the same 16 trials with ``--jobs 1`` and ``--jobs 2`` (``run.threads = 1``),
trials per hour of each; target: jobs 2 >= 1.6x jobs 1 on 2 cores.  A 1-trial study first pays
the process's one-time imports, so neither is charged for them.  Both studies use the random
sampler with the same seed and no pruner, so they run the same proposals with the same work
(a pruned trial's cost depends on which trials finished before it, which parallel trials
change).  Only meaningful with two otherwise idle cores.

    .venv/bin/python benchmarks/tune_overhead.py                      # overhead, the demo's FedAvg trials
    .venv/bin/python benchmarks/tune_overhead.py --config fedxl       # FeDXL2 on the FeDXL pAUC config
    .venv/bin/python benchmarks/tune_overhead.py --config small --rounds 30   # tiny trials (worst case)
    .venv/bin/python benchmarks/tune_overhead.py --jobs               # jobs 1 vs jobs 2
    .venv/bin/python benchmarks/tune_overhead.py --startup            # forked vs fresh workers
    .venv/bin/python benchmarks/tune_overhead.py --profile            # where the tuner's time goes
    .venv/bin/python benchmarks/tune_overhead.py --no-plot            # overhead without history.png

Profile (``--profile``): the same study under cProfile, and the cumulative seconds of the
tuner's parts (creating the study, each Optuna call summed over the trials, the outputs and
the plot) beside the trials' ``run_experiment`` calls.  cProfile slows Python code, so read
the parts as shares, and the plain run's numbers as the overhead.

Start-up (``--startup``): how long after the tune starts its two workers begin their first
trials, forked from the tuner (the default with one thread per trial) or started as fresh
interpreters (the path for several threads per trial, forced here), twice each.  Independent
of how busy the machine is in kind, though not in size.

Results (2-core machine shared with other jobs, load average given): in benchmarks/RESULTS.md#tuning-overhead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

from fedrisk.experiment.config import load_config, resolve_config
from fedrisk.experiment.tune import run_tune, tune_spec

ROOT = Path(__file__).resolve().parents[1]
HAVE_FMNIST = any(Path("/usr/share/datasets/fashion-mnist").glob("train-images*"))


def config(name: str, rounds: int | None):
    """``small``: an MLP on breast cancer (trials of a fraction of a second); ``quickstart``: the
    demo's FedAvg variant (configs/quickstart.toml, 16 local steps; digits when Fashion-MNIST is
    absent); ``fedxl``: the FeDXL2 variant of configs/fedxl/fmnist_pauc.toml with a validation
    split (the acceptance demo's studies)."""
    if name == "quickstart":
        over = ["algorithm.local_steps=16", f"run.rounds={rounds or 16}"]
        if not HAVE_FMNIST:
            over.append('data.dataset="digits"')
        return load_config(ROOT / "configs" / "quickstart.toml", over)
    if name == "fedxl":
        over = [
            "data.validation_fraction=0.2",
            'algorithm.xrisk="pauc"',
            "algorithm.local_steps=32",
            "algorithm.batch_pos=16",
            "algorithm.batch_neg=16",
            "algorithm.beta=0.1",
            'tune.space={"algorithm.lr" = "log:0.01:2", "algorithm.beta" = "log:0.01:1"}',
            'tune.keys=["algorithm.lr", "algorithm.beta"]',
        ]
        if rounds:
            over.append(f"run.rounds={rounds}")
        return load_config(ROOT / "configs" / "fedxl" / "fmnist_pauc.toml", over)
    rounds = rounds or 30
    return resolve_config(
        {
            "data": {
                "dataset": "breast_cancer",
                "num_clients": 4,
                "partition": "dirichlet",
                "validation_fraction": 0.25,
            },
            "model": {"name": "mlp", "hidden": [32]},
            "objective": {"name": "binary_cross_entropy"},
            "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 8},
            "run": {
                "rounds": rounds,
                "eval_every": max(1, rounds // 10),
                "splits": ["test", "validation"],
                "metrics": ["auroc"],
                "threads": 1,
            },
            "tune": {
                "space": {"algorithm.lr": "log:1e-3:1", "algorithm.local_steps": "int:1:16"},
                "metric": "validation_auroc",
            },
        }
    )


def rounds_seconds(out: str, trial) -> float:
    """The seconds a trial spent in its rounds (training and evaluation, up to its last evaluation)."""
    path = Path(out) / trial.user_attrs["run_dir"] / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1])["wall_time"] if lines else 0.0


def study(cfg, trials: int, jobs: int, plots: bool = True, **kw) -> dict[str, float]:
    spec = tune_spec(cfg, trials=trials, metric=cfg["tune.metric"], jobs=jobs, **kw)
    out = tempfile.mkdtemp(prefix="tune_bench_")
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_tune(cfg, out, spec, plots=plots)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    states = [t.state.name for t in result.trials]
    return {
        "wall": wall,
        "cpu": cpu,
        "rounds_wall": sum(rounds_seconds(out, t) for t in result.trials),
        "trials_wall": sum(t.user_attrs.get("seconds", 0.0) for t in result.trials),
        "trials_cpu": sum(t.user_attrs.get("cpu_seconds", 0.0) for t in result.trials),
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "trials_per_hour": len(states) / wall * 3600,
    }


PARTS = [  # (label, file suffix, function name): cumulative time in cProfile's stats
    ("the trials' run_experiment", "experiment/runner.py", "run_experiment"),
    ("prepare_study (import Optuna, create the study)", "experiment/tune.py", "prepare_study"),
    ("run_trial (a trial and its Optuna calls)", "experiment/tune.py", "run_trial"),
    ("  Study.ask (the sampler's proposal)", "optuna/study/study.py", "ask"),
    ("  Study.tell", "optuna/study/study.py", "tell"),
    ("  Study.get_trials", "optuna/study/study.py", "get_trials"),
    ("  Trial.report", "optuna/trial/_trial.py", "report"),
    ("  Trial.should_prune", "optuna/trial/_trial.py", "should_prune"),
    ("  Trial.set_user_attr", "optuna/trial/_trial.py", "set_user_attr"),
    ("  Trial.suggest_float", "optuna/trial/_trial.py", "suggest_float"),
    ("write_outputs (trials.md, best.toml, history.png)", "experiment/tune_outputs.py", "write_outputs"),
    ("  plot_history (with importing matplotlib)", "experiment/tune_outputs.py", "plot_history"),
]


def profile(cfg, trials: int) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    wall = time.perf_counter()
    prof.enable()
    study(cfg, trials, 1)
    prof.disable()
    wall = time.perf_counter() - wall
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    print(f"study under cProfile: {wall:.2f} s wall; cumulative seconds of its parts:")
    for label, suffix, name in PARTS:
        hits = [(v[1], v[3]) for (f, _, n), v in stats.items() if n == name and f.endswith(suffix)]
        calls, cum = sum(c for c, _ in hits), sum(t for _, t in hits)
        print(f"  {label:<52} {cum:7.3f} s  ({calls} calls)")


def startup(cfg) -> None:
    import fedrisk.experiment.tune_workers as workers

    forks = workers.forks
    study(cfg, 1, 1)  # the process's one-time imports
    try:
        for mode in ("forked", "fresh", "forked", "fresh"):
            workers.forks = forks if mode == "forked" else (lambda base, spec: False)
            spec = tune_spec(cfg, trials=2, metric=cfg["tune.metric"], jobs=2, sampler="random", pruner="none")
            t0, wall = datetime.datetime.now(), time.perf_counter()
            result = run_tune(cfg, tempfile.mkdtemp(prefix="tune_bench_"), spec, plots=False)
            wall = time.perf_counter() - wall
            starts = sorted((t.datetime_start - t0).total_seconds() for t in result.trials)
            shown = ", ".join(f"{s:.2f}" for s in starts)
            print(f"{mode} workers: first trials start {shown} s after the tune starts; 2-trial study {wall:.2f} s")
    finally:
        workers.forks = forks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("quickstart", "small", "fedxl"), default="quickstart")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--jobs", action="store_true", help="compare --jobs 1 and --jobs 2 instead")
    p.add_argument("--startup", action="store_true", help="time forked against fresh workers instead")
    p.add_argument("--profile", action="store_true", help="the study under cProfile: the tuner's parts")
    p.add_argument("--no-plot", action="store_true", help="without history.png (to see the plot's share)")
    args = p.parse_args()
    cfg = config(args.config, args.rounds)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores; {args.config}, {cfg['run.rounds']} rounds")
    if args.profile:
        profile(cfg, args.trials)
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        return
    if args.startup:
        startup(cfg)
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        return
    if args.jobs:
        same = {"sampler": "random", "pruner": "none"}
        study(cfg, 1, 1, **same)  # imports (Optuna's storage, matplotlib) paid before either is timed
        one = study(cfg, args.trials, 1, **same)
        two = study(cfg, args.trials, 2, **same)
        for name, r in (("jobs 1", one), ("jobs 2", two)):
            print(f"{name}: {r['wall']:.1f} s wall, {r['trials_per_hour']:.0f} trials/hour")
        print(f"speed-up: {two['trials_per_hour'] / one['trials_per_hour']:.2f}x (target >= 1.6x)")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        return
    r = study(cfg, args.trials, 1, plots=not args.no_plot)
    what = f"{args.trials} trials" + (" without history.png" if args.no_plot else "")
    print(
        f"{what} ({r['complete']} complete, {r['pruned']} pruned): study {r['wall']:.2f} s wall / "
        f"{r['cpu']:.2f} s CPU; in the rounds {r['rounds_wall']:.2f} s; in the runs {r['trials_wall']:.2f} s wall / "
        f"{r['trials_cpu']:.2f} s CPU"
    )
    beyond_rounds = r["wall"] - r["rounds_wall"]
    beyond_runs = r["wall"] - r["trials_wall"]
    print(
        f"overhead beyond the rounds: {beyond_rounds:.2f} s = {100 * beyond_rounds / r['wall']:.1f} % of the study; "
        f"beyond the runs: {beyond_runs:.2f} s = {100 * beyond_runs / r['wall']:.1f} % wall, "
        f"{100 * (r['cpu'] - r['trials_cpu']) / r['cpu']:.1f} % CPU (target <= 5 %)"
    )
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
