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
per-round ratios and ``uptime``'s load; ``--device cuda`` runs all three on a GPU (TF32 off)::

    nice -n 10 .venv/bin/python benchmarks/resnet18_round.py --threads 2 --rounds 3
    python benchmarks/resnet18_round.py --device cuda --rounds 10
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
            idx = idx.to(client.x.device)
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


def measure(device: str = "cpu", rounds: int = 3, threads: int = 2) -> dict:
    """Run the three variants for ``1 + rounds`` rounds on ``device`` (interleaved round by
    round); the per-round wall / process-CPU seconds (after the warm-up), their medians and the
    largest differences of the executors' parameters and running statistics from the hand loop
    (absolute, and relative to ``max(1, max |hand loop|)``) after the last round and, in
    ``differences_by_round``, after every round.  On this workload (random labels, BatchNorm,
    ReLU) float32 rounding differences grow about tenfold a round, on the CPU as on a GPU (the
    CPU's 2e-6 after two rounds, 2e-5 after three): the first round is the equivalence test."""
    torch.set_num_threads(threads)
    fed = federation()
    module = build_model("resnet18", (1, 28, 28), 10)
    model = FunctionalModel(module)
    alg = FedAvg(model=model, loss=cross_entropy, lr=LR, local_steps=1, batch_size=BATCH)
    init = model.init_params(SEED)
    stats = model.init_stats()
    on = torch.device(device)
    runs = {
        "sequential": Simulation(
            alg, fed, seed=SEED, executor="sequential", init_params={**init, **stats}, device=device
        ),
        "vectorized": Simulation(
            alg, fed, seed=SEED, executor="vectorized", init_params={**init, **stats}, device=device
        ),
        "hand loop": HandLoop(
            copy.deepcopy(module).to(on),
            fed.to(device=on),
            alg,
            {k: v.to(on) for k, v in init.items()},
            {k: v.to(on) for k, v in stats.items()},
        ),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in runs}
    by_round = []
    for i in range(1 + rounds):
        for name, run in runs.items():
            _sync(on)
            wall, cpu = time.perf_counter(), time.process_time()
            run.step()
            _sync(on)
            if i > 0:
                times[name]["wall"].append(time.perf_counter() - wall)
                times[name]["cpu"].append(time.process_time() - cpu)
        by_round.append(_differences(runs))
    return {
        "device": str(on),
        "num_params": model.num_params(),
        "rounds": rounds,
        "threads": threads,
        "times": times,
        "median_wall": {n: statistics.median(t["wall"]) for n, t in times.items()},
        "median_cpu": {n: statistics.median(t["cpu"]) for n, t in times.items()},
        "differences": by_round[-1],
        "differences_by_round": by_round,
    }


def _differences(runs: dict) -> dict[str, dict[str, float]]:
    """The executors' largest differences from the hand loop (absolute, and relative to
    ``max(1, max |hand loop|)`` per tensor), parameters and running statistics."""
    ref, ref_stats = runs["hand loop"].params, runs["hand loop"].stats
    out = {}
    for name in ("sequential", "vectorized"):
        got = runs[name].server_state
        d = [(float((got["params"][n] - r).abs().max()), float(r.abs().max())) for n, r in ref.items()]
        s = [(float((got["norm_stats"][n] - r).abs().max()), float(r.abs().max())) for n, r in ref_stats.items()]
        out[name] = {
            "params_abs": max(a for a, _ in d),
            "params_rel": max(a / max(1.0, m) for a, m in d),
            "stats_abs": max(a for a, _ in s),
            "stats_rel": max(a / max(1.0, m) for a, m in s),
        }
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up round)")
    p.add_argument("--device", default="cpu", help='"cpu", "cuda" or "cuda:N" (TF32 is switched off on CUDA)')
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = measure(args.device, args.rounds, args.threads)
    times = res["times"]
    print(
        f"ResNet-18 ({res['num_params']:,} parameters), {CLIENTS} clients x 1 step x batch {BATCH}, 1x28x28, "
        f"float32, {args.threads} threads, device {res['device']}, {args.rounds} timed rounds"
    )
    print(f"load average before / after: {LOAD0} / {os.getloadavg()}")
    for name in times:
        print(f"  {name:11s} wall {res['median_wall'][name]:7.3f} s   cpu {res['median_cpu'][name]:7.3f} s")
    for k in ("wall", "cpu"):
        seq = [v / s for v, s in zip(times["vectorized"][k], times["sequential"][k])]
        hand = [v / h for v, h in zip(times["vectorized"][k], times["hand loop"][k])]
        print(
            f"  {k}: vectorized / sequential {statistics.median(seq):.3f}, vectorized / hand loop "
            f"{statistics.median(hand):.3f}, sequential / hand loop "
            f"{statistics.median([s / h for s, h in zip(times['sequential'][k], times['hand loop'][k])]):.3f}"
        )
    growth = [f"{max(d['params_abs'] for d in r.values()):.1e}" for r in res["differences_by_round"]]
    print(f"  largest parameter difference from the hand loop after each round: {', '.join(growth)}")
    for name, d in res["differences"].items():
        print(
            f"  {name}: largest difference from the hand loop after {1 + args.rounds} rounds: parameters "
            f"{d['params_abs']:.2e}, running statistics {d['stats_abs']:.2e}"
        )


LOAD0 = os.getloadavg()

if __name__ == "__main__":
    main()
