"""The cost of one CODASCA round against one FedAvg round (and one CODA+ round).

Same model, data, window and batch, the sequential executor, one thread: a CODASCA round
runs I local primal-dual steps with the control-variate correction, then the server averages
(v, α) and (c_v, c_α); a FedAvg round runs I local SGD steps on the cross-entropy of the
same sigmoid scorer.  The target (issue 4) is CODASCA <= ~1.2x FedAvg per round; the extra
over CODA+ is the control variates.

The rounds of the algorithms are interleaved (one round of each, repeatedly) so that a machine
whose load drifts slows all of them alike; the report is the median over the repeats (CPU time
of the process: steadier than wall time on a shared machine).  ``--autograd-baseline`` adds
"codasca_autograd": CODASCA whose local step differentiates the whole AUC objective with
autograd (:class:`CODASCAAutograd`, the implementation before the closed-form path), to show
what the closed form saves.

Recorded results: ``benchmarks/RESULTS_codasca.md`` (2-core shared CPU, torch 2.13, one thread,
batch 32, K = 8 clients of the spec §7.3 class-split data):

    model, window                 CODASCA / FedAvg   codasca_autograd / FedAvg
    MLP 32-32-1, I = 32           0.97 - 1.02        1.31 - 1.42 (recorded before: 1.26 - 1.49)
    MLP 32-256-256-1, I = 32      1.05 - 1.09        1.31
    CNN 8-16 / FC 64, I = 8       0.99 - 1.04        1.03 - 1.07

Where the time went before (cProfile of 10 rounds, MLP 32-32-1): autograd through the
objective's ~15 small operations and through three more scalar leaves (a, b, α), and
``value_and_grad``'s pytree flatten / unflatten of the leaf list (~3 µs per step each way).
The control variates themselves cost nothing measurable (CODASCA / CODA+ ~ 1).  Now only the
scorer goes through autograd (``torch.autograd.grad(h, w, grad_outputs=∂F/∂h)``) and
``∂F/∂h, ∂F/∂a, ∂F/∂b, ∂F/∂α`` come in closed form
(:func:`fedrisk.objectives.auc.auc_minmax_weighted_directions`), bit-for-bit equal to
autograd's.  Bytes per client and round: CODASCA 2x CODA+ both ways (the ledger's numbers).

Usage::

    .venv/bin/python benchmarks/codasca_round_cost.py                 # MLP 32-32-1, I = 32
    .venv/bin/python benchmarks/codasca_round_cost.py --hidden 256 256 --repeats 20
    .venv/bin/python benchmarks/codasca_round_cost.py --model cnn --window 8 --repeats 12
    .venv/bin/python benchmarks/codasca_round_cost.py --autograd-baseline --json results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from _timing import measure  # this script's folder
from torch import Tensor

from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.codasca import CODASCA, CODAPlus
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.primal_dual import Directions
from fedrisk.autodiff import value_and_grad
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.sources.synthetic import class_split_auc_federation
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.auc import AUCWeights, auc_label_weights, auc_minmax_weighted
from fedrisk.objectives.supervised import binary_cross_entropy_probs
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import Tree


@dataclass(frozen=True)
class CODASCAAutograd(CODASCA):
    """CODASCA whose local step differentiates the whole objective with autograd: ``(w, a, b, α)``
    as leaves of :func:`fedrisk.autodiff.value_and_grad` through
    :func:`~fedrisk.objectives.auc.auc_minmax_weighted` (the implementation before the
    closed-form path; the same numbers, bit for bit).  Only the defaults of the benchmark
    (no clipping, the gradient dual direction) are supported."""

    def objective_directions(self, state: Tree, data: LocalData, draws: Tree, v: Tree, alpha: Tree) -> Directions:
        p, idx = state["p"], draws["batches"]
        weights = auc_label_weights(data.y[idx], p)
        margin = self.margin if self.auc_loss == "margin" else None
        names = list(v["model"])
        n = len(names)

        def objective(var: list[Tensor], x: Tensor, w: AUCWeights) -> Tensor:
            h = self.scores(dict(zip(names, var[:n])), x)
            return auc_minmax_weighted(h, var[n], var[n + 1], var[n + 2], w, margin)

        value_grad = value_and_grad(objective)

        def directions(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
            value, g = value_grad([*xs, *ys], data.x[idx[t]], weights.row(t))
            return value, g[: n + 2], g[n + 2 :]

        return directions


def federation(args: argparse.Namespace) -> Federation:
    """The spec §7.3 class-split data; for the CNN as 1 x 28 x 28 "images" (784 features)."""
    if args.model == "mlp":
        return class_split_auc_federation(args.clients, seed=0)
    fed = class_split_auc_federation(args.clients, seed=0, dim=28 * 28)

    def image(s: Samples) -> Samples:
        return Samples(s.x.reshape(len(s), 1, 28, 28), s.y, s.attrs)

    return Federation(fed.name, [image(c) for c in fed.clients], 2, test=image(fed.test), info=fed.info)


def build(args: argparse.Namespace) -> dict[str, Simulation]:
    fed = federation(args)
    shape = tuple(fed.clients[0].x.shape[1:])
    if args.model == "mlp":
        net = build_model("mlp", shape, 1, hidden=list(args.hidden), output_activation="sigmoid")
    else:  # configs/codasca/fmnist_ih.toml's CNN
        net = build_model("cnn", shape, 1, channels=[8, 16], hidden=[64], output_activation="sigmoid")
    model = FunctionalModel(net)
    common: dict[str, Any] = {"model": model, "lr": args.lr, "batch_size": args.batch_size}
    algorithms = {
        "fedavg": FedAvg(loss=binary_cross_entropy_probs, local_steps=args.window, weighting="uniform", **common),
        "codaplus": CODAPlus(window=args.window, stage_iters=args.stage_iters, **common),
        "codasca": CODASCA(window=args.window, stage_iters=args.stage_iters, **common),
    }
    if args.autograd_baseline:
        algorithms["codasca_autograd"] = CODASCAAutograd(window=args.window, stage_iters=args.stage_iters, **common)
    return {name: Simulation(alg, fed, seed=0) for name, alg in algorithms.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=32, help="local steps per round (I = FedAvg's local_steps)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the scorer (cnn: conv 8-16, FC 64)")
    parser.add_argument("--hidden", type=int, nargs="*", default=[32], help="MLP hidden widths")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--stage-iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--autograd-baseline", action="store_true", help="also time CODASCA with autograd through the whole objective"
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sims = build(args)
    times = measure(sims, args.repeats, args.warmup)
    median = {clock: {n: statistics.median(t[clock]) for n, t in times.items()} for clock in ("cpu", "wall")}
    last = {name: sim.ledger.rounds[-1] for name, sim in sims.items()}
    ratios = {
        clock: {
            "codasca/fedavg": m["codasca"] / m["fedavg"],
            "codasca/codaplus": m["codasca"] / m["codaplus"],
            "codaplus/fedavg": m["codaplus"] / m["fedavg"],
            **({"codasca_autograd/fedavg": m["codasca_autograd"] / m["fedavg"]} if "codasca_autograd" in m else {}),
        }
        for clock, m in median.items()
    }
    result: dict[str, Any] = {
        "config": vars(args),
        "median_round_s": median,
        "ratios": ratios,
        "bytes_per_client_round": {n: {"down": r["down"][0], "up": r["up"][0]} for n, r in last.items()},
        "torch": torch.__version__,
    }
    scorer = f"MLP hidden {args.hidden}" if args.model == "mlp" else "CNN conv 8-16 FC 64 on 1x28x28"
    print(
        f"window I = {args.window}, batch {args.batch_size}, {scorer}, K = {args.clients}, "
        f"{args.repeats} interleaved repeats, {args.threads} thread(s)"
    )
    for name in sims:
        b = result["bytes_per_client_round"][name]
        print(
            f"  {name:16s} median {1e3 * median['cpu'][name]:8.2f} ms CPU ({1e3 * median['wall'][name]:8.2f} ms wall)"
            f" per round; bytes/client/round down {b['down']:7d} up {b['up']:7d}"
        )
    for clock in ("cpu", "wall"):
        r = result["ratios"][clock]
        print(
            f"  {clock:4s}: CODASCA / FedAvg = {r['codasca/fedavg']:.3f} (target <= 1.2), "
            f"CODASCA / CODA+ = {r['codasca/codaplus']:.3f}, CODA+ / FedAvg = {r['codaplus/fedavg']:.3f}"
            + (f", CODASCA-autograd / FedAvg = {r[key]:.3f}" if (key := "codasca_autograd/fedavg") in r else "")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
