"""PERM's learned mixing weights as heat maps (paper 003, Appendix A Fig. 6 analogue).

Two-stage PERM (Alg. 3): FedAvg with uniform averaging for R rounds, then every client's full
local gradient at w^R and the exact weights of eq. (2).  Two splits of the same data over 50
clients: one class per client (5 clients per class, sorted by class) and a uniformly random
split.  Writes one PNG per split and prints, per split, the mean number of non-zero weights per
row, the mean row entropy (ln 50 = 3.91) and the weight mass on clients holding the same class.

    python benchmarks/perm_weights.py --out docs/results/img            # digits (the spec's MNIST stand-in)
    python benchmarks/perm_weights.py --dataset fashion_mnist --rounds 50 --out docs/results/img
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import build_simulation


def learned_weights(dataset: str, partition: str, rounds: int, lam: float, seed: int) -> tuple[torch.Tensor, list]:
    options = {"classes_per_client": 1} if partition == "k_classes" else {}
    cfg = resolve_config(
        {
            "data": {
                "dataset": dataset,
                "num_clients": 50,
                "partition": partition,
                "partition_options": options,
                "dataset_options": {"flatten": True} if dataset == "fashion_mnist" else {},
            },
            "model": {"name": "logreg"},
            "algorithm": {
                "name": "perm_two_stage",
                "fedavg_rounds": rounds,
                "global_lr": 0.5,
                "local_steps": 10,
                "batch_size": 16,
                "lam": lam,
            },
            "run": {"rounds": rounds + 1, "seed": seed, "executor": "vectorized", "threads": 1},
        }
    )
    sim = build_simulation(cfg).simulation
    for _ in range(rounds + 1):
        sim.step()
    labels = [max(range(len(c)), key=lambda k: c[k]) for c in sim.federation.class_counts()]
    return sim.server_state["alpha"].double(), labels


def stats(alpha: torch.Tensor, labels: list) -> dict[str, float]:
    nz = (alpha > 0).sum(1).double().mean()
    p = alpha.clamp_min(1e-300)
    entropy = -(alpha * p.log()).sum(1).mean()
    lab = torch.tensor(labels)
    same = (alpha * (lab[:, None] == lab[None, :])).sum(1).mean()
    return {"nonzeros_per_row": float(nz), "row_entropy": float(entropy), "same_class_mass": float(same)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--rounds", type=int, default=100, help="FedAvg rounds of stage 1 (R)")
    ap.add_argument("--lam", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="docs/results/img")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for partition, title in (("k_classes", "one class per client"), ("iid", "random split")):
        alpha, labels = learned_weights(args.dataset, partition, args.rounds, args.lam, args.seed)
        order = sorted(range(50), key=lambda k: (labels[k], k)) if partition == "k_classes" else list(range(50))
        a = alpha[order][:, order]
        s = stats(alpha, labels)
        print(
            f"{args.dataset} {partition}: " + ", ".join(f"{k} = {v:.3f}" for k, v in s.items()),
            f"(ln 50 = {math.log(50):.2f})",
        )
        fig, ax = plt.subplots(figsize=(4.2, 3.6), dpi=120)
        im = ax.imshow(a.numpy(), cmap="viridis", vmin=0.0)
        ax.set_title(f"PERM weights, {title}\n{args.dataset}, lam = {args.lam:g}, R = {args.rounds}", fontsize=8)
        ax.set_xlabel("client j" + (" (sorted by class)" if partition == "k_classes" else ""), fontsize=8)
        ax.set_ylabel("client i", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        path = out / f"perm_weights_{args.dataset}_{'one_class' if partition == 'k_classes' else 'random'}.png"
        fig.savefig(path)
        plt.close(fig)
        print("wrote", path)


if __name__ == "__main__":
    main()
