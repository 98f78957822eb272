"""Simulation speed: seconds per FedAvg round of fedrisk's executors, plain PyTorch and Flower.

Workloads (FedAvg with sample-count weights, SGD with lr 0.05 on minibatches of 16 rows drawn
with replacement, every client in every round; scikit-learn digits standardised with the
training split's mean / std after an 80/20 stratified split with seed 0):

* ``W1``: 100 IID clients (14-15 rows each), MLP 64-128-10, 10 local steps, 20 rounds.
* ``W2``: 1000 clients of 32 rows each drawn with replacement from the training split,
  logistic regression 64-10, 5 local steps, 10 rounds.
* ``H`` (compute-heavy, for the distributed executor's scaling): W1's clients with an MLP
  64-512-512-10 and 40 local steps, 6 rounds.

Implementations (``--impl``; each runs in its own subprocess so that its peak memory is its
own; the same data, the same initial model and the same per-client minibatch indices
``sample_batches(client_generator(0, round, k), ...)`` everywhere, hence the same final
accuracy up to float rounding, except for ``floor``, which is a different algorithm):

* ``sequential`` / ``vectorized``: :class:`fedrisk.runtime.simulation.Simulation` with that
  executor (float32); ``vectorized-2t``: the same with 2 torch threads.
* ``distributed-1p`` / ``distributed-2p``: the distributed executor (local executor
  ``sequential``, gloo) in 1 / 2 processes started by ``python -m torch.distributed.run`` on
  ``benchmarks/_distributed_workload.py``.
* ``plain``: a hand-written PyTorch loop: one ``nn.Sequential``, per client the global weights
  copied into it in place, the local steps with ``torch.autograd.grad`` and in-place SGD
  updates, and an in-place weighted sum of the client models.
* ``plain-optim``: the same with ``load_state_dict`` and a fresh ``torch.optim.SGD`` per client
  (how most tutorials write it).
* ``vmap``: a hand-written ``torch.func.vmap(grad)`` over all clients with stacked parameters
  and padded, stacked client data (the same draws, made in one block call inside the round as
  fedrisk's vectorised executor does).
* ``stacked`` (not in the default set): per-client models by hand without ``vmap``: every
  weight stacked ``[C, out, in]``, the forward pass as batched GEMMs ``W xᵀ`` in the weights'
  own layout, ordinary autograd on the sum of the clients' mean losses (which gives each client
  its own gradient), in-place ``torch._foreach_add_`` SGD updates: what removing every
  framework cost from the vectorised executor could reach.
* ``floor``: the compute floor: per local step, the round's minibatches of every client
  concatenated into one batch of ``C * 16`` rows on one model (``floor-2t``: 2 threads); its
  indices are computed before the timed rounds.  It trains a different (large-batch) model,
  so only its speed compares.
* ``flower``: Flower's simulation (``flwr.simulation.run_simulation``, ServerApp / ClientApp,
  the stock ``FedAvg`` strategy, ``num_cpus=1`` per client) run by ``benchmarks/flower_workload.py``
  with ``.venv-bench/bin/python`` (or this interpreter if ``flwr`` imports here); skipped with a
  note otherwise.  It gets the data, initial model and minibatch indices from a file this
  script writes.

Each implementation reports the median seconds per round over rounds 2..R (the first round
is reported apart: it pays one-off costs such as vmap's lazy import), the median CPU seconds
per round (in-process implementations), the final test accuracy, the peak resident memory of
its main process (``VmHWM``) and the peak of the summed proportional set size (PSS) of all its
processes (sampled twice a second).  Each process uses 1 torch thread unless the name ends in
``-2t``.  With ``--repeat N`` the whole set runs N times (alternating the order) and the table
shows the median of the N medians with their range.

On a machine shared with other work the load drifts between two separate processes, so the
pairs whose ratio is a target (:data:`PAIRS`) also run interleaved in one process, round r of
one then round r of the other; each target is reported from the separate runs, their CPU
times and the interleaved runs (``--no-paired`` skips the latter).

Usage::

    .venv/bin/python benchmarks/simulation_speed.py --repeat 2 --json runs/simulation_speed.json
    .venv/bin/python benchmarks/simulation_speed.py --from-json runs/simulation_speed.json  # the report again
    .venv/bin/python benchmarks/simulation_speed.py --workload W2 --impl sequential plain --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _mlp import mlp  # this script's folder
from _timing import save_json  # this script's folder
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"


@dataclass(frozen=True)
class Workload:
    """One benchmark workload (see the module docstring)."""

    name: str
    model: str
    hidden: tuple[int, ...]
    local_steps: int
    rounds: int
    num_clients: int = 100
    rows_per_client: int | None = None  # None: an IID partition of the training split
    batch_size: int = 16
    lr: float = 0.05


WORKLOADS = {
    "W1": Workload("W1", "mlp", (128,), local_steps=10, rounds=20),
    "W2": Workload("W2", "logreg", (), local_steps=5, rounds=10, num_clients=1000, rows_per_client=32),
    "H": Workload("H", "mlp", (512, 512), local_steps=40, rounds=6),
}


@dataclass(frozen=True)
class Impl:
    """How an implementation runs: its runner, torch threads per process and processes."""

    runner: str
    threads: int = 1
    procs: int = 1


IMPLS = {
    "sequential": Impl("sequential"),
    "vectorized": Impl("vectorized"),
    "vectorized-2t": Impl("vectorized", threads=2),
    "distributed-1p": Impl("distributed", procs=1),
    "distributed-2p": Impl("distributed", procs=2),
    "plain": Impl("plain"),
    "plain-optim": Impl("plain-optim"),
    "vmap": Impl("vmap"),
    "stacked": Impl("stacked"),
    "floor": Impl("floor"),
    "floor-2t": Impl("floor", threads=2),
    "flower": Impl("flower"),
}
DEFAULT_IMPLS = {
    # pairs whose ratio is a target run next to each other (the machine's load drifts)
    "W1": [
        "plain", "sequential", "vectorized", "floor", "vectorized-2t", "floor-2t", "vmap",
        "plain-optim", "distributed-2p", "flower",
    ],
    "W2": [
        "plain", "sequential", "vectorized", "floor", "vectorized-2t", "floor-2t", "vmap",
        "plain-optim", "distributed-2p", "flower",
    ],
    "H": ["distributed-1p", "distributed-2p"],
}  # fmt: skip


# -- the shared workload: data, model, draws ---------------------------------------------------


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
    """The workload's clients: an IID split, or ``rows_per_client`` rows drawn with replacement."""
    train, test = digits_split()
    if workload.rows_per_client is None:
        clients = [train.subset(p) for p in iid(train.y.numpy(), workload.num_clients, seed=0)]
    else:
        g = torch.Generator().manual_seed(0)
        rows = torch.randint(len(train), (workload.num_clients, workload.rows_per_client), generator=g)
        clients = [train.subset(r) for r in rows]
    return Federation(workload.name, clients, num_classes=10, test=test)


