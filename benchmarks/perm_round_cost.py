"""Wall-clock time per communication round: PERM vs FedAvg and the personalised baselines
(paper 003, Fig. 3 analogue: K = 20 local steps per round).

PERM's rounds are of two kinds: N shuffle rounds (every client runs K steps on the model it
hosts) and one weight-estimation round per epoch (full local gradients at w, the N x N distance
matrix and the closed-form weights, one global step).  The table shows both and their average
over an epoch.  Methods are timed in turns (round-robin), so that load changes on a shared
machine hit them alike; the median over rounds is reported.

    python benchmarks/perm_round_cost.py                 # synthetic two clusters, 50 clients, logistic regression
    python benchmarks/perm_round_cost.py --executor vectorized
    python benchmarks/perm_round_cost.py --methods perm --epochs 1   # PERM vs FedAvg only
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrisk.algorithms import ALGORITHMS
from fedrisk.data.sources.synthetic import perm_two_cluster_federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation

METHODS = {
    "fedavg": {},
    "perm": {"lam": 10.0, "global_batch": 64},
    "fedavg_ft": {"finetune_steps": 20},
    "perfedavg": {"inner_lr": 0.5},
    "pfedme": {"inner_steps": 5},
    "ditto": {"personal_steps": 20},
    "apfl": {"mix_lr": 0.1},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=2, help="PERM epochs timed (N + 1 rounds each)")
    ap.add_argument("--executor", default="sequential")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset (fedavg is always timed)")
    args = ap.parse_args()
    chosen = {"fedavg", *args.methods.split(",")}
    torch.set_num_threads(1)
    N = args.clients
    fed = perm_two_cluster_federation(N, samples_per_client=400, dim=60, test_per_client=0, seed=0)
    model = FunctionalModel(build_model("logreg", (60,), 2, bias=False))
    sims = {}
    for name, extra in METHODS.items():
        if name not in chosen:
            continue
        alg = ALGORITHMS.get(name)(model=model, loss=cross_entropy, lr=0.5, local_steps=20, batch_size=32, **extra)
        sims[name] = Simulation(alg, fed, seed=0, executor=args.executor)
    times: dict[str, list[tuple[str, float]]] = {n: [] for n in sims}
    for _ in range(args.epochs * (N + 1)):
        for name, sim in sims.items():
            t = time.perf_counter()
            kind = sim.step().kind
            times[name].append((kind, time.perf_counter() - t))
    base = statistics.median(t for _, t in times["fedavg"])
    print("| method | median s / round | vs FedAvg | PERM estimate round | PERM mean over an epoch |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in times.items():
        med = statistics.median(t for k, t in rows if k in ("train", "shuffle"))
        extra = ["", ""]
        if name == "perm":
            est = statistics.median(t for k, t in rows if k == "estimate")
            extra = [f"{est:.4f}", f"{sum(t for _, t in rows) / len(rows):.4f}"]
        print(f"| {name} | {med:.4f} | {med / base:.2f} | {extra[0]} | {extra[1]} |")


if __name__ == "__main__":
    main()
