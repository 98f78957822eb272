"""One rank of ``cuda_check.py``'s NCCL check: the distributed executor on the device.

    python -m torch.distributed.run --nnodes 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29611 \\
        benchmarks/_cuda_nccl_worker.py \\
        --out DIR --device cuda --backend nccl --rounds 4 --families fedavg perm

Builds each family's config of ``cuda_check.py`` with ``run.device`` and
``DistributedExecutor(backend=...)``, runs ``--rounds`` rounds and (rank 0) writes
``DIR/<family>.pt``: the final server and client states (CPU tensors) and the seconds per round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_check import config, final_state, sync

from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.distributed import DistributedExecutor


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--families", nargs="+", required=True)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for family in args.families:
        executor = DistributedExecutor(backend=args.backend)
        cfg = config(family, args.device, "distributed", "float32", args.rounds)
        sim = build_simulation(cfg, executor=executor).simulation
        times = []
        for _ in range(cfg["run.rounds"]):  # a family may fix its own number of rounds
            sync(args.device)
            start = time.perf_counter()
            sim.step()
            sync(args.device)
            times.append(time.perf_counter() - start)
        if executor.is_primary:
            torch.save({"state": final_state(sim), "times": times}, Path(args.out) / f"{family}.pt")
    executor.close()


if __name__ == "__main__":
    main()
