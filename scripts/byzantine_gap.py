"""Optimality gap F(w) - F* of problem (5) for FRPG and LFRPG on digits (paper 002, Figs. 3-4 at laptop scale).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/byzantine_gap.py --rounds 400 --frames 200 --mu 1e-3 --seeds 0 1 2

Spec checks 7.2.6 and 7.2.8 (deterministic, no attack, full local gradients, mu = 1e-2)::

    OMP_NUM_THREADS=1 .venv/bin/python scripts/byzantine_gap.py --attack none --full-batch --mu 1e-2 \
        --rounds 3000 --frames 200 --every 50 --seeds 0 --img docs/results/img/byzantine_digits_gap_full.png

F of eq. (5) counts the N = 16 reliable workers only (spec P10; with ``--attack none`` all 20 workers
are reliable and F counts all of them):
``F(w) = sum_n [CE_n(w_n) + delta/2 ||w_n||^2 + lambda p(w_0 - w_n)] + delta_0/2 ||w_0||^2`` with
``CE_n`` the mean cross-entropy over worker n's training rows.  ``F*`` comes from L-BFGS on the
joint ``(N + 1) d`` variable by continuation in mu (``--continuation``: solve at 100 mu, then 10 mu,
then mu, each warm-started from the previous one; the nearly non-smooth penalty at mu = 1e-3 is
out of reach from zeros within the iteration cap), each stage run until ``||grad F|| <=
--grad-tol`` or the cap.  The split of digits into train and test rows depends on the seed, so F*
is computed per seed.  The gap is evaluated every ``--every`` rounds at the server model and the
reliable workers' models (for LFRPG at the end of each frame).  Prints a Markdown table (mean
and range over the seeds) and writes ``docs/results/img/byzantine_digits_gap.png``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.outputs import markdown_rows
from fedrisk.experiment.runner import build_simulation
from fedrisk.objectives.penalties import huber_l2
from fedrisk.tree import tree_flatten_vector, tree_map

LAM, DELTA, DELTA0, LIP = 1.6, 0.003, 0.003, 24.1


def build(name: str, attack: str, mu: float, seed: int, extra: dict, full_batch: bool = False):
    raw = {
        "data": {"dataset": "digits", "partition": "class_groups", "num_clients": 20},
        "model": {"name": "logreg"},
        "algorithm": {
            "name": name,
            "lam": LAM,
            "mu": mu,
            "delta": DELTA,
            "delta_server": DELTA0,
            "lipschitz": LIP,
            "batch_size": 10,
            "full_batch": full_batch,
            **extra,
        },
        "run": {"dtype": "float64", "executor": "vectorized", "seed": seed},
    }
    if attack != "none":
        raw["attack"] = {"name": attack, "byzantine": [16, 17, 18, 19]}
    return build_simulation(resolve_config(raw)).simulation


def objective(sim, mu: float, reliable: list[int]):
    """``F(W)`` for ``W = [w_0, w_1, ..., w_N]`` stacked ``(N + 1, d)`` (softmax regression, vectorised)."""
    like = sim.algorithm.global_params(sim.server_state)
    assert list(like) == ["linear.weight", "linear.bias"], list(like)
    C, p = like["linear.weight"].shape
    data = [sim.federation.clients[k] for k in reliable]
    x = torch.cat([s.x.reshape(len(s), -1) for s in data])
    y = torch.cat([s.y for s in data])
    owner = torch.cat([torch.full((len(s),), i) for i, s in enumerate(data)])
    per_row = torch.cat([torch.full((len(s),), 1.0 / len(s), dtype=torch.float64) for s in data])

    def F(W: torch.Tensor) -> torch.Tensor:
        w0, wn = W[0], W[1:]
        weight = wn[:, : C * p].reshape(-1, C, p)
        bias = wn[:, C * p :]
        logits = torch.einsum("rcp,rp->rc", weight[owner], x) + bias[owner]
        ce = torch.nn.functional.cross_entropy(logits, y, reduction="none")
        total = (ce * per_row).sum() + DELTA / 2 * (wn * wn).sum() + DELTA0 / 2 * (w0 @ w0)
        return total + LAM * torch.stack([huber_l2(w0 - w, mu) for w in wn]).sum()

    return F


def f_star(objectives, shape, iters: int, grad_tol: float) -> tuple[float, float]:
    """L-BFGS on each objective in turn (a continuation in mu), warm-started; ``(F*, ||grad F||)`` of the last."""
    W = torch.zeros(shape, dtype=torch.float64)
    for F in objectives:
        W = W.detach().clone().requires_grad_(True)
        opt = torch.optim.LBFGS(
            [W],
            lr=1,
            max_iter=iters,
            tolerance_grad=grad_tol,
            tolerance_change=0,
            history_size=50,
            line_search_fn="strong_wolfe",
        )

        def closure(F=F, W=W, opt=opt):
            opt.zero_grad()
            loss = F(W)
            loss.backward()
            return loss

        opt.step(closure)
    loss = objectives[-1](W)
    (g,) = torch.autograd.grad(loss, W)
    return float(loss.detach()), float(g.norm())


def state_matrix(sim, reliable: list[int]) -> torch.Tensor:
    rows = [tree_flatten_vector(sim.algorithm.global_params(sim.server_state))]
    for k in reliable:
        st = sim.client_states[k]
        w = st["w"] if "w" in st else tree_map(lambda p: p[-1], st["w_slots"])  # lit: the frame's last slot
        rows.append(tree_flatten_vector(w))
    return torch.stack(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--attack", default="gaussian")
    ap.add_argument("--mu", type=float, default=1e-3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--lbfgs-iters", type=int, default=3000)
    ap.add_argument("--grad-tol", type=float, default=1e-3)
    ap.add_argument("--continuation", type=int, default=2, help="extra stages at 10^k mu, k = this .. 1")
    ap.add_argument("--full-batch", action="store_true", help="every slot on the worker's whole local data")
    ap.add_argument("--variants", nargs="+", default=["seq"], choices=["seq", "lit"], help="LFRPG readings of (21a)")
    ap.add_argument("--no-frpg", action="store_true", help="run only LFRPG")
    ap.add_argument("--fstar", type=float, nargs="+", help="F* per seed (skips L-BFGS), e.g. from an earlier run")
    ap.add_argument("--img", type=Path, default=Path("docs/results/img/byzantine_digits_gap.png"))
    args = ap.parse_args()
    reliable = list(range(20 if args.attack == "none" else 16))
    runs = {} if args.no_frpg else {"FRPG": ("frpg", {}, args.rounds)}
    for variant in args.variants:
        runs[f"LFRPG (T=10, {variant})"] = ("lfrpg", {"local_slots_per_round": 10, "variant": variant}, args.frames)
    curves: dict[str, dict[int, list[float]]] = {label: {} for label in runs}
    for i, seed in enumerate(args.seeds):
        fstar = args.fstar[i] if args.fstar else None
        F = None
        for label, (name, extra, rounds) in runs.items():
            sim = build(name, args.attack, args.mu, seed, extra, args.full_batch)
            if F is None:
                F = objective(sim, args.mu, reliable)
            if fstar is None:
                mus = [args.mu * 10**k for k in range(args.continuation, 0, -1)] + [args.mu]
                stages = [objective(sim, m, reliable) for m in mus]
                F = stages[-1]
                t = time.time()
                fstar, gnorm = f_star(stages, state_matrix(sim, reliable).shape, args.lbfgs_iters, args.grad_tol)
                print(
                    f"seed {seed}: F* = {fstar:.6f} (||grad F|| = {gnorm:.2e}, error <= ||grad F||^2 / (2 delta) = "
                    f"{gnorm**2 / (2 * DELTA):.1e}; L-BFGS over mu = {mus}: {time.time() - t:.0f} s)",
                    flush=True,
                )
            for r in range(1, rounds + 1):
                sim.step()
                if r % args.every == 0 or r == rounds:
                    with torch.no_grad():
                        curves[label].setdefault(r, []).append(float(F(state_matrix(sim, reliable))) - fstar)
    marks = set()
    for c in curves.values():  # short curves: every evaluation; long ones: every 5th and the first
        marks |= set(c) if len(c) <= 12 else {r for r in c if r % (5 * args.every) == 0 or r == args.every}
    marks = sorted(marks)

    def cell(values: list[float] | None) -> str:
        if not values:
            return "–"
        mean = sum(values) / len(values)
        return f"{mean:.3g} ({min(values):.3g}–{max(values):.3g})" if len(values) > 1 else f"{mean:.3g}"

    rows = [[str(m), *(cell(c.get(m)) for c in curves.values())] for m in marks]
    print("\n" + markdown_rows(["rounds", *curves], rows, text_columns=0))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, c in curves.items():
        xs = sorted(c)
        mean = [max(sum(c[x]) / len(c[x]), 1e-8) for x in xs]
        ax.plot(xs, mean, label=label)
        ax.fill_between(xs, [max(min(c[x]), 1e-8) for x in xs], [max(c[x]) for x in xs], alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel("communication rounds")
    ax.set_ylabel("F(w) - F*  (reliable workers, eq. (5))")
    mode = "full batch" if args.full_batch else "batch 10"
    ax.set_title(f"digits, attack: {args.attack}, mu = {args.mu:g}, {mode}, seeds {args.seeds}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    args.img.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.img, dpi=110)
    print(f"\n![gap]({args.img.name})")


if __name__ == "__main__":
    main()
