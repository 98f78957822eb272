"""Peak memory and seconds per round of FedAvg and SCAFFOLD (per-client control variates) with
many clients, client states in memory or on disk (``Simulation(client_store=...)``, the
experiment layer's ``run.client_states``).

Each (algorithm, clients, store) cell runs in its own process, so that its peak RSS is its own.
The peak is recorded after each phase (``VmHWM``: data built, simulation built, each round, one
checkpoint written with the experiment layer's format), next to the bytes of the client states
and of the data, and the process's RSS before anything was built (Python, torch).  Data:
Fashion-MNIST (Debian's dataset-fashion-mnist) split IID into N clients, or, with
``--data synthetic``, the same shapes drawn at random (784 features, 10 classes, 6 rows per
client). Model: MLP 784-64-10 (50,890 parameters, so one control variate takes 204 kB in
float32). ``--per-round`` clients take part in each round (0 = all).

    .venv/bin/python benchmarks/client_states.py --algorithms fedavg scaffold --clients 1000 \\
        --stores memory disk --rounds 3 --per-round 100 --json runs/client_states.json

A cell over 3 GB (10,000 SCAFFOLD clients in memory) must run alone on a shared machine, e.g.
under a machine-wide ``flock`` (see docs/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _timing import save_json  # this script's folder


def _hwm_mb() -> dict[str, float]:
    """Current and peak RSS of this process, in MB (Linux ``/proc/self/status``)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return {"rss_mb": out.get("VmRSS", 0.0), "peak_mb": out.get("VmHWM", 0.0)}


def one(clients: int, store: str, rounds: int, per_round: int, data: str, algorithm: str, executor: str) -> dict:
    import torch

    torch.set_num_threads(1)
    start_mb = _hwm_mb()["rss_mb"]

    from fedrisk.algorithms.fedavg import FedAvg
    from fedrisk.algorithms.scaffold import Scaffold
    from fedrisk.data import build_federation
    from fedrisk.data.federation import Federation, Samples
    from fedrisk.experiment.checkpoint import write_checkpoint
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.runtime.simulation import Simulation
    from fedrisk.tree import tree_nbytes

    base_mb = _hwm_mb()["rss_mb"]
    phases = {}
    if data == "fashion_mnist":
        fed = build_federation("fashion_mnist", "iid", clients, seed=0, dataset_options={"flatten": True})
    else:
        g = torch.Generator().manual_seed(0)
        parts = [
            Samples(torch.rand(6, 784, generator=g), torch.randint(0, 10, (6,), generator=g)) for _ in range(clients)
        ]
        fed = Federation("synthetic", parts, num_classes=10)
    data_bytes = sum(c.x.nbytes + c.y.nbytes for c in fed.clients)
    phases["data"] = _hwm_mb()
    model = FunctionalModel(build_model("mlp", (784,), 10, hidden=(64,)))
    per = per_round if per_round > 0 else clients
    cls = {"fedavg": FedAvg, "scaffold": Scaffold}[algorithm]
    alg = cls(model=model, loss=cross_entropy, lr=0.05, local_steps=2, batch_size=4, clients_per_round=per)
    folder = tempfile.mkdtemp(prefix="fedrisk-states-")
    states_dir = os.path.join(folder, "states") if store == "disk" else None
    sim = Simulation(alg, fed, seed=0, executor=executor, client_store=states_dir)
    states_bytes = clients * tree_nbytes(sim.client_states[0])
    phases["simulation"] = _hwm_mb()
    times = []
    for r in range(rounds):
        t = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - t)
        phases[f"round {r}"] = _hwm_mb()
    t = time.perf_counter()
    write_checkpoint(os.path.join(folder, "checkpoint.pt"), {"simulation": sim.state_dict()}, round=sim.round)
    checkpoint_s = time.perf_counter() - t
    phases["checkpoint"] = _hwm_mb()
    peak_mb = phases["checkpoint"]["peak_mb"]
    return {
        "algorithm": algorithm, "clients": clients, "store": store, "executor": executor, "data": data,
        "per_round": per, "rounds": rounds, "seconds_per_round": sum(times) / len(times),
        "checkpoint_seconds": checkpoint_s, "peak_rss_mb": peak_mb, "start_rss_mb": start_mb,
        "imports_rss_mb": base_mb, "states_mb": states_bytes / 2**20, "data_mb": data_bytes / 2**20,
        "peak_over_imports_per_states_plus_data": (peak_mb - base_mb) / max(1e-9, (states_bytes + data_bytes) / 2**20),
        "phases": phases,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", nargs="+", default=["fedavg", "scaffold"], choices=["fedavg", "scaffold"])
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--stores", nargs="+", default=["memory", "disk"], choices=["memory", "disk"])
    p.add_argument("--executor", default="vectorized", choices=["sequential", "vectorized"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-round", type=int, default=100, help="clients per round (0 = all)")
    p.add_argument("--data", default="fashion_mnist", choices=["fashion_mnist", "synthetic"])
    p.add_argument("--json")
    p.add_argument("--one", nargs=3, metavar=("ALGORITHM", "CLIENTS", "STORE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        alg, n, store = args.one
        row = one(int(n), store, args.rounds, args.per_round, args.data, alg, args.executor)
        print(json.dumps(row))
        return
    rows = []
    for alg in args.algorithms:
        for n in args.clients:
            for store in args.stores:
                cmd = [sys.executable, __file__, "--one", alg, str(n), store, "--rounds", str(args.rounds),
                       "--per-round", str(args.per_round), "--data", args.data,
                       "--executor", args.executor]  # fmt: skip
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{alg} {n} {store}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
                    continue
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                print(
                    f"{alg:<8} {n:>6} clients  {store:<6}  {r['seconds_per_round']:.2f} s/round  "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB (imports {r['imports_rss_mb']:.0f} MB, states "
                    f"{r['states_mb']:.0f} MB, data {r['data_mb']:.0f} MB)  checkpoint {r['checkpoint_seconds']:.2f} s",
                    flush=True,
                )
    if args.json:
        save_json(args.json, rows, indent=2)


if __name__ == "__main__":
    main()
