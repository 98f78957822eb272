"""PERM's regulariser lam: the weights of eq. (2) move from local-only to n_j / n, and what that
does to personal accuracy (paper 003, spec pitfall P7; a reading of ``fedrisk sweep
configs/perm/synthetic_lambda.toml``).

For every finished run ``RUNS/algorithm.lam=<lam>/seed=<s>/`` it reads the final weights (the
checkpoint's ``alpha``, computed at the run's last global model) and the final personal metrics
(``summary.json``), and prints one table row per lam: the self weight alpha_i(i), the number of
non-zero weights per row, the weight mass on same-cluster clients, the largest distance
``max_ij |alpha_i(j) - n_j / n|`` to FedAvg's weights, personal accuracy, bottom-10% and log-loss.
For the curve it recomputes every client's full local gradient at one run's global model and
solves eq. (2) exactly on a fine lam grid (the weights depend on lam only through eq. (2) once
the gradients are fixed), and writes ``perm_synthetic_lambda.png`` into ``--out``.

    python benchmarks/perm_lambda.py runs/perm_synthetic_lambda --out docs/results/img
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.local import full_batch_objective
from fedrisk.algorithms.perm import mixing_weights, squared_distances
from fedrisk.autodiff import value_and_grad
from fedrisk.experiment.config import load_config
from fedrisk.experiment.runner import build_simulation, load_checkpoint
from fedrisk.tree import tree_flatten_vector


def weight_stats(alpha: torch.Tensor, clusters: torch.Tensor, sizes: torch.Tensor) -> dict[str, float]:
    same = clusters[:, None] == clusters[None, :]
    target = (sizes / sizes.sum()).expand_as(alpha)
    return {
        "self": float(alpha.diag().mean()),
        "nonzero": float((alpha > 0).sum(1).double().mean()),
        "same_cluster": float((alpha * same).sum(1).mean()),
        "to_samples": float((alpha - target).abs().max()),
    }


def read_runs(runs: Path) -> list[dict]:
    rows = []
    for run in sorted(runs.glob("algorithm.lam=*/seed=*")):
        if not (run / "summary.json").exists():
            continue
        lam = float(run.parent.name.split("=", 1)[1])
        ckpt = load_checkpoint(run / "checkpoint.pt")
        server = ckpt["simulation"]["server_state"]
        final = json.loads((run / "summary.json").read_text())["final"]
        rows.append({"lam": lam, "run": run, "alpha": server["alpha"].double(), "w": server["w"], "final": final})
    return sorted(rows, key=lambda r: r["lam"])


def gradients_at(run: Path, w: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sim = build_simulation(load_config(run / "config.toml")).simulation
    alg, fed = sim.algorithm, sim.federation
    f = value_and_grad(full_batch_objective(alg.model.apply, alg.loss))
    grads = []
    for s in fed.clients:  # f_k's full local gradient, as PERM's estimate round computes it
        grads.append(tree_flatten_vector(f(w, LocalData(s.x, s.y, torch.tensor(len(s))))[1]))
    sizes = torch.tensor(fed.client_sizes, dtype=torch.float64)
    # the cluster of a client: the sign of its features' mean (x ~ N(+-0.2 1, .) in the two clusters)
    clusters = torch.tensor([int(float(s.x.mean()) > 0) for s in fed.clients])
    return torch.stack(grads).double(), clusters, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="folder for perm_synthetic_lambda.png")
    args = parser.parse_args()
    rows = read_runs(args.runs)
    if not rows:
        raise SystemExit(f"no finished runs under {args.runs}/algorithm.lam=*/seed=*")
    ref = min(rows, key=lambda r: abs(math.log10(r["lam"]) - 1.0))  # lam = 10's global model
    grads, clusters, sizes = gradients_at(ref["run"], ref["w"])
    print(
        "| lam | self weight | non-zeros / row | same-cluster mass | max abs(alpha - n_j/n) "
        "| personal accuracy | bottom-10% | personal log-loss |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = weight_stats(r["alpha"], clusters, sizes)
        f = r["final"]
        print(
            f"| {r['lam']:g} | {s['self']:.3f} | {s['nonzero']:.1f} | {s['same_cluster']:.3f} | {s['to_samples']:.3f} "
            f"| {f['personal_accuracy_mean']:.4f} | {f['personal_accuracy_bottom10']:.4f} "
            f"| {f['personal_log_loss_mean']:.4f} |"
        )
    if args.out is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    D = squared_distances(grads)
    lams = torch.logspace(-3, 5, 49, dtype=torch.float64)
    curve = [weight_stats(mixing_weights(D, sizes, float(lam)), clusters, sizes) for lam in lams]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (
        ("self", "self weight alpha_i(i)"),
        ("same_cluster", "same-cluster mass"),
        ("to_samples", "max |alpha_i(j) - n_j/n|"),
    ):
        ax1.semilogx(lams, [c[key] for c in curve], label=label)
    ax1.axhline(1.0 / len(sizes), color="grey", lw=0.8, ls=":", label="n_j / n = 1/N")
    ax1.set_xlabel("lam")
    ax1.set_title(f"eq. (2) at the lam = {ref['lam']:g} run's final global model")
    ax1.legend(fontsize=8)
    x = [r["lam"] for r in rows]
    ax2.semilogx(x, [r["final"]["personal_accuracy_mean"] for r in rows], "o-", label="personal accuracy")
    ax2.semilogx(x, [r["final"]["personal_accuracy_bottom10"] for r in rows], "s--", label="bottom-10%")
    ax2.semilogx(x, [r["final"]["personal_log_loss_mean"] for r in rows], "^:", label="personal log-loss")
    ax2.set_xlabel("lam")
    ax2.set_title("PERM runs (round 153)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "perm_synthetic_lambda.png", dpi=110)
    print(f"wrote {args.out / 'perm_synthetic_lambda.png'}")


if __name__ == "__main__":
    main()
