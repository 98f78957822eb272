"""The cost of ``fedrisk tune`` beyond its trials, and what ``--jobs 2`` buys (issue 24).

Overhead: one 16-trial study (median pruner, TPE, SQLite storage) on a small config; the
tune's own cost is its wall (and process CPU) time minus the time spent inside the trials
(each trial's config resolution and ``run_experiment``, recorded by the tuner as the trial's
``seconds`` / ``cpu_seconds``): proposals, Optuna's storage, the pruning checks and the
outputs (trials.md, best.toml, history.png).  Target: <= 5 % of the study's wall time.

Jobs (``--jobs``): the same study with ``--jobs 1`` and ``--jobs 2`` (``run.threads = 1``),
trials per hour of each; target: jobs 2 >= 1.6x jobs 1 on 2 cores.  Only meaningful on an
otherwise idle machine.

    .venv/bin/python benchmarks/tune_overhead.py                      # overhead, the demo's FedAvg trials
    .venv/bin/python benchmarks/tune_overhead.py --config small --rounds 30   # tiny trials (worst case)
    .venv/bin/python benchmarks/tune_overhead.py --jobs               # jobs 1 vs jobs 2

Results (2-core machine shared with other jobs, load average given): in benchmarks/RESULTS.md#tuning-overhead.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from fedrisk.experiment.config import load_config, resolve_config
from fedrisk.experiment.tune import run_tune, tune_spec


def config(name: str, rounds: int):
    """``small``: an MLP on breast cancer (trials of a fraction of a second); ``quickstart``: the
    demo's FedAvg variant (configs/quickstart.toml; digits when Fashion-MNIST is absent)."""
    if name == "quickstart":
        over = ["algorithm.local_steps=16", f"run.rounds={rounds}"]
        if not any(Path("/usr/share/datasets/fashion-mnist").glob("train-images*")):
            over.append('data.dataset="digits"')
        return load_config(Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml", over)
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
            "tune": {"space": {"algorithm.lr": "log:1e-3:1", "algorithm.local_steps": "int:1:16"}},
        }
    )


def study(name: str, rounds: int, trials: int, jobs: int) -> dict[str, float]:
    cfg = config(name, rounds)
    spec = tune_spec(cfg, trials=trials, metric="validation_auroc", jobs=jobs)
    out = tempfile.mkdtemp(prefix="tune_bench_")
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_tune(cfg, out, spec)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    inside = sum(t.user_attrs.get("seconds", 0.0) for t in result.trials)
    inside_cpu = sum(t.user_attrs.get("cpu_seconds", 0.0) for t in result.trials)
    states = [t.state.name for t in result.trials]
    return {
        "wall": wall,
        "cpu": cpu,
        "trials_wall": inside,
        "trials_cpu": inside_cpu,
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "trials_per_hour": len(states) / wall * 3600,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("quickstart", "small"), default="quickstart")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--jobs", action="store_true", help="compare --jobs 1 and --jobs 2 instead")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    if args.jobs:
        one = study(args.config, args.rounds, args.trials, 1)
        two = study(args.config, args.rounds, args.trials, 2)
        for name, r in (("jobs 1", one), ("jobs 2", two)):
            print(f"{name}: {r['wall']:.1f} s wall, {r['trials_per_hour']:.0f} trials/hour")
        print(f"speed-up: {two['trials_per_hour'] / one['trials_per_hour']:.2f}x (target >= 1.6x)")
        return
    r = study(args.config, args.rounds, args.trials, 1)
    over_wall = r["wall"] - r["trials_wall"]
    over_cpu = r["cpu"] - r["trials_cpu"]
    print(
        f"{args.config}: {args.trials} trials ({r['complete']} complete, {r['pruned']} pruned), "
        f"{args.rounds} rounds each: "
        f"study {r['wall']:.2f} s wall / {r['cpu']:.2f} s CPU; inside the trials {r['trials_wall']:.2f} s wall / "
        f"{r['trials_cpu']:.2f} s CPU"
    )
    print(
        f"overhead: {over_wall:.2f} s wall = {100 * over_wall / r['wall']:.1f} % of the study; "
        f"{over_cpu:.2f} s CPU = {100 * over_cpu / r['cpu']:.1f} % (target <= 5 %)"
    )


if __name__ == "__main__":
    main()
