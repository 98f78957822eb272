"""Peak memory and seconds per round of SCAFFOLD (per-client control variates) with many
clients, client states in memory or on disk (``Simulation(client_store=...)``).

Each (clients, store) cell runs in its own process, so that its peak RSS (``ru_maxrss``) is its
own. Data: Fashion-MNIST (Debian's dataset-fashion-mnist) split IID into N clients, or, with
``--data synthetic``, the same shapes drawn at random (784 features, 10 classes, 6 rows per
client). Model: MLP 784-64-10 (50,890 parameters, so one control variate takes 204 kB in
float32). ``clients_per_round`` clients take part in each round.

    .venv/bin/python benchmarks/client_states.py --clients 1000 10000 --stores memory disk \\
        --rounds 3 --per-round 100 --json runs/client_states.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def one(clients: int, store: str, rounds: int, per_round: int, data: str) -> dict:
    import torch

    from fedrisk.algorithms.scaffold import Scaffold
    from fedrisk.data import build_federation
    from fedrisk.data.federation import Federation, Samples
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.runtime.simulation import Simulation

    torch.set_num_threads(1)
    if data == "fashion_mnist":
        fed = build_federation("fashion_mnist", "iid", clients, seed=0, dataset_options={"flatten": True})
    else:
        g = torch.Generator().manual_seed(0)
        parts = [
            Samples(torch.rand(6, 784, generator=g), torch.randint(0, 10, (6,), generator=g)) for _ in range(clients)
        ]
        fed = Federation("synthetic", parts, num_classes=10)
    model = FunctionalModel(build_model("mlp", (784,), 10, hidden=(64,)))
    alg = Scaffold(model=model, loss=cross_entropy, lr=0.05, local_steps=2, batch_size=4, clients_per_round=per_round)
    folder = tempfile.mkdtemp(prefix="fedrisk-states-") if store == "disk" else None
    sim = Simulation(alg, fed, seed=0, client_store=folder)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"clients": clients, "store": store, "data": data, "per_round": per_round, "rounds": rounds,
            "seconds_per_round": sum(times) / len(times), "peak_rss_mb": peak_mb}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--stores", nargs="+", default=["memory", "disk"], choices=["memory", "disk"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--data", default="fashion_mnist", choices=["fashion_mnist", "synthetic"])
    p.add_argument("--json")
    p.add_argument("--one", nargs=2, metavar=("CLIENTS", "STORE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.rounds, args.per_round, args.data)))
        return
    rows = []
    for n in args.clients:
        for store in args.stores:
            cmd = [sys.executable, __file__, "--one", str(n), store, "--rounds", str(args.rounds),
                   "--per-round", str(args.per_round), "--data", args.data]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{n} {store}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(
                f"{n:>6} clients  {store:<6}  {r['seconds_per_round']:.2f} s/round  peak RSS {r['peak_rss_mb']:.0f} MB"
            )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