def make_algorithm(workload: Workload) -> FedAvg:
    """fedrisk's FedAvg with the workload's hyper-parameters."""
    options = {"hidden": list(workload.hidden)} if workload.model == "mlp" else {}
    model = FunctionalModel(build_model(workload.model, (64,), 10, **options))
    return FedAvg(
        model=model,
        loss=cross_entropy,
        lr=workload.lr,
        local_steps=workload.local_steps,
        batch_size=workload.batch_size,
    )


def initial_params(workload: Workload) -> dict[str, Tensor]:
    """The initial global model, exactly as ``Simulation(seed=0)`` makes it."""
    return make_algorithm(workload).init_params(generator(0, "init"))


def torch_model(workload: Workload) -> nn.Sequential:
    """The workload's model as a plain ``nn.Sequential`` (its parameters in fedrisk's order)."""
    return mlp(workload.hidden)


def block_draws(fed: Federation, workload: Workload, round: int) -> Tensor:
    """Every client's minibatch indices for ``round``, ``[C, E, B]``: fedrisk's own draws, made
    in one block call (row k equals ``sample_batches(client_generator(0, round, k), ...)``)."""
    sizes = torch.tensor([len(c) for c in fed.clients])
    rng = client_generator(0, round, list(range(len(fed.clients))))
    return sample_batches(rng, sizes, workload.local_steps, workload.batch_size)


def accuracy(logits: Tensor, y: Tensor) -> float:
    return float((logits.argmax(1) == y).double().mean())


def export_workload(workload: Workload, path: Path) -> None:
    """Write what an outside implementation (Flower) needs to run exactly this workload."""
    fed = federation(workload)
    init = initial_params(workload)
    torch.save(
        {
            "workload": asdict(workload),
            "clients_x": [c.x for c in fed.clients],
            "clients_y": [c.y for c in fed.clients],
            "test_x": fed.test.x,
            "test_y": fed.test.y,
            "init": list(init.values()),  # in nn.Sequential's parameter order
            "indices": torch.stack([block_draws(fed, workload, r) for r in range(workload.rounds)]),
        },
        path,
    )


# -- in-process runners: set up in __init__, one FedAvg round per step(r) ----------------------


