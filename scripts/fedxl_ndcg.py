"""Federated NDCG on the generated ranking set: FeDXL2 (SONG) against Local Pair and centralised
SONG, 3 seeds, final test NDCG@5 (docs/results/fedxl.md, "Federated NDCG").

The same comparison runs from the command line with validation selection and tuning
(``configs/fedxl/ranking_ndcg.toml``, ``run.metrics = ["ndcg@5"]``); this script drives the
simulations through the API and reads the test NDCG@k the algorithms report (``state_metrics``).

Usage::

    python scripts/fedxl_ndcg.py [--seeds 3] [--rounds 30] [--shift 0.5]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from fedrisk.algorithms.fedxl_ndcg import CentralizedNDCG, FeDXL2NDCG, LocalNDCG
from fedrisk.algorithms.local_only import centralized
from fedrisk.data.sources.ranking import synthetic_ranking_federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.runtime.simulation import Simulation


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30, help="training rounds (FeDXL2 adds its bootstrap round)")
    parser.add_argument("--shift", type=float, default=0.5, help="per-client feature shift")
    parser.add_argument("--local-steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, list[float]] = {"fedxl2_ndcg": [], "local_ndcg": [], "centralized_ndcg": []}
    for seed in range(args.seeds):
        fed = synthetic_ranking_federation(
            4, queries_per_client=10, items_per_query=20, test_queries_per_client=10, dim=8, shift=args.shift,
            split="items", seed=seed,
        )  # fmt: skip
        common = {"num_queries": fed.info["num_queries"], "local_steps": args.local_steps, "batch_pos": 8,
                  "batch_neg": 8, "batch_partners": 8, "lr": args.lr, "gamma": 0.9, "eval_k": 5}  # fmt: skip
        for cls, f, rounds in (
            (FeDXL2NDCG, fed, args.rounds + 1),
            (LocalNDCG, fed, args.rounds),
            (CentralizedNDCG, centralized(fed), args.rounds),
        ):
            alg = cls(model=FunctionalModel(build_model("logreg", (8,), 1)), **common)
            sim = Simulation(alg, f, seed=seed, dtype=torch.float64)
            for _ in range(rounds):
                sim.step()
            results[cls.name].append(alg.state_metrics(sim.server_state, f)["test_ndcg@5"])
    for name, values in results.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        per_seed = [round(v, 4) for v in values]
        print(f"{name:18s} test NDCG@5 {statistics.mean(values):.4f} ± {spread:.4f}  per seed {per_seed}")
    return results


if __name__ == "__main__":
    main()
