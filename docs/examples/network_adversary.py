"""A custom min-max objective with a network adversary, from Python (issue 30).

Distributionally robust training of a classifier x against an adversary y that is itself a
small network: the adversary scores every row of a minibatch and puts a softmax weight on it,
``f(x, y; batch) = Σ_j softmax(A_y(u))_j ℓ(M_x(u_j), t_j) − (ρ/2)||y||²``; the classifier
minimises the weighted loss, the adversary maximises it (FESS-GDA, 4 clients with a label skew).
The objective is a plain function passed as ``objective_fn``; the adversary is ``dual_model``.

    python docs/examples/network_adversary.py
"""

from __future__ import annotations

import torch

from fedrisk import run_federation
from fedrisk.algorithms.fessgda import FESSGDA
from fedrisk.data import build_federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.minimax import per_sample_cross_entropy

RHO = 0.1


def reweighted_loss(x, y, batch):
    """The adversary's softmax weights over the batch times the classifier's per-row loss."""
    loss = per_sample_cross_entropy(batch.model(x, batch.inputs), batch.labels)
    weights = batch.dual_model(y, batch.inputs).reshape(-1).softmax(0)
    penalty = sum((p * p).sum() for p in y.values())
    return (weights * loss).sum() - 0.5 * RHO * penalty


def main(rounds: int = 30) -> dict:
    fed = build_federation("wine", "dirichlet", 4, seed=0, partition_options={"alpha": 0.5})
    classifier = FunctionalModel(build_model("logreg", (13,), 3))
    adversary = FunctionalModel(build_model("mlp", (13,), 1, hidden=[16]))
    alg = FESSGDA(model=classifier, dual_model=adversary, objective_fn=reweighted_loss, dual_set="ball",
                  dual_radius=5.0, lr=0.05, local_steps=5, batch_size=16)  # fmt: skip
    history = run_federation(fed, alg, rounds=rounds, metrics=["accuracy"], threads=1, progress=False, eval_every=10)
    return history.last()


if __name__ == "__main__":
    torch.set_num_threads(1)
    last = main()
    print(f"round {last['round']}: test accuracy {last['test_accuracy']:.3f}")
