"""Many small rounds: fedrisk's CODA+ with one client and ``window = 1`` against a hand-written
PyTorch loop of the same steps, end to end, side by side in one process.

The set-up of issue 15 (``configs/codasca/fmnist_ih.toml`` with one client): Fashion-MNIST,
classes 5-9 positive and subsampled to ``imratio = 0.1``, one client holding the whole training
split, the zoo's CNN (channels [16, 32], FC 64, sigmoid score), CODA+ with the square AUC loss,
``window = 1`` (one local step per round: every step is a communication round), batches of 32
with ``sampling = "shuffle"``, ``lr = 0.1`` divided by 3 every ``stage_iters`` steps,
``prox_coef = 0.002`` towards the stage's start point, ``stage_output = "last"``; ``R`` rounds and
one evaluation (AUROC on the test split) at the end.

* ``fedrisk``: ``run_experiment`` on that config, as ``fedrisk run`` does it (data loading,
  the simulation, metrics / summary files, the default checkpoints: at the end and at most
  every ``run.checkpoint_seconds`` = 30 s; no progress display, no plots).
* ``hand``: a hand-written loop of the same steps: the same data loading
  (``fedrisk.data.build_federation``), an ``nn.Module`` CNN of the same architecture and
  initial weights, ``torch.randperm`` epochs cut into batches of 32, the AUC square loss of
  eq. (2) written out and differentiated by autograd in (w, a, b, α), a PESG-style in-place
  update (descent with the prox term on (w, a, b), ascent on α), the same step-size schedule,
  the same evaluation at the end.

The two alternate (``fedrisk``, ``hand``, ``hand``, ``fedrisk``, ...), so that a machine whose
load drifts slows both alike; the ratio is taken pair by pair.  One torch thread.

Usage::

    .venv/bin/python benchmarks/small_rounds.py                    # 2,000 rounds, 3 pairs
    .venv/bin/python benchmarks/small_rounds.py --rounds 500 --pairs 2 --json runs/small_rounds.json

Results: ``benchmarks/RESULTS.md`` (section "Many small rounds").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _timing import save_json  # this script's folder
from torch import Tensor, nn


def config(rounds: int, stage_iters: int) -> dict[str, Any]:
    return {
        "data": {
            "dataset": "fashion_mnist",
            "partition": "iid",
            "num_clients": 1,
            "binarize": {"positive_classes": [5, 6, 7, 8, 9], "imratio": 0.1},
        },
        "model": {"name": "cnn", "channels": [16, 32], "hidden": [64], "output_activation": "sigmoid"},
        "algorithm": {
            "name": "codaplus",
            "lr": 0.1,
            "window": 1,
            "stage_iters": stage_iters,
            "lr_decay": 3.0,
            "prox_coef": 0.002,
            "stage_output": "last",
            "batch_size": 32,
            "sampling": "shuffle",
            "auc_loss": "square",
        },
        "run": {"rounds": rounds, "eval_every": rounds, "metrics": ["auroc"], "threads": 1},
        "output": {"plots": False},
    }


def run_fedrisk(raw: dict[str, Any]) -> dict[str, float]:
    """``run_experiment`` end to end: wall seconds, and wall / CPU seconds of its rounds phase
    (``run_simulation``: every round, the runner's callbacks, the final evaluation), AUROC."""
    from fedrisk.experiment import resolve_config, run_experiment, runner

    phase: dict[str, float] = {}
    inner = runner.run_simulation

    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            phase["rounds_s"], phase["rounds_cpu_s"] = time.perf_counter() - wall, time.process_time() - cpu

    runner.run_simulation = timed
    try:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            result = run_experiment(resolve_config(raw), os.path.join(out, "run"), progress="none")
            total = time.perf_counter() - start
    finally:
        runner.run_simulation = inner
    return {"total_s": total, **phase, "auroc": float(result.summary["final"]["test_auroc"])}


def auroc(scores: Tensor, labels: Tensor) -> float:
    """The Mann-Whitney AUROC (ties counted as one half)."""
    pos, neg = scores[labels == 1], scores[labels != 1]
    order = torch.cat([pos, neg]).argsort()
    ranks = torch.empty_like(order, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(order) + 1, dtype=torch.float64)
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


class HandLoop:
    """The hand-written loop's state and one step (see the module docstring)."""

    def __init__(self, raw: dict[str, Any], fed: Any, seed: int = 0) -> None:
        from fedrisk.models import build_model

        self.alg = raw["algorithm"]
        self.x, self.y = fed.clients[0].x, fed.clients[0].y
        torch.manual_seed(seed)
        opts = {k: v for k, v in raw["model"].items() if k != "name"}
        self.net: nn.Module = build_model(raw["model"]["name"], tuple(self.x.shape[1:]), 1, **opts)
        self.p = float((self.y == 1).double().mean())  # the positive ratio of the (only) client's data
        self.a, self.b, self.alpha = (torch.zeros((), requires_grad=True) for _ in range(3))
        self.params = [*self.net.parameters(), self.a, self.b]
        self.ref = [q.detach().clone() for q in self.params]
        self.lr, self.n = self.alg["lr"], len(self.y)
        self.perm, self.pos = torch.randperm(self.n), 0

    def step(self, t: int) -> None:
        alg, bs, p, lam = self.alg, self.alg["batch_size"], self.p, self.alg["prox_coef"]
        if t > 0 and t % alg["stage_iters"] == 0:  # a new stage: smaller steps, new prox reference
            self.lr /= alg["lr_decay"]
            self.ref = [q.detach().clone() for q in self.params]
        if self.pos + bs > self.n:
            self.perm, self.pos = torch.randperm(self.n), 0
        idx = self.perm[self.pos : self.pos + bs]
        self.pos += bs
        a, b, alpha = self.a, self.b, self.alpha
        h = self.net(self.x[idx])[:, 0]
        yp = (self.y[idx] == 1).to(h.dtype)
        loss = (
            (1 - p) * (h - a) ** 2 * yp
            + p * (h - b) ** 2 * (1 - yp)
            + 2 * (1 + alpha) * (p * h * (1 - yp) - (1 - p) * h * yp)
            - p * (1 - p) * alpha**2
        ).mean()
        grads = torch.autograd.grad(loss, [*self.params, alpha])
        with torch.no_grad():
            for q, g, r in zip(self.params, grads, self.ref):
                q.sub_(self.lr * (g + lam * (q - r)))
            alpha.add_(self.lr * grads[-1])

    def evaluate(self, fed: Any) -> float:
        with torch.no_grad():
            return auroc(self.net(fed.test.x)[:, 0], fed.test.y)


def load(raw: dict[str, Any], seed: int = 0) -> Any:
    from fedrisk.data import build_federation

    data = raw["data"]
    return build_federation(
        data["dataset"], data["partition"], data["num_clients"], seed=seed, binarize=data["binarize"]
    )


def run_hand(raw: dict[str, Any], seed: int = 0) -> dict[str, float]:
    """The hand-written loop end to end (data loading included), its rounds phase (after the
    data and the model are built: every step and the final evaluation), AUROC."""
    start = time.perf_counter()
    fed = load(raw, seed)
    loop = HandLoop(raw, fed, seed)
    wall, cpu = time.perf_counter(), time.process_time()
    for t in range(raw["run"]["rounds"]):
        loop.step(t)
    score = loop.evaluate(fed)
    end = time.perf_counter()
    return {"total_s": end - start, "rounds_s": end - wall, "rounds_cpu_s": time.process_time() - cpu, "auroc": score}


def interleaved(raw: dict[str, Any], rounds: int) -> dict[str, float]:
    """fedrisk's rounds (``Simulation.step`` plus the runner's per-round callbacks: training
    metrics, the wall-clock checkpoint test) and the hand-written steps alternating one by one
    (the order swapped every round); CPU seconds of each step.  Robust to a drifting load."""
    from fedrisk.experiment import resolve_config
    from fedrisk.experiment.runner import Checkpointer, TrainMetrics, build_simulation

    cfg = resolve_config(raw)
    sim = build_simulation(cfg).simulation
    fed = sim.federation
    loop = HandLoop(raw, fed)
    train = TrainMetrics()
    ckpt = Checkpointer(Path(os.devnull), {}, rounds, rounds, 0, None, None, lambda: 0.0, seconds=1e9)  # type: ignore[arg-type]
    mine, theirs = [], []
    for t in range(rounds):
        for impl in ("f", "h") if t % 2 == 0 else ("h", "f"):
            c = time.process_time()
            if impl == "f":
                report = sim.step()
                train.on_round_end(sim, report)
                ckpt.on_round_end(sim, report)
                mine.append(time.process_time() - c)
            else:
                loop.step(t)
                theirs.append(time.process_time() - c)
    skip = min(20, rounds // 10)  # warm-up rounds
    ratios = [m / h for m, h in zip(mine[skip:], theirs[skip:]) if h > 0]
    return {
        "fedrisk_cpu_ms_per_round": 1e3 * statistics.median(mine[skip:]),
        "hand_cpu_ms_per_round": 1e3 * statistics.median(theirs[skip:]),
        "median_ratio": statistics.median(ratios),
        "ratio_of_sums": sum(mine[skip:]) / sum(theirs[skip:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--stage-iters", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument(
        "--interleaved", action="store_true", help="only the round-by-round interleaved CPU comparison (no end to end)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw = config(args.rounds, args.stage_iters)
    if args.interleaved:
        got = interleaved(raw, args.rounds)
        print(
            f"interleaved, {args.rounds} rounds: fedrisk {got['fedrisk_cpu_ms_per_round']:.2f} ms CPU per round, "
            f"hand {got['hand_cpu_ms_per_round']:.2f} ms; median ratio {got['median_ratio']:.3f}, "
            f"ratio of sums {got['ratio_of_sums']:.3f} (target <= 1.15); load average {os.getloadavg()[0]:.1f}"
        )
        if args.json:
            save_json(args.json, {"rounds": args.rounds, **got, "load_average": os.getloadavg()[0]})
        return
    run_fedrisk(config(20, 10))  # warm-up: imports, the data set's file cache
    run_hand(config(20, 10))
    rows = []
    for i in range(args.pairs):
        order = ("fedrisk", "hand") if i % 2 == 0 else ("hand", "fedrisk")
        got = {impl: {} for impl in order}
        for impl in order:
            got[impl] = run_fedrisk(raw) if impl == "fedrisk" else run_hand(raw)
        row = {"pair": i + 1, "load_average": os.getloadavg()[0]}
        for key in ("total_s", "rounds_s", "rounds_cpu_s"):
            row[key] = got["fedrisk"][key] / got["hand"][key]
        row.update({f"{impl}_{k}": v for impl in order for k, v in got[impl].items()})
        rows.append(row)
        print(
            f"pair {i + 1}: fedrisk {got['fedrisk']['total_s']:.2f} s end to end, rounds "
            f"{got['fedrisk']['rounds_s']:.2f} s wall / {got['fedrisk']['rounds_cpu_s']:.2f} s CPU "
            f"(AUROC {got['fedrisk']['auroc']:.4f}); hand {got['hand']['total_s']:.2f} s, rounds "
            f"{got['hand']['rounds_s']:.2f} s / {got['hand']['rounds_cpu_s']:.2f} s CPU "
            f"(AUROC {got['hand']['auroc']:.4f}); "
            f"ratios end to end {row['total_s']:.3f}, rounds wall {row['rounds_s']:.3f}, rounds CPU "
            f"{row['rounds_cpu_s']:.3f}; load {row['load_average']:.1f}",
            flush=True,
        )
    for key, what in (("total_s", "end to end"), ("rounds_s", "rounds, wall"), ("rounds_cpu_s", "rounds, CPU")):
        ratios = [r[key] for r in rows]
        print(
            f"fedrisk / hand-written, {args.rounds} rounds, {what}: median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}; target <= 1.15)"
        )
    if args.json:
        save_json(args.json, {"rounds": args.rounds, "pairs": rows})


if __name__ == "__main__":
    main()