class Runner:
    """One implementation of a workload: ``step(r)`` runs round ``r``; ``accuracy()`` tests the
    final global model.  ``parts`` collects the seconds of named parts of each round."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.fed = federation(workload)
        self.parts: dict[str, list[float]] = {}

    def step(self, r: int) -> None:
        raise NotImplementedError

    def accuracy(self) -> float:
        raise NotImplementedError


class FedriskRunner(Runner):
    """:class:`fedrisk.runtime.simulation.Simulation` with the given executor."""

    executor = "sequential"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.alg = make_algorithm(workload)
        self.sim = Simulation(self.alg, self.fed, seed=0, executor=self.executor)

    def step(self, r: int) -> None:
        self.sim.step()

    def accuracy(self) -> float:
        with torch.no_grad():
            params = self.alg.global_params(self.sim.server_state)
            return accuracy(self.alg.predict(params, self.fed.test.x), self.fed.test.y)


class VectorizedRunner(FedriskRunner):
    executor = "vectorized"


class PlainRunner(Runner):
    """FedAvg by hand: one model, weights copied in place, autograd, in-place SGD and sum."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.net = torch_model(workload)
        self.params = list(self.net.parameters())
        self.global_w = [p.clone() for p in initial_params(workload).values()]
        self.sizes = [len(c) for c in self.fed.clients]

    def step(self, r: int) -> None:
        wl, params, sizes = self.workload, self.params, self.sizes
        total = float(sum(sizes))
        avg = [torch.zeros_like(w) for w in self.global_w]
        for k, client in enumerate(self.fed.clients):
            with torch.no_grad():
                for p, w in zip(params, self.global_w):
                    p.copy_(w)
            idx = sample_batches(client_generator(0, r, k), sizes[k], wl.local_steps, wl.batch_size)
            for step in range(wl.local_steps):
                rows = idx[step]
                loss = nn.functional.cross_entropy(self.net(client.x[rows]), client.y[rows])
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g in zip(params, grads):
                        p.add_(g, alpha=-wl.lr)
            with torch.no_grad():
                for a, p in zip(avg, params):
                    a.add_(p, alpha=sizes[k] / total)
        self.global_w = avg

    def accuracy(self) -> float:
        with torch.no_grad():
            for p, w in zip(self.params, self.global_w):
                p.copy_(w)
            return accuracy(self.net(self.fed.test.x), self.fed.test.y)


