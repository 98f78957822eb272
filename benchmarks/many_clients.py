"""Seconds per FedAvg round with 10,000 clients under the vectorised executor.

The set-up of issue 15: Fashion-MNIST (Debian's dataset-fashion-mnist) split IID into 10,000
clients of 6 training rows, MLP 784-64-10 (50,890 parameters), FedAvg with 5 local steps of 4
rows (``sampling = "with_replacement"``, lr 0.05), every client in every round, executor
``vectorized`` with its automatic block size (``--block-size`` fixes one), float32, one torch
thread.  Prints, per round, the wall-clock and process CPU seconds, then the block size used,
the peak resident memory (``ru_maxrss``) and a checksum of the final global model (to compare
two versions of fedrisk: the same draws give the same model up to float rounding).

To time another version of fedrisk with this script, put its ``src`` first on the path::

    nice -n 10 .venv/bin/python benchmarks/many_clients.py --rounds 3
    nice -n 10 .venv/bin/python benchmarks/many_clients.py --rounds 3 --fast-paths-off fused   # vmap instead
    PYTHONPATH=<checkout of another commit>/src .venv/bin/python benchmarks/many_clients.py --rounds 3

(the first round pays vmap's one-off lazy import; the report's median is over rounds 2..R).
It peaks at about 2.8 GB of memory (4.8 GB before the preallocated reply stack;
``benchmarks/RESULTS.md``, "10,000 clients"): on a shared machine run one such job at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import time

from _timing import save_json  # this script's folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block-size", type=int, default=None, help="clients per vmapped block (default: automatic)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the result to this file")
    p.add_argument(
        "--fast-paths-off",
        nargs="*",
        default=[],
        metavar="NAME",
        help="fast paths to switch off (fedrisk.algorithms.local.FastPaths: fused, gather, in_place)",
    )
    args = p.parse_args()

    import torch

    import fedrisk
    from fedrisk.algorithms.base import RoundContext
    from fedrisk.algorithms.fedavg import FedAvg
    from fedrisk.data import build_federation
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.runtime.simulation import Simulation
    from fedrisk.runtime.vectorized import VectorizedExecutor

    torch.set_num_threads(args.threads)
    fed = build_federation("fashion_mnist", "iid", args.clients, seed=0, dataset_options={"flatten": True})
    model = FunctionalModel(build_model("mlp", (784,), 10, hidden=(64,)))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.05, local_steps=5, batch_size=4)
    executor = VectorizedExecutor(block_size=args.block_size)
    sim = Simulation(alg, fed, seed=0, executor=executor)
    switches = contextlib.nullcontext
    if args.fast_paths_off:
        from fedrisk.algorithms.local import fast_paths

        off = dict.fromkeys(args.fast_paths_off, False)
        switches = lambda: fast_paths(**off)  # noqa: E731
    wall, cpu = [], []
    for _ in range(args.rounds):
        w, c = time.perf_counter(), time.process_time()
        with switches():
            sim.step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
        print(f"round {len(wall)}: {wall[-1]:.2f} s wall, {cpu[-1]:.2f} s CPU", flush=True)
    params = sim.server_state["params"]
    plan = alg.configure(RoundContext(0, sim.info), sim.server_state, torch.Generator())
    block = executor.block_size_for(plan, sim.client_states, sim.data)
    result = {
        "fedrisk": os.path.dirname(fedrisk.__file__),
        "clients": args.clients,
        "rounds": args.rounds,
        "block_size": block,
        "wall_s": wall,
        "cpu_s": cpu,
        "median_wall_s": statistics.median(wall[1:] or wall),
        "median_cpu_s": statistics.median(cpu[1:] or cpu),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "checksum": float(sum(v.double().abs().sum() for v in params.values())),
        "load_average": os.getloadavg(),
        "fast_paths_off": args.fast_paths_off,
    }
    print(json.dumps(result))
    if args.json:
        save_json(args.json, result)


if __name__ == "__main__":
    main()
