"""Look inside a PERM run on a label-skew federation (paper 003): every ``--every`` rounds, each
client's own model on its own test split (mean and bottom-10%) and what the mixing weights
look like against the clients' classes (self weight, non-zeros per row, weight mass on clients
holding the same two classes / one shared class / no shared class), plus the global model's
test accuracy; at the end the five worst clients.  Runs the config's simulation in-process
(the same seeds and numbers as ``fedrisk run`` with the same overrides).

    python benchmarks/perm_diagnose.py configs/perm/fmnist.toml --rounds 153 \\
        --set algorithm.name=perm --set algorithm.lr=0.1 --set algorithm.lam=10.0 \\
        --set algorithm.global_lr=0.05 --set algorithm.global_batch=64 --set algorithm.warmup_rounds=51
    python benchmarks/perm_diagnose.py configs/perm/fmnist.toml --rounds 153 --trace 32 \\
        --set algorithm.name=perm_two_stage --set algorithm.fedavg_rounds=51 --set algorithm.lr=0.5 \\
        --set algorithm.lam=10.0 --set algorithm.global_lr=0.05

``--trace K`` also prints client K's model accuracy after every round in which it was updated,
and where (its owner or another host).
"""

from __future__ import annotations

import argparse
import time

import torch

from fedrisk.algorithms.perm import hosted_owners
from fedrisk.experiment.config import load_config
from fedrisk.experiment.runner import build_simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--every", type=int, default=51)
    parser.add_argument("--trace", type=int, default=None, help="a client whose model is followed round by round")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    sim = build_simulation(load_config(args.config, args.overrides)).simulation
    alg, fed = sim.algorithm, sim.federation
    N = fed.num_clients
    classes = [{k for k, c in enumerate(cc) if c > 0} for cc in fed.class_counts()]
    shared = torch.tensor([[len(classes[i] & classes[j]) for j in range(N)] for i in range(N)])

    def accuracy(params: dict, k: int) -> float:
        t = fed.client_tests[k]
        with torch.no_grad():
            return float((alg.model.apply(params, t.x).argmax(-1) == t.y).float().mean())

    def row(tree: dict, i: int) -> dict:
        return {key: v[i] for key, v in tree.items()}

    start = time.time()
    for r in range(1, args.rounds + 1):
        state = sim.server_state
        traced = args.trace is not None and alg.round_kind(state) == "shuffle"
        if traced:
            host = int((hosted_owners(state["sigma"], int(state["j"])) == args.trace).nonzero())
            before = row(state["v"], args.trace)
        sim.step()
        if traced:
            after = row(sim.server_state["v"], args.trace)
            if any(not torch.equal(before[k], after[k]) for k in after):
                where = "its owner" if host == args.trace else f"host {host}"
                step = float(sim.server_state["alpha"][args.trace, host]) * alg.lr
                print(
                    f"  round {r}: model {args.trace} trained at {where} (step {step:.3f}): "
                    f"accuracy {accuracy(before, args.trace):.3f} -> {accuracy(after, args.trace):.3f}"
                )
        if r % args.every and r != args.rounds:
            continue
        state = sim.server_state
        acc = torch.tensor([accuracy(alg.personal_params(state, sim.client_states[k], k), k) for k in range(N)])
        worst = acc.sort().values[: max(1, -(-N // 10))]
        msg = f"round {r} ({time.time() - start:.0f} s): personal accuracy {acc.mean():.4f}"
        msg += f", bottom-10% {worst.mean():.4f}"
        if "alpha" in state:
            a = state["alpha"].double()
            mass = [float((a * (shared == s)).sum(1).mean()) for s in (2, 1, 0)]
            w = alg.global_params(state)
            with torch.no_grad():
                g = float((alg.model.apply(w, fed.test.x).argmax(-1) == fed.test.y).float().mean())
            msg += (
                f"; weights: self {a.diag().mean():.3f}, non-zeros/row {(a > 0).sum(1).double().mean():.2f}, "
                f"mass on same-pair / one-shared / no-shared-class clients {mass[0]:.3f} / {mass[1]:.3f} / "
                f"{mass[2]:.3f}; global model test accuracy {g:.3f}"
            )
        print(msg, flush=True)
    print(
        "worst clients (client, classes, accuracy):",
        [(k, sorted(classes[k]), round(float(acc[k]), 3)) for k in acc.argsort()[:5].tolist()],
    )


if __name__ == "__main__":
    main()
