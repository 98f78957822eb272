"""The cost of one CODASCA round against one FedAvg round (and one CODA+ round).

Same model, data, window and batch, the sequential executor, one thread: a CODASCA round
runs I local primal-dual steps with the control-variate correction, then the server averages
(v, α) and (c_v, c_α); a FedAvg round runs I local SGD steps on the cross-entropy of the
same sigmoid scorer.  The target (issue 4) is CODASCA <= ~1.2x FedAvg per round; the extra
over CODA+ is the control variates.

The rounds of the three algorithms are interleaved (one round of each, repeatedly) so that a
machine whose load drifts slows all three alike; the report is the median over the repeats.

Usage::

    .venv/bin/python benchmarks/codasca_round_cost.py                 # MLP 32-32-1, I = 32
    .venv/bin/python benchmarks/codasca_round_cost.py --window 8 --hidden 128 --repeats 60
    .venv/bin/python benchmarks/codasca_round_cost.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from fedrisk.algorithms.codasca import CODASCA, CODAPlus
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.data.synthetic import class_split_auc_federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import binary_cross_entropy_probs
from fedrisk.runtime.simulation import Simulation


def build(args: argparse.Namespace) -> dict[str, Simulation]:
    fed = class_split_auc_federation(args.clients, seed=0)
    dim = int(fed.clients[0].x.shape[1])
    model = FunctionalModel(build_model("mlp", (dim,), 1, hidden=list(args.hidden), output_activation="sigmoid"))
    common: dict[str, Any] = {"model": model, "lr": args.lr, "batch_size": args.batch_size}
    algorithms = {
        "fedavg": FedAvg(loss=binary_cross_entropy_probs, local_steps=args.window, weighting="uniform", **common),
        "codaplus": CODAPlus(window=args.window, stage_iters=args.stage_iters, **common),
        "codasca": CODASCA(window=args.window, stage_iters=args.stage_iters, **common),
    }
    return {name: Simulation(alg, fed, seed=0) for name, alg in algorithms.items()}


def measure(sims: dict[str, Simulation], repeats: int, warmup: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in sims}
    for i in range(warmup + repeats):
        for name, sim in sims.items():
            start = time.perf_counter()
            sim.step()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[name].append(elapsed)
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=32, help="local steps per round (I = FedAvg's local_steps)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, nargs="*", default=[32], help="MLP hidden widths")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--stage-iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sims = build(args)
    times = measure(sims, args.repeats, args.warmup)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    bytes_per_round = {name: (sim.ledger.rounds[-1]["down"], sim.ledger.rounds[-1]["up"]) for name, sim in sims.items()}
    result = {
        "config": vars(args),
        "median_round_s": median,
        "ratio_codasca_over_fedavg": median["codasca"] / median["fedavg"],
        "ratio_codasca_over_codaplus": median["codasca"] / median["codaplus"],
        "ratio_codaplus_over_fedavg": median["codaplus"] / median["fedavg"],
        "bytes_per_client_round": {n: {"down": d[0], "up": u[0]} for n, (d, u) in bytes_per_round.items()},
        "torch": torch.__version__,
    }
    print(
        f"window I = {args.window}, batch {args.batch_size}, MLP hidden {args.hidden}, K = {args.clients}, "
        f"{args.repeats} interleaved repeats, {args.threads} thread(s)"
    )
    for name in sims:
        d, u = result["bytes_per_client_round"][name]["down"], result["bytes_per_client_round"][name]["up"]
        print(f"  {name:9s} median {1e3 * median[name]:8.2f} ms/round   bytes/client/round down {d:6d} up {u:6d}")
    print(f"  CODASCA / FedAvg  = {result['ratio_codasca_over_fedavg']:.3f}  (target <= 1.2)")
    print(f"  CODASCA / CODA+   = {result['ratio_codasca_over_codaplus']:.3f}")
    print(f"  CODA+   / FedAvg  = {result['ratio_codaplus_over_fedavg']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
