"""Seconds per round of the distributed executor (not a test; run by hand).

    # 1 and 2 processes (every process uses one torch thread: torch.set_num_threads(1))
    python -m torch.distributed.run --nnodes 1 --nproc-per-node 1 --master-addr 127.0.0.1 \\
        --master-port 29600 tests/runtime/distributed_bench.py w1
    python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port 29600 tests/runtime/distributed_bench.py w1
    # the same workload without torch.distributed, for the executor's own overhead
    python tests/runtime/distributed_bench.py w1 --executor sequential

Workloads (scikit-learn digits standardised, 100 IID clients, FedAvg with every client every
round, lr 0.05, batch 16 with replacement, float32, seed 0):

* ``w1``: MLP 64-128-10, 10 local SGD steps, 20 rounds (the W1 of shared/anchors/simulation_speed.md);
* ``heavy``: MLP 64-512-512-10, 40 local steps, 6 rounds (compute-bound clients).

Rank 0 prints one JSON line: the median wall seconds per round over rounds 2..R, the mean,
every rank's median CPU seconds per round (``time.process_time``: on a machine shared with
other jobs the wall time of 2 processes suffers most, while the CPU time shows how the work
splits), the final test accuracy, and the world size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.distributed import DistributedExecutor
from fedrisk.runtime.evaluation import score_split
from fedrisk.runtime.simulation import Simulation

WORKLOADS = {
    "w1": {"hidden": [128], "local_steps": 10, "rounds": 20},
    "heavy": {"hidden": [512, 512], "local_steps": 40, "rounds": 6},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--executor", default="distributed")
    parser.add_argument("--local", default="sequential", help="the distributed executor's local executor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    w = WORKLOADS[args.workload]
    cfg = resolve_config(
        {
            "data": {
                "dataset": "digits",
                "num_clients": 100,
                "partition": "iid",
                "dataset_options": {"scale": "standardize"},
            },
            "model": {"name": "mlp", "hidden": w["hidden"]},
            "algorithm": {"name": "fedavg", "lr": 0.05, "local_steps": w["local_steps"], "batch_size": 16},
            "run": {"rounds": w["rounds"], "seed": 0, "executor": "sequential"},
        }
    )
    base = build_simulation(cfg).simulation
    executor = DistributedExecutor(local=args.local) if args.executor == "distributed" else args.executor
    sim = Simulation(base.algorithm, base.federation, seed=0, executor=executor)
    times, cpu = [], []
    for _ in range(w["rounds"]):
        start, start_cpu = time.perf_counter(), time.process_time()
        sim.step()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    cpu_per_rank = [statistics.median(cpu[1:])]
    if isinstance(sim.executor, DistributedExecutor):  # every rank's CPU seconds per round
        cpu_per_rank = [None] * sim.executor.world_size
        torch.distributed.all_gather_object(cpu_per_rank, statistics.median(cpu[1:]))
    params = sim.algorithm.global_params(sim.server_state)
    accuracy = score_split(sim.algorithm, params, sim.federation.test, ["accuracy"])
    if sim.executor.is_primary:
        world = getattr(sim.executor, "world_size", 1)
        row = {
            "workload": args.workload,
            "executor": args.executor,
            "local": args.local if args.executor == "distributed" else None,
            "world_size": world,
            "median_s_per_round": round(statistics.median(times[1:]), 4),
            "mean_s_per_round": round(statistics.mean(times[1:]), 4),
            "cpu_s_per_round_per_rank": [round(c, 4) for c in cpu_per_rank],
            "test_accuracy": round(accuracy["accuracy"], 4),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
