"""Simulation speed: seconds per FedAvg round of fedrisk's executors against plain PyTorch.

Workloads (both FedAvg with plain averaging, SGD with lr 0.05 on minibatches of 16 rows drawn
with replacement, every client in every round; digits standardised with the training split's
mean / std after an 80/20 stratified split with seed 0):

* ``W1``: 100 IID clients (14-15 rows each), MLP 64-128-10, 10 local steps, 20 rounds.
* ``W2``: 1000 clients of 32 rows each drawn with replacement from the training split,
  logistic regression 64-10, 5 local steps, 10 rounds.

Runners:

* ``sequential`` / ``vectorized``: :class:`fedrisk.runtime.simulation.Simulation` with that
  executor (float32).
* ``plain``: a hand-written PyTorch loop: one ``nn.Module``, per client ``load_state_dict`` of the
  global weights, ``torch.optim.SGD``, the local steps, and a running weighted average.  It uses
  fedrisk's minibatch draws, so its model equals fedrisk's up to float rounding.
* ``floor``: the compute floor: the whole round as one ``torch.func.vmap`` over pre-stacked,
  padded client data with minibatch indices drawn in one batched call (no per-client Python,
  no framework bookkeeping).  Its draws differ from the others', so only its speed compares.

Each runner reports the median and the minimum seconds per round after a warm-up round (the
minimum is the better estimate on a machine shared with other work), the total (including the
first round, which for vmap pays a one-off lazy import of part of torch, about 2 s), and the
test accuracy of the final global model.  The number of torch threads is set once for the whole
process (``--threads``, default 1).

Usage::

    .venv/bin/python benchmarks/simulation_speed.py                     # W1 and W2, every runner
    .venv/bin/python benchmarks/simulation_speed.py --workload W2 --runner sequential vectorized
    .venv/bin/python benchmarks/simulation_speed.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor, nn

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local import sample_batches
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.partition import iid
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator, generator
from fedrisk.runtime.simulation import Simulation

RUNNERS = ("sequential", "vectorized", "plain", "floor")


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    hidden: tuple[int, ...]
    local_steps: int
    rounds: int
    batch_size: int = 16
    lr: float = 0.05


WORKLOADS = {
    "W1": Workload("W1", "mlp", (128,), local_steps=10, rounds=20),
    "W2": Workload("W2", "logreg", (), local_steps=5, rounds=10),
}


def digits_split() -> tuple[Samples, Samples]:
    """sklearn digits, 80/20 stratified split (seed 0), standardised with the train statistics."""
    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=0)
    mean, std = x_tr.mean(0), x_tr.std(0)
    std[std == 0] = 1.0

    def samples(a: np.ndarray, b: np.ndarray) -> Samples:
        return Samples(torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b, dtype=torch.long))

    return samples(x_tr, y_tr), samples(x_te, y_te)


def federation(workload: Workload) -> Federation:
    train, test = digits_split()
    if workload.name == "W1":
        parts = iid(train.y.numpy(), 100, seed=0)
        clients = [train.subset(p) for p in parts]
    else:
        g = torch.Generator().manual_seed(0)
        rows = torch.randint(len(train), (1000, 32), generator=g)
        clients = [train.subset(r) for r in rows]
    return Federation(workload.name, clients, num_classes=10, test=test)


def make_algorithm(workload: Workload) -> FedAvg:
    options = {"hidden": list(workload.hidden)} if workload.model == "mlp" else {}
    model = FunctionalModel(build_model(workload.model, (64,), 10, **options))
    return FedAvg(
        model=model,
        loss=cross_entropy,
        lr=workload.lr,
        local_steps=workload.local_steps,
        batch_size=workload.batch_size,
    )


def accuracy(logits: Tensor, y: Tensor) -> float:
    return float((logits.argmax(1) == y).double().mean())


# -- runners: each returns (seconds of every round, final test accuracy) --------------------


def run_fedrisk(workload: Workload, fed: Federation, executor: str) -> tuple[list[float], float]:
    alg = make_algorithm(workload)
    sim = Simulation(alg, fed, seed=0, executor=executor)
    times = []
    for _ in range(workload.rounds):
        t = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - t)
    with torch.no_grad():
        acc = accuracy(alg.predict(alg.global_params(sim.server_state), fed.test.x), fed.test.y)
    return times, acc


def run_plain(workload: Workload, fed: Federation) -> tuple[list[float], float]:
    """FedAvg written directly in PyTorch (no fedrisk runtime)."""
    alg = make_algorithm(workload)
    net: nn.Module = alg.model.module

    global_w = alg.init_params(generator(0, "init"))  # the same initial model as Simulation(seed=0)
    sizes = [len(c) for c in fed.clients]
    total = float(sum(sizes))
    times = []
    for r in range(workload.rounds):
        t = time.perf_counter()
        avg = {k: torch.zeros_like(v) for k, v in global_w.items()}
        for k, client in enumerate(fed.clients):
            net.load_state_dict(global_w, strict=False)
            opt = torch.optim.SGD(net.parameters(), lr=workload.lr)
            idx = sample_batches(client_generator(0, r, k), sizes[k], workload.local_steps, workload.batch_size)
            for step in range(workload.local_steps):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(client.x[idx[step]]), client.y[idx[step]])
                loss.backward()
                opt.step()
            with torch.no_grad():
                for name, p in net.named_parameters():
                    avg[name].add_(p, alpha=sizes[k] / total)
        global_w = avg
        times.append(time.perf_counter() - t)
    with torch.no_grad():
        acc = accuracy(alg.model.apply(global_w, fed.test.x), fed.test.y)
    return times, acc


def run_floor(workload: Workload, fed: Federation) -> tuple[list[float], float]:
    """The round as one vmapped tensor program over pre-stacked, padded client data."""
    alg = make_algorithm(workload)

    w = alg.init_params(generator(0, "init"))
    sizes = torch.tensor([len(c) for c in fed.clients])
    n_max = int(sizes.max())
    x = torch.zeros(len(fed.clients), n_max, 64)
    y = torch.zeros(len(fed.clients), n_max, dtype=torch.long)
    for k, c in enumerate(fed.clients):
        x[k, : len(c)], y[k, : len(c)] = c.x, c.y
    p = (sizes / sizes.sum()).float()
    apply = alg.model.apply
    steps, lr, b = workload.local_steps, workload.lr, workload.batch_size

    def local(params: dict, xk: Tensor, yk: Tensor, idx: Tensor) -> dict:
        g = torch.func.grad(lambda q, xb, yb: nn.functional.cross_entropy(apply(q, xb), yb))
        for t in range(steps):
            grads = g(params, xk[idx[t]], yk[idx[t]])
            params = {k: v - lr * grads[k] for k, v in params.items()}
        return params

    batched = torch.func.vmap(local, in_dims=(None, 0, 0, 0))
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(workload.rounds):
        t = time.perf_counter()
        idx = (torch.rand(len(sizes), steps, b, generator=gen) * sizes[:, None, None]).long()
        out = batched(w, x, y, idx)
        w = {k: torch.tensordot(p, v, dims=1) for k, v in out.items()}
        times.append(time.perf_counter() - t)
    with torch.no_grad():
        acc = accuracy(apply(w, fed.test.x), fed.test.y)
    return times, acc


def run(workload: Workload, runner: str, fed: Federation) -> dict:
    fns: dict[str, Callable[[], tuple[list[float], float]]] = {
        "sequential": lambda: run_fedrisk(workload, fed, "sequential"),
        "vectorized": lambda: run_fedrisk(workload, fed, "vectorized"),
        "plain": lambda: run_plain(workload, fed),
        "floor": lambda: run_floor(workload, fed),
    }
    times, acc = fns[runner]()
    steady = times[1:] or times
    return {
        "workload": workload.name,
        "runner": runner,
        "rounds": len(times),
        "s_per_round": statistics.median(steady),
        "min_s_per_round": min(steady),
        "total_s": sum(times),
        "test_accuracy": acc,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    parser.add_argument("--runner", nargs="+", choices=RUNNERS, default=list(RUNNERS))
    parser.add_argument("--rounds", type=int, default=None, help="override the workload's number of rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the whole run")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'workload':8} {'runner':11} {'s/round':>9} {'min s':>9} {'total s':>8} {'test acc':>8}")
    for name in args.workload:
        workload = WORKLOADS[name]
        if args.rounds is not None:
            workload = Workload(**{**workload.__dict__, "rounds": args.rounds})
        fed = federation(workload)
        for runner in args.runner:
            res = run(workload, runner, fed)
            res["threads"] = args.threads
            results.append(res)
            print(
                f"{name:8} {runner:11} {res['s_per_round']:9.4f} {res['min_s_per_round']:9.4f} "
                f"{res['total_s']:8.2f} {res['test_accuracy']:8.4f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return results


if __name__ == "__main__":
    main()