class PlainOptimRunner(Runner):
    """FedAvg as tutorials write it: ``load_state_dict`` and ``torch.optim.SGD`` per client."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.net = torch_model(workload)
        names = [n for n, _ in self.net.named_parameters()]
        self.global_w = dict(zip(names, initial_params(workload).values()))
        self.sizes = [len(c) for c in self.fed.clients]

    def step(self, r: int) -> None:
        wl, net, sizes = self.workload, self.net, self.sizes
        total = float(sum(sizes))
        avg = {k: torch.zeros_like(v) for k, v in self.global_w.items()}
        for k, client in enumerate(self.fed.clients):
            net.load_state_dict(self.global_w)
            opt = torch.optim.SGD(net.parameters(), lr=wl.lr)
            idx = sample_batches(client_generator(0, r, k), sizes[k], wl.local_steps, wl.batch_size)
            for step in range(wl.local_steps):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(client.x[idx[step]]), client.y[idx[step]])
                loss.backward()
                opt.step()
            with torch.no_grad():
                for name, p in net.named_parameters():
                    avg[name].add_(p, alpha=sizes[k] / total)
        self.global_w = avg

    def accuracy(self) -> float:
        self.net.load_state_dict(self.global_w)
        with torch.no_grad():
            return accuracy(self.net(self.fed.test.x), self.fed.test.y)


def _padded(fed: Federation) -> tuple[Tensor, Tensor, Tensor]:
    """Client data stacked ``[C, n_max, ...]`` (zero rows past each client's size) and sizes."""
    sizes = torch.tensor([len(c) for c in fed.clients])
    n_max = int(sizes.max())
    x = torch.zeros(len(fed.clients), n_max, fed.clients[0].x.shape[1])
    y = torch.zeros(len(fed.clients), n_max, dtype=torch.long)
    for k, c in enumerate(fed.clients):
        x[k, : len(c)], y[k, : len(c)] = c.x, c.y
    return x, y, sizes


class VmapRunner(Runner):
    """FedAvg by hand with ``torch.func``: one ``vmap(grad)`` program over every client, the
    draws made with fedrisk's block generator inside the round (part ``draws``)."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.apply = make_algorithm(workload).model.apply
        self.w = initial_params(workload)
        self.x, self.y, sizes = _padded(self.fed)
        self.p = (sizes / sizes.sum()).float()
        steps, lr, apply = workload.local_steps, workload.lr, self.apply
        grad = torch.func.grad(lambda q, xb, yb: nn.functional.cross_entropy(apply(q, xb), yb))

        def local(params: dict[str, Tensor], xk: Tensor, yk: Tensor, idx: Tensor) -> dict[str, Tensor]:
            for t in range(steps):
                g = grad(params, xk[idx[t]], yk[idx[t]])
                params = {k: v - lr * g[k] for k, v in params.items()}
            return params

        self.batched = torch.func.vmap(local, in_dims=(None, 0, 0, 0))

    def step(self, r: int) -> None:
        start = time.perf_counter()
        idx = block_draws(self.fed, self.workload, r)
        self.parts.setdefault("draws", []).append(time.perf_counter() - start)
        out = self.batched(self.w, self.x, self.y, idx)
        self.w = {k: torch.tensordot(self.p, v, dims=1) for k, v in out.items()}

    def accuracy(self) -> float:
        with torch.no_grad():
            return accuracy(self.apply(self.w, self.fed.test.x), self.fed.test.y)


class StackedRunner(Runner):
    """Per-client models stacked by hand (no ``vmap``): batched GEMMs in the weights' layout,
    autograd on the sum of the clients' losses, in-place foreach SGD (see the module docstring)."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        self.w = initial_params(workload)
        self.x, self.y, sizes = _padded(self.fed)
        self.p = (sizes / sizes.sum()).float()
        self.rows = torch.arange(len(self.fed.clients))[:, None]

    def step(self, r: int) -> None:
        wl, c = self.workload, len(self.fed.clients)
        idx = block_draws(self.fed, wl, r)
        values = [v.expand(c, *v.shape).clone() for v in self.w.values()]
        for t in range(wl.local_steps):
            xb, yb = self.x[self.rows, idx[:, t]], self.y[self.rows, idx[:, t]]
            leaves = [v.detach().requires_grad_(True) for v in values]
            h = xb.mT  # [C, features, B]: activations feature-major, weights as stored
            for i in range(0, len(leaves), 2):
                h = torch.baddbmm(leaves[i + 1][:, :, None], leaves[i], h)
                if i + 2 < len(leaves):
                    h = torch.relu(h)
            loss = (torch.logsumexp(h, 1) - h.gather(1, yb[:, None, :])[:, 0]).mean(1).sum()
            grads = torch.autograd.grad(loss, leaves)
            torch._foreach_add_(values, list(grads), alpha=-wl.lr)
        self.w = {k: torch.tensordot(self.p, v, dims=1) for k, v in zip(self.w, values)}

    def accuracy(self) -> float:
        with torch.no_grad():
            return accuracy(make_algorithm(self.workload).model.apply(self.w, self.fed.test.x), self.fed.test.y)


class FloorRunner(Runner):
    """The compute floor: each local step is one batch of every client's rows on one model."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        fed = self.fed
        self.net = torch_model(workload)
        self.params = list(self.net.parameters())
        with torch.no_grad():
            for q, w in zip(self.params, initial_params(workload).values()):
                q.copy_(w)
        self.x = torch.cat([c.x for c in fed.clients])
        self.y = torch.cat([c.y for c in fed.clients])
        offsets = torch.tensor([0] + [len(c) for c in fed.clients[:-1]]).cumsum(0)
        # global rows [E, C * B] of each round's minibatches (drawn here, before timing: not compute)
        self.rows = [(block_draws(fed, workload, r) + offsets[:, None, None]).transpose(0, 1).flatten(1)
                     for r in range(workload.rounds)]  # fmt: skip

    def step(self, r: int) -> None:
        for step_rows in self.rows[r]:
            loss = nn.functional.cross_entropy(self.net(self.x[step_rows]), self.y[step_rows])
            grads = torch.autograd.grad(loss, self.params)
            with torch.no_grad():
                for q, g in zip(self.params, grads):
                    q.add_(g, alpha=-self.workload.lr)

    def accuracy(self) -> float:
        with torch.no_grad():
            return accuracy(self.net(self.fed.test.x), self.fed.test.y)


IN_PROCESS: dict[str, type[Runner]] = {
    "sequential": FedriskRunner,
    "vectorized": VectorizedRunner,
    "plain": PlainRunner,
    "plain-optim": PlainOptimRunner,
    "vmap": VmapRunner,
    "stacked": StackedRunner,
    "floor": FloorRunner,
}


def timed_rounds(runners: Sequence[Runner], rounds: int) -> list[dict[str, list[float]]]:
    """Run the runners' rounds interleaved (round r of each, the order alternating every round);
    per runner the wall-clock and CPU seconds (``time.process_time``, all threads) of each round."""
    out: list[dict[str, list[float]]] = [{"wall": [], "cpu": []} for _ in runners]
    for r in range(rounds):
        order = list(range(len(runners)))
        for i in order if r % 2 == 0 else order[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            runners[i].step(r)
            out[i]["cpu"].append(time.process_time() - cpu)
            out[i]["wall"].append(time.perf_counter() - wall)
    return out


def vm_hwm_mb() -> float:
    """Peak resident set size of this process in MiB (``VmHWM``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(names: Sequence[str], workload: Workload, threads: int) -> None:
    """Run in-process implementations (several: interleaved round by round) and print their
    results as one ``RESULT {json}`` line."""
    torch.set_num_threads(threads)
    runners = [IN_PROCESS[n](workload) for n in names]
    timings = timed_rounds(runners, workload.rounds)
    results = []
    for runner, t in zip(runners, timings):
        res = {"times": t["wall"], "cpu_times": t["cpu"], "accuracy": runner.accuracy(), "vm_hwm_mb": [vm_hwm_mb()]}
        res.update({f"{k}_s_per_round": statistics.median(v[1:] or v) for k, v in runner.parts.items()})
        results.append(res)
    print("RESULT " + json.dumps(results if len(names) > 1 else results[0]), flush=True)


# -- the driver: one subprocess per implementation ---------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class TreeMemory:
    """Samples the summed PSS of a process tree twice a second; ``peak_mb`` is the maximum."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval, self.peak_mb = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_mb = max(self.peak_mb, sum(_pss_mb(p) for p in _descendants(self.pid)))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


def flower_python() -> str | None:
    """The interpreter that runs the Flower implementation, or None when Flower is absent."""
    if BENCH_PYTHON.exists():
        return str(BENCH_PYTHON)
    if importlib.util.find_spec("flwr") is not None:
        return sys.executable
    return None


def command(name: str, workload: Workload, workfile: Callable[[], Path]) -> list[str] | None:
    """The command line that runs implementation ``name`` on ``workload`` (None: unavailable)."""
    impl = IMPLS[name]
    if impl.runner in IN_PROCESS:
        script = str(HERE / "simulation_speed.py")
        return [sys.executable, script, "--worker", impl.runner, "--workload", workload.name,
                "--rounds", str(workload.rounds), "--threads", str(impl.threads)]  # fmt: skip
    if impl.runner == "distributed":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(impl.procs),
                "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                str(HERE / "_distributed_workload.py"), "--workload", workload.name,
                "--rounds", str(workload.rounds), "--threads", str(impl.threads)]  # fmt: skip
    if impl.runner == "flower":
        python = flower_python()
        if python is None:
            return None
        return [python, str(HERE / "flower_workload.py"), str(workfile())]
    raise ValueError(name)


def run_impl(name: str, workload: Workload, workfile: Callable[[], Path]) -> dict:
    """Run one implementation in its own process tree; its timing, accuracy and memory."""
    cmd = command(name, workload, workfile)
    if cmd is None:
        return {"skipped": "Flower is not installed: create .venv-bench (see benchmarks/README.md)"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    memory = TreeMemory(proc.pid)
    output, _ = proc.communicate()
    tree_peak = memory.stop()
    wall = time.perf_counter() - start
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(output.splitlines()[-30:])
        raise RuntimeError(f"{name} on {workload.name} failed (exit {proc.returncode}):\n{tail}")
    res = json.loads(lines[-1][len("RESULT ") :])
    times = res["times"]
    steady = times[1:] or times
    return {
        "s_per_round": statistics.median(steady),
        "min_s_per_round": min(steady),
        "first_round_s": times[0],
        "rounds": len(times),
        "accuracy": res["accuracy"],
        "vm_hwm_mb": res["vm_hwm_mb"],
        "tree_pss_peak_mb": tree_peak,
        "process_wall_s": wall,
        **({"cpu_s_per_round": statistics.median(res["cpu_times"][1:])} if "cpu_times" in res else {}),
        **{k: v for k, v in res.items() if k not in ("times", "cpu_times", "accuracy", "vm_hwm_mb")},
        "times": times,
    }


PAIRS = [("sequential", "plain"), ("sequential", "vectorized"), ("vectorized", "floor"), ("vectorized-2t", "floor-2t")]
"""Pairs of in-process implementations (same threads) also run in one process, interleaved
round by round, for ratios that a drifting machine load affects alike (numerator first)."""


def run_pair(pair: tuple[str, str], workload: Workload) -> dict:
    """Run both implementations of ``pair`` in one process, alternating rounds; the per-round
    ratios numerator / denominator over rounds 2..R."""
    a, b = (IMPLS[n] for n in pair)
    if a.threads != b.threads:
        raise ValueError(f"pair {pair} mixes thread counts")
    cmd = [sys.executable, str(HERE / "simulation_speed.py"), "--worker", f"{a.runner},{b.runner}",
           "--workload", workload.name, "--rounds", str(workload.rounds), "--threads", str(a.threads)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"pair {pair} on {workload.name} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    ra, rb = json.loads(lines[-1][len("RESULT ") :])
    ratios = [x / y for x, y in zip(ra["times"][1:], rb["times"][1:])]
    return {
        "pair": list(pair),
        "ratios": ratios,
        "cpu_ratios": [x / y for x, y in zip(ra["cpu_times"][1:], rb["cpu_times"][1:])],
        "ratio": statistics.median(ratios),
        "s_per_round": [statistics.median(ra["times"][1:]), statistics.median(rb["times"][1:])],
        "accuracy": [ra["accuracy"], rb["accuracy"]],
    }


# -- report ------------------------------------------------------------------------------------

TARGETS = [
    # (description, workload, numerator, denominator, bound, kind): the ratio is numerator /
    # denominator seconds per round; "max": ratio <= bound, "min": ratio >= bound.  Pairs are
    # compared at the same number of threads (1) unless the name says otherwise.
    ("sequential <= 1.15x plain (W1)", "W1", "sequential", "plain", 1.15, "max"),
    ("sequential <= 1.15x plain (W2)", "W2", "sequential", "plain", 1.15, "max"),
    ("vectorized >= 3x faster than sequential (W1)", "W1", "sequential", "vectorized", 3.0, "min"),
    ("vectorized >= 5x faster than sequential (W2)", "W2", "sequential", "vectorized", 5.0, "min"),
    ("vectorized <= 2x floor (W2, 1 thread)", "W2", "vectorized", "floor", 2.0, "max"),
    ("vectorized <= 2x floor (W2, 2 threads)", "W2", "vectorized-2t", "floor-2t", 2.0, "max"),
    ("vectorized <= 1.5x floor (W1, 1 thread)", "W1", "vectorized", "floor", 1.5, "max"),
    ("vectorized <= 1.5x floor (W2, 1 thread)", "W2", "vectorized", "floor", 1.5, "max"),
    ("vectorized no slower than hand-written vmap (W1)", "W1", "vectorized", "vmap", 1.0, "max"),
    ("vectorized no slower than hand-written vmap (W2)", "W2", "vectorized", "vmap", 1.0, "max"),
    ("fedrisk best >= 20x faster than Flower (W1)", "W1", "flower", "fedrisk*", 20.0, "min"),
    ("fedrisk best >= 100x faster than Flower (W2)", "W2", "flower", "fedrisk*", 100.0, "min"),
    ("distributed 2 processes >= 1.6x faster than 1 (H)", "H", "distributed-1p", "distributed-2p", 1.6, "min"),
]


def _best(table: dict[str, dict], pattern: str) -> tuple[str, float] | None:
    """``pattern``'s seconds per round; ``fedrisk*``: the fastest fedrisk executor (any
    threads / processes).  None if it did not run."""
    if pattern == "fedrisk*":
        names = [n for n in table if IMPLS[n].runner in ("sequential", "vectorized", "distributed")]
    else:
        names = [pattern] if pattern in table else []
    names = [n for n in names if "s_per_round" in table[n]]
    if not names:
        return None
    best = min(names, key=lambda n: table[n]["s_per_round"])
    return best, table[best]["s_per_round"]


def check_targets(
    summary: dict[str, dict[str, dict]], runs: Sequence[dict] = (), pairs: Sequence[dict] = ()
) -> list[dict]:
    """Each target's ratio (numerator / denominator of the medians over repeats), its verdict,
    the range of the same ratio within each repeat (the two ran minutes apart at most), and,
    where the two ran interleaved in one process (:data:`PAIRS`), the median of the per-round
    ratios over every repeat with its verdict."""
    out = []
    for desc, wl, num, den, bound, kind in TARGETS:

        def meets(ratio: float, bound: float = bound, kind: str = kind) -> bool:
            return ratio <= bound if kind == "max" else ratio >= bound

        mine = [p for p in pairs if p["workload"] == wl and p["pair"] == [num, den]]
        extra: dict[str, Any] = {}
        if mine:
            med = statistics.median(x for p in mine for x in p["ratios"])
            extra = {
                "paired_ratio": med,
                "paired_cpu_ratio": statistics.median(x for p in mine for x in p["cpu_ratios"]),
                "paired_rounds": sum(len(p["ratios"]) for p in mine),
                "paired_status": "met" if meets(med) else "MISSED",
            }
        a, b = _best(summary.get(wl, {}), num), _best(summary.get(wl, {}), den)
        if a is None or b is None:
            out.append({"target": desc, "status": "not measured", **extra})
            continue
        ratio = a[1] / b[1]
        ok = meets(ratio)
        per_repeat = []
        for rep in sorted({r["repeat"] for r in runs}):
            mine = {r["impl"]: r for r in runs if r["repeat"] == rep and r["workload"] == wl and "s_per_round" in r}
            if a[0] in mine and b[0] in mine:
                per_repeat.append(mine[a[0]]["s_per_round"] / mine[b[0]]["s_per_round"])
        out.append(
            {
                "target": desc,
                "ratio": ratio,
                "per_repeat": per_repeat,
                "using": f"{a[0]} / {b[0]}",
                "status": "met" if ok else "MISSED",
                **extra,
                **_cpu_ratio(summary[wl], a[0], b[0]),
            }
        )
    return out


def _cpu_ratio(table: dict[str, dict], a: str, b: str) -> dict[str, float]:
    """The ratio of CPU seconds per round (single-process implementations only)."""
    x, y = table[a].get("cpu_s_per_round"), table[b].get("cpu_s_per_round")
    return {"cpu_ratio": x / y} if x and y else {}


def summarise(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Per workload and implementation: median over repeats of the per-run medians, and range."""
    summary: dict[str, dict[str, dict]] = {}
    for wl in dict.fromkeys(r["workload"] for r in runs):
        summary[wl] = {}
        for name in dict.fromkeys(r["impl"] for r in runs if r["workload"] == wl):
            rs = [r for r in runs if r["workload"] == wl and r["impl"] == name]
            if "skipped" in rs[0]:
                summary[wl][name] = {"skipped": rs[0]["skipped"]}
                continue
            med = [r["s_per_round"] for r in rs]
            summary[wl][name] = {
                "s_per_round": statistics.median(med),
                "range": [min(med), max(med)],
                "first_round_s": statistics.median(r["first_round_s"] for r in rs),
                "cpu_s_per_round": statistics.median(r["cpu_s_per_round"] for r in rs)
                if "cpu_s_per_round" in rs[0]
                else None,
                "accuracy": sorted({round(r["accuracy"], 4) for r in rs}),
                "vm_hwm_mb": max(max(r["vm_hwm_mb"]) for r in rs),
                "vm_hwm_sum_mb": max(sum(r["vm_hwm_mb"]) for r in rs),
                "tree_pss_peak_mb": max(r["tree_pss_peak_mb"] for r in rs),
                "repeats": len(rs),
            }
            if "draws_s_per_round" in rs[0]:
                summary[wl][name]["draws_s_per_round"] = statistics.median(r["draws_s_per_round"] for r in rs)
    return summary


def format_table(summary: dict[str, dict[str, dict]]) -> str:
    head = (f"{'wl':3} {'implementation':15} {'s/round':>8} {'range':>15} {'cpu s/rd':>8} {'1st rd':>6} "
            f"{'test acc':>8} {'RSS MiB':>7} {'PSS all':>7} {'vs plain':>8} {'Flower/x':>8}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for wl, table in summary.items():
        plain = table.get("plain", {}).get("s_per_round")
        flower = table.get("flower", {}).get("s_per_round")
        for name, s in table.items():
            if "skipped" in s:
                lines.append(f"{wl:3} {name:15} skipped: {s['skipped']}")
                continue
            t = s["s_per_round"]
            rng = f"{s['range'][0]:.4f}-{s['range'][1]:.4f}"
            acc = "/".join(f"{a:.4f}" for a in s["accuracy"])
            vs_plain = f"{t / plain:.2f}x" if plain else "-"
            vs_flower = f"{flower / t:.0f}x" if flower else "-"
            rss = s["vm_hwm_mb"] if s["vm_hwm_sum_mb"] == s["vm_hwm_mb"] else s["vm_hwm_sum_mb"]
            cpu = f"{s['cpu_s_per_round']:8.4f}" if s["cpu_s_per_round"] is not None else f"{'-':>8}"
            lines.append(
                f"{wl:3} {name:15} {t:8.4f} {rng:>15} {cpu} {s['first_round_s']:6.2f} {acc:>8} "
                f"{rss:7.0f} {s['tree_pss_peak_mb']:7.0f} {vs_plain:>8} {vs_flower:>8}"
            )
    return "\n".join(lines)


def machine() -> dict:
    """A short description of the machine and the software."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
        info["load_average_at_start"] = os.getloadavg()
    except (OSError, StopIteration):
        pass
    return info


def report(info: dict, runs: list[dict], pairs: list[dict]) -> dict:
    """Print the table and the targets; return everything (for ``--json``)."""
    summary = summarise(runs)
    targets = check_targets(summary, runs, pairs)
    print()
    print(format_table(summary))
    print()
    for t in targets:
        extra = ""
        if "ratio" in t:
            spread = ", ".join(f"{x:.2f}" for x in t["per_repeat"])
            extra = f"{t['ratio']:.2f} ({t['using']}; per repeat: {spread})"
        if "cpu_ratio" in t:
            extra += f"; CPU time: {t['cpu_ratio']:.2f}"
        if "paired_ratio" in t:
            extra += f"; interleaved: {t['paired_ratio']:.2f} (CPU {t['paired_cpu_ratio']:.2f}) {t['paired_status']}"
        print(f"{t['status']:>12}  {t['target']:52} {extra}")
    for wl, table in summary.items():
        if "draws_s_per_round" in table.get("vmap", {}):
            print(
                f"{wl}: drawing one round's minibatch indices for every client in one block call "
                f"(fedrisk's counter-based RNG) takes {table['vmap']['draws_s_per_round']:.4f} s "
                f"(part of vmap's {table['vmap']['s_per_round']:.4f} s/round; the floor draws before timing)"
            )
    return {"machine": info, "runs": runs, "pairs": pairs, "summary": summary, "targets": targets}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--impl", nargs="+", choices=list(IMPLS), default=None,
                        help="implementations to run (default: every one that fits the workload)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, help="override every workload's number of rounds")
    parser.add_argument("--repeat", type=int, default=1, help="run the whole set this many times")
    parser.add_argument("--json", default=None, help="also write every run and the summary to this JSON file")
    parser.add_argument("--no-paired", dest="paired", action="store_false",
                        help="skip the interleaved runs of the target pairs (PAIRS) in one process")  # fmt: skip
    parser.add_argument("--from-json", default=None, help="only print the report of a JSON file written by --json")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workloads = [WORKLOADS[w] if args.rounds is None else replace(WORKLOADS[w], rounds=args.rounds)
                 for w in args.workload]  # fmt: skip
    if args.worker:
        worker(args.worker.split(","), workloads[0], args.threads)
        return {}
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        return report(saved["machine"], saved["runs"], saved.get("pairs", []))
    if args.rounds is not None and args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is excluded from the medians)")
    info = machine()
    print(f"torch {info['torch']}, {info['cpus']} CPUs ({info.get('cpu', '?')}), "
          f"load average {info.get('load_average_at_start')}", flush=True)  # fmt: skip
    if flower_python() is None:
        print("note: Flower is not installed (no .venv-bench, flwr not importable): 'flower' is skipped", flush=True)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fedrisk-bench-") as tmp:
        files: dict[str, Path] = {}

        def workfile_of(w: Workload) -> Callable[[], Path]:
            def make() -> Path:
                if w.name not in files:
                    files[w.name] = Path(tmp) / f"{w.name}.pt"
                    export_workload(w, files[w.name])
                return files[w.name]

            return make

        pairs: list[dict] = []
        for rep in range(args.repeat):
            for w in workloads:
                names = args.impl or DEFAULT_IMPLS[w.name]
                order = names if rep % 2 == 0 else names[::-1]
                for name in order:
                    res = run_impl(name, w, workfile_of(w))
                    res.update(workload=w.name, impl=name, repeat=rep)
                    runs.append(res)
                    _save(args.json, info, runs, pairs)
                    if "skipped" in res:
                        print(f"[{rep}] {w.name} {name:15} skipped: {res['skipped']}", flush=True)
                        continue
                    print(
                        f"[{rep}] {w.name} {name:15} {res['s_per_round']:.4f} s/round "
                        f"(first {res['first_round_s']:.3f}) acc {res['accuracy']:.4f} "
                        f"RSS {sum(res['vm_hwm_mb']):.0f} MiB, PSS all {res['tree_pss_peak_mb']:.0f} MiB, "
                        f"process {res['process_wall_s']:.1f} s",
                        flush=True,
                    )
                for pair in PAIRS if args.paired else []:
                    if pair[0] in names and pair[1] in names:
                        res = run_pair(pair, w)
                        res.update(workload=w.name, repeat=rep)
                        pairs.append(res)
                        _save(args.json, info, runs, pairs)
                        print(
                            f"[{rep}] {w.name} interleaved {pair[0]} / {pair[1]}: median ratio {res['ratio']:.2f} "
                            f"({res['s_per_round'][0]:.4f} / {res['s_per_round'][1]:.4f} s/round), "
                            f"acc {res['accuracy'][0]:.4f} / {res['accuracy'][1]:.4f}",
                            flush=True,
                        )
    result = report(info, runs, pairs)
    if args.json:
        save_json(args.json, result)
    return result


def _save(path: str | None, info: dict, runs: list[dict], pairs: list[dict]) -> None:
    """Write the runs so far (a long run stopped midway keeps them; see ``--from-json``)."""
    if path:
        with open(path, "w") as fh:
            json.dump({"machine": info, "runs": runs, "pairs": pairs}, fh, indent=1)


if __name__ == "__main__":
    main()
