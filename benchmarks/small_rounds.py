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
    .venv/bin/python benchmarks/small_rounds.py --rounds 500 --pairs 2 --json /tmp/small_rounds.json

Results: ``benchmarks/RESULTS.md`` (section "Many small rounds").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
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


def run_hand(raw: dict[str, Any], seed: int = 0) -> dict[str, float]:
    """The hand-written loop end to end (data loading included), its rounds phase (after the
    data and the model are built: every step and the final evaluation), AUROC."""
    from fedrisk.data import build_federation
    from fedrisk.models import build_model

    start = time.perf_counter()
    data, alg, rounds = raw["data"], raw["algorithm"], raw["run"]["rounds"]
    fed = build_federation(
        data["dataset"], data["partition"], data["num_clients"], seed=seed, binarize=data["binarize"]
    )
    x, y = fed.clients[0].x, fed.clients[0].y
    torch.manual_seed(seed)
    opts = {k: v for k, v in raw["model"].items() if k != "name"}
    net: nn.Module = build_model(raw["model"]["name"], tuple(x.shape[1:]), 1, **opts)
    wall, cpu = time.perf_counter(), time.process_time()
    p = float((y == 1).double().mean())  # the positive ratio of the (only) client's data
    a, b, alpha = (torch.zeros((), requires_grad=True) for _ in range(3))
    params = [*net.parameters(), a, b]
    ref = [q.detach().clone() for q in params]
    lr, lam, bs, n = alg["lr"], alg["prox_coef"], alg["batch_size"], len(y)
    perm, pos = torch.randperm(n), 0
    for t in range(rounds):
        if t > 0 and t % alg["stage_iters"] == 0:  # a new stage: smaller steps, new prox reference
            lr /= alg["lr_decay"]
            ref = [q.detach().clone() for q in params]
        if pos + bs > n:
            perm, pos = torch.randperm(n), 0
        idx = perm[pos : pos + bs]
        pos += bs
        h = net(x[idx])[:, 0]
        yp = (y[idx] == 1).to(h.dtype)
        loss = (
            (1 - p) * (h - a) ** 2 * yp
            + p * (h - b) ** 2 * (1 - yp)
            + 2 * (1 + alpha) * (p * h * (1 - yp) - (1 - p) * h * yp)
            - p * (1 - p) * alpha**2
        ).mean()
        grads = torch.autograd.grad(loss, [*params, alpha])
        with torch.no_grad():
            for q, g, r in zip(params, grads, ref):
                q.sub_(lr * (g + lam * (q - r)))
            alpha.add_(lr * grads[-1])
    with torch.no_grad():
        score = auroc(net(fed.test.x)[:, 0], fed.test.y)
    end = time.perf_counter()
    return {"total_s": end - start, "rounds_s": end - wall, "rounds_cpu_s": time.process_time() - cpu, "auroc": score}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--stage-iters", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    raw = config(args.rounds, args.stage_iters)
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
        with open(args.json, "w") as fh:
            json.dump({"rounds": args.rounds, "pairs": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
