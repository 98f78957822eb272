"""One FedAvg round of ResNet-18 (BatchNorm, running statistics averaged) on 28x28 inputs:
the sequential and vectorised executors against a hand-written ``torch.func.functional_call``
loop over the same clients, interleaved round by round in one process.

Workload (issue 30): 8 clients, one local SGD step on a batch of 32, ``resnet18`` with the CIFAR
stem on 1x28x28 inputs, 10 classes, float32.  The hand-written loop is what a user would write
without fedrisk: per client, ``functional_call(module, params | buffers, x)`` in ``train()``
mode (PyTorch's BatchNorm updates that client's copy of the running statistics in place),
``torch.autograd.grad``, ``p - lr * g``; then the sample-weighted mean of the parameters and
statistics.  It draws its minibatches from the same indices as fedrisk's FedAvg, so all three
compute the same round (their final parameters are compared).

Prints the median wall and process-CPU seconds per round (rounds after the warm-up), the
per-round ratios and ``uptime``'s load::

    nice -n 10 .venv/bin/python benchmarks/resnet18_round.py --threads 2 --rounds 3
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation, fed_info

CLIENTS, ROWS, BATCH, LR, SEED = 8, 64, 32, 0.01, 0


def federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = [
        Samples(torch.randn(ROWS, 1, 28, 28, generator=g), torch.randint(0, 10, (ROWS,), generator=g))
        for _ in range(CLIENTS)
    ]
    return Federation("r18", clients, 10)


class HandLoop:
    """The hand-written functional_call loop (see the module docstring), one round per step()."""

    def __init__(self, module: torch.nn.Module, fed: Federation, alg: FedAvg, params: dict, stats: dict) -> None:
        self.module, self.fed, self.alg = module.train(), fed, alg
        self.params, self.stats = params, stats
        self.others = {k: v for k, v in module.named_buffers() if k not in stats}  # num_batches_tracked
        self.info = fed_info(fed)
        self.round = 0

    def step(self) -> None:
        sizes = [len(c) for c in self.fed.clients]
        ctx = RoundContext(self.round, self.info)
        new_params, new_stats = [], []
        for k, client in enumerate(self.fed.clients):
            idx = self.alg.draw(ctx, k, len(client), client_generator(SEED, self.round, k))["batches"][0]
            x, y = client.x[idx], client.y[idx]
            leaves = {n: p.detach().requires_grad_(True) for n, p in self.params.items()}
            stats = {n: s.clone() for n, s in self.stats.items()}  # updated in place by BatchNorm
            out = torch.func.functional_call(self.module, {**leaves, **stats, **self.others}, (x,))
            loss = torch.nn.functional.cross_entropy(out, y)
            grads = torch.autograd.grad(loss, list(leaves.values()))
            new_params.append({n: p - LR * g for (n, p), g in zip(leaves.items(), grads)})
            new_stats.append(stats)
        w = [s / sum(sizes) for s in sizes]
        self.params = {n: sum(wk * p[n].detach() for wk, p in zip(w, new_params)) for n in self.params}
        self.stats = {n: sum(wk * s[n] for wk, s in zip(w, new_stats)) for n in self.stats}
        self.round += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up round)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    fed = federation()
    module = build_model("resnet18", (1, 28, 28), 10)
    model = FunctionalModel(module)
    alg = FedAvg(model=model, loss=cross_entropy, lr=LR, local_steps=1, batch_size=BATCH)
    init = model.init_params(SEED)
    stats = model.init_stats()
    runs = {
        "sequential": Simulation(alg, fed, seed=SEED, executor="sequential", init_params={**init, **stats}),
        "vectorized": Simulation(alg, fed, seed=SEED, executor="vectorized", init_params={**init, **stats}),
        "hand loop": HandLoop(copy.deepcopy(module), fed, alg, dict(init), dict(stats)),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in runs}
    for i in range(1 + args.rounds):
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run.step()
            if i > 0:
                times[name]["wall"].append(time.perf_counter() - wall)
                times[name]["cpu"].append(time.process_time() - cpu)
    print(
        f"ResNet-18 ({model.num_params():,} parameters), {CLIENTS} clients x 1 step x batch {BATCH}, 1x28x28, "
        f"float32, {args.threads} threads, CPU, {args.rounds} timed rounds"
    )
    print(f"load average before / after: {LOAD0} / {os.getloadavg()}")
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    for name, m in med.items():
        print(f"  {name:11s} wall {m['wall']:7.3f} s   cpu {m['cpu']:7.3f} s")
    for k in ("wall", "cpu"):
        seq = [v / s for v, s in zip(times["vectorized"][k], times["sequential"][k])]
        hand = [v / h for v, h in zip(times["vectorized"][k], times["hand loop"][k])]
        print(
            f"  {k}: vectorized / sequential {statistics.median(seq):.3f}, vectorized / hand loop "
            f"{statistics.median(hand):.3f}, sequential / hand loop "
            f"{statistics.median([s / h for s, h in zip(times['sequential'][k], times['hand loop'][k])]):.3f}"
        )
    ref = runs["hand loop"].params
    for name in ("sequential", "vectorized"):
        got = runs[name].server_state["params"]
        diff = max(float((got[n] - ref[n]).abs().max()) for n in ref)
        sdiff = max(
            float((runs[name].server_state["norm_stats"][n] - v).abs().max())
            for n, v in runs["hand loop"].stats.items()
        )
        print(
            f"  {name}: largest difference from the hand loop after {1 + args.rounds} rounds: parameters {diff:.2e}, "
            f"running statistics {sdiff:.2e}"
        )


LOAD0 = os.getloadavg()

if __name__ == "__main__":
    main()
