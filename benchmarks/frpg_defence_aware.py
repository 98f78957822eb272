"""FRPG / LFRPG against the defence-aware max-norm attack on MNIST-5k (issue: an honest answer).

Every faulty worker sends ``-lambda mu_h / ||mu_h||`` (``max_norm``: after FRPG's projection onto
the lambda-ball this is the largest message admitted, pointing against the honest mean).  The
script measures, at a short horizon (``--rounds`` communication rounds; LFRPG: ``--frames``
frames of T = 10 slots), the final test accuracy of

* FRPG and LFRPG with B in ``--fractions`` faulty workers out of 20 (the odd workers 1, 3, ...,
  2B - 1, so every digit keeps an honest worker; the class_groups partition gives workers 2p
  and 2p + 1 digit p), next to no attack and to IPM (epsilon = 0.1) at B = 4;
* FRPG whose server runs a pre-aggregation on the received messages before projecting each
  and summing them (``algorithm.pre``): nearest-neighbour mixing with f = B (Allouah et al. 2023)
  or bucketing with s = 2 (Karimireddy et al. 2022; the bucket means' sum is scaled by n / #buckets);
* FRPG at other constant lambdas and with the growing schedule ``lambda_k = lambda_0 sqrt(k)``
  (``algorithm.lam_schedule = "sqrt"``; max_norm reads lambda_k of the round).

configs/byzantine/frpg_defended.toml runs the pre-aggregations and schedules as a sweep.

    OMP_NUM_THREADS=1 python benchmarks/frpg_defence_aware.py --rounds 60 --frames 20 \\
        --out docs/results/byzantine_frpg_defence_aware.json

Results and the mechanism: ``docs/results/byzantine_worst_case.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from fedrisk.algorithms import FRPG, LFRPG
from fedrisk.attacks import IPM, MaxNorm
from fedrisk.experiment.config import load_config
from fedrisk.experiment.runner import build_simulation
from fedrisk.runtime.simulation import Simulation

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "byzantine" / "mnist5k.toml"
FRPG_SETTINGS = [
    "algorithm.lam=1.6",
    "algorithm.mu=1e-3",
    "algorithm.delta=0.003",
    "algorithm.delta_server=0.003",
    "algorithm.lipschitz=223.1",
    "algorithm.batch_size=10",
]


class Alignment(MaxNorm):
    """max_norm (or, with ``forge_nothing``, no forgery) that records ``c_k = ||mean_h g|| / max_h ||g||``,
    the alignment of the honest messages (1: all parallel; honest messages have norm ~lambda)."""

    def __init__(self, forge_nothing: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.forge_nothing = forge_nothing
        self.c: list[float] = []

    def forge(self, honest: torch.Tensor, own: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        top = float(torch.linalg.vector_norm(honest, dim=1).max())
        self.c.append(float(torch.linalg.vector_norm(honest.mean(dim=0))) / top if top > 0 else math.nan)
        return own.clone() if self.forge_nothing else super().forge(honest, own, gen)


def accuracy(sim: Simulation) -> float:
    test = sim.federation.test
    logits = sim.algorithm.predict(sim.algorithm.global_params(sim.server_state), test.x)
    return float((logits.argmax(1) == test.y).double().mean())


def run(alg: Any, fed: Any, attack: Any, byzantine: list[int], rounds: int, seed: int) -> float:
    sim = Simulation(
        alg, fed, seed=seed, executor="vectorized", dtype=torch.float64, attack=attack, byzantine=byzantine
    )
    for _ in range(rounds):
        sim.step()
    return accuracy(sim)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--fractions", type=int, nargs="*", default=[2, 4, 6, 8])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()
    cfg = load_config(CONFIG, FRPG_SETTINGS)
    built = build_simulation(cfg, seed=args.seed)
    fed, frpg = built.simulation.federation, built.simulation.algorithm
    assert isinstance(frpg, FRPG)
    fields = {f.name: getattr(frpg, f.name) for f in dataclasses.fields(FRPG)}
    lfrpg = LFRPG(**fields, local_slots_per_round=10, variant="seq")
    odd = lambda b: [2 * i + 1 for i in range(b)]  # noqa: E731
    rows: list[dict[str, Any]] = []

    def record(method: str, attack: str, b: int, acc: float, c: float, t: float) -> None:
        row = {"method": method, "attack": attack, "byzantine": b, "test_accuracy": acc, "alignment": c, "seconds": t}
        rows.append(row)
        print(f"| {method} | {attack} | {b} | {acc:.4f} | {c:.3f} | {t:.0f} |", flush=True)

    def timed(method: str, attack_name: str, b: int, alg: Any, attack: Any, rounds: int) -> None:
        t = time.perf_counter()
        acc = run(alg, fed, attack, odd(b) if b else [1], rounds, args.seed)
        c = getattr(attack, "c", [])[-10:]
        record(method, attack_name, b, acc, sum(c) / len(c) if c else math.nan, time.perf_counter() - t)

    print(f"MNIST-5k, seed {args.seed}, load average {os.getloadavg()[0]:.1f}, torch threads {torch.get_num_threads()}")
    print("alignment c = ||mean of the honest messages|| / their largest norm, mean over the last 10 rounds")
    print("| method | attack | B of 20 | final test accuracy | alignment c | wall s |")
    print("|---|---|---:|---:|---:|---:|")
    timed("frpg", "none", 0, frpg, Alignment(forge_nothing=True), args.rounds)  # client 1 replies honestly
    timed("lfrpg", "none", 0, lfrpg, Alignment(forge_nothing=True), args.frames)
    timed("frpg", "ipm", 4, frpg, IPM(0.1), args.rounds)
    for b in args.fractions:
        timed("frpg", "max_norm", b, frpg, Alignment(), args.rounds)
        timed("lfrpg", "max_norm", b, lfrpg, Alignment(), args.frames)
    for b in (4, 8):
        nnm = dataclasses.replace(frpg, pre="nnm", pre_f=b)
        timed("frpg+nnm", "max_norm", b, nnm, Alignment(), args.rounds)
        bucketing = dataclasses.replace(frpg, pre="bucketing", bucket_size=2)
        timed("frpg+bucketing(s=2)", "max_norm", b, bucketing, Alignment(), args.rounds)
    for lam in (0.4, 6.4):
        timed(f"frpg(lambda={lam})", "max_norm", 4, dataclasses.replace(frpg, lam=lam), Alignment(), args.rounds)
    schedule = dataclasses.replace(frpg, lam=0.4, lam_schedule="sqrt")
    timed("frpg(lambda_k=0.4 sqrt(k))", "max_norm", 4, schedule, Alignment(), args.rounds)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"rounds": args.rounds, "frames": args.frames, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
