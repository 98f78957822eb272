"""FeDXL spec §7.2 A/B on the client-offset federation: cross-client pairs against local pairs.

A (AUROC, linear f): FeDXL1 vs Local Pair vs centralised pairwise SGD, PSM loss on a linear score.
B (pAUC, f = λ log): FeDXL2 vs Local Pair vs centralised SOX, inner exp(σ(b − a)/λ) with λ = 0.3,
γ = β = 0.1 (the spec's bounded surrogate for a linear score).
N = 8 clients of 300 rows (1:5), K = 16, B1 = B2 = 16, lr 1, 60 training rounds, float64, the
vectorised executor; seeds 0, 1, 2 (the seed draws the data and the run).  Prints one line per
seed and the mean ± std.

    .venv/bin/python scripts/fedxl_client_offsets.py            # both parts, 3 seeds
    .venv/bin/python scripts/fedxl_client_offsets.py --part B --seeds 0
"""

from __future__ import annotations

import argparse
import statistics

import torch

from fedrisk.algorithms.fedxl import FeDXL1, FeDXL2
from fedrisk.algorithms.local_only import centralized
from fedrisk.algorithms.local_pair import CentralizedPair, LocalPair
from fedrisk.data.client_offsets import client_offset_federation
from fedrisk.metrics.classification import auroc, partial_auroc
from fedrisk.models import FunctionalModel, build_model
from fedrisk.runtime.simulation import Simulation


def run(part: str, seed: int, rounds: int) -> dict[str, float]:
    fed, test = client_offset_federation(8, rows=300, test_rows=100, seed=seed)
    model = FunctionalModel(build_model("logreg", (13,), 1))
    kw = {"model": model, "lr": 1.0, "local_steps": 16, "batch_pos": 16, "batch_neg": 16, "score": "identity"}
    if part == "A":
        algs = {"FeDXL1": FeDXL1(**kw), "Local Pair": LocalPair(**kw), "Centralised": CentralizedPair(**kw)}
    else:
        pauc = {"xrisk": "pauc", "surrogate": "sigmoid", "lam": 0.3, "gamma": 0.1, "beta": 0.1}
        algs = {
            "FeDXL2": FeDXL2(**kw, **pauc),
            "Local Pair": LocalPair(**kw, **pauc),
            "Centralised SOX": CentralizedPair(**kw, **pauc),
        }
    out = {}
    for name, alg in algs.items():
        data = centralized(fed) if getattr(alg, "requires_pooled_data", False) else fed
        sim = Simulation(alg, data, seed=seed, dtype=torch.float64, executor="vectorized")
        for _ in range(rounds + int(alg.federated_pairs)):  # FeDXL: + the bootstrap round
            sim.step()
        s, y = alg.predict(sim.server_state["params"], test.x).numpy(), test.y.numpy()
        out[name] = auroc(s, y) if part == "A" else partial_auroc(s, y, 0.3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("A", "B", "both"), default="both")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for part in ("A", "B") if args.part == "both" else (args.part,):
        metric = "test AUROC" if part == "A" else "test pAUC(FPR <= 0.3), plain A / max_fpr"
        print(f"part {part}: {metric}")
        rows = []
        for seed in args.seeds:
            rows.append(run(part, seed, args.rounds))
            print(f"  seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in rows[-1].items()), flush=True)
        for name in rows[0]:
            vals = [r[name] for r in rows]
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            print(f"  {name:16s} {statistics.mean(vals):.4f} ± {std:.4f}")


if __name__ == "__main__":
    main()
