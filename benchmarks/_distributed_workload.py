"""One benchmark workload on fedrisk's distributed executor (run by ``simulation_speed.py``).

Started once per process by ``torchrun`` (``python -m torch.distributed.run``)::

    python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port 29611 benchmarks/_distributed_workload.py --workload H

Every rank builds the same federation and FedAvg as ``simulation_speed.py`` and runs
``Simulation(..., executor=DistributedExecutor(local=...))`` with one torch thread (unless
``--threads``); rank 0 prints ``RESULT {json}`` with the seconds of every round, the final test
accuracy and every rank's peak resident memory (``VmHWM``, MiB).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch
import torch.distributed as dist
from simulation_speed import WORKLOADS, accuracy, federation, make_algorithm, vm_hwm_mb

from fedrisk.runtime.distributed import DistributedExecutor
from fedrisk.runtime.simulation import Simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--local", default="sequential", choices=["sequential", "vectorized"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workload = WORKLOADS[args.workload]
    if args.rounds is not None:
        workload = replace(workload, rounds=args.rounds)
    fed = federation(workload)
    alg = make_algorithm(workload)
    executor = DistributedExecutor(local=args.local)
    sim = Simulation(alg, fed, seed=0, executor=executor)
    times = []
    for _ in range(workload.rounds):
        dist.barrier()  # every round starts together on every rank
        start = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        acc = accuracy(alg.predict(alg.global_params(sim.server_state), fed.test.x), fed.test.y)
    memory: list[float] = [0.0] * executor.world_size
    dist.all_gather_object(memory, vm_hwm_mb())
    if executor.is_primary:
        result = {"times": times, "accuracy": acc, "vm_hwm_mb": memory, "world_size": executor.world_size}
        print("RESULT " + json.dumps(result), flush=True)
    executor.close()


if __name__ == "__main__":
    main()
