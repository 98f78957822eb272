"""Seconds per round of the records loopback (fedrisk.deploy.server.LoopbackExecutor: every payload
and reply encoded into Flower records, serialised to protobuf bytes and decoded) against the
sequential executor, on one thread.  No network and no Flower processes: this is the part of a
deployed round that fedrisk controls.

    .venv/bin/python benchmarks/deploy_loopback_speed.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from fedrisk.deploy.server import LoopbackExecutor
from fedrisk.experiment import resolve_config
from fedrisk.experiment.runner import build_simulation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = resolve_config(
        {
            "data": {"dataset": "digits", "num_clients": 3},
            "model": {"name": "mlp", "hidden": [64]},
            "algorithm": {"name": "scaffold", "local_steps": 5},
        }
    )
    for name, executor in (("sequential", None), ("loopback", LoopbackExecutor())):
        sim = build_simulation(cfg, 0, executor=executor).simulation
        sim.step()  # warm-up
        start = time.perf_counter()
        for _ in range(args.rounds):
            sim.step()
        print(f"{name:10s} {(time.perf_counter() - start) / args.rounds * 1000:.1f} ms/round")


if __name__ == "__main__":
    main()
