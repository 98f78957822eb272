"""The cost of one FeDXL1 round against one Local Pair round (and FeDXL2 against Local Pair pAUC).

Same model, data, K, B1, B2, the sequential executor, one thread.  A Local Pair round runs K
local steps on the pairs of the client's own minibatch; a FeDXL1 round runs the same K steps
with the partners taken from the previous round's score pools (shuffled with an ``argsort`` of
random keys once per round) and uploads / merges the pools.  The target (issue 13) is
FeDXL1 <= 1.5x Local Pair per round.  Issue 27 adds FeDXL2 with the average-precision objective
(``xrisk = "ap"``: a 2-vector u per positive, partners from both pools) against FeDXL2 with the
KL-DRO pAUC objective, target <= 1.5x, and reports the two-way and CVaR pAUC objectives beside them.

Rounds are interleaved (one round of each, repeatedly) so that a machine whose load drifts slows
all of them alike; the report is the median over the repeats, in process CPU time (steadier
than wall time on a shared machine) and wall time.

Recorded results: ``benchmarks/RESULTS_fedxl.md``.

Usage::

    .venv/bin/python benchmarks/fedxl_round_cost.py                      # MLP 784-64-1, K = 32, B = 32
    .venv/bin/python benchmarks/fedxl_round_cost.py --clients 16 --repeats 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from _timing import measure  # this script's folder

from fedrisk.algorithms.fedxl import FeDXL1, FeDXL2
from fedrisk.algorithms.local_pair import LocalPair
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.runtime.simulation import Simulation


def federation(clients: int, rows: int, dim: int) -> Federation:
    """Gaussian features, 1:5 positives, ``rows`` per client."""
    g = torch.Generator().manual_seed(0)
    parts = []
    for _ in range(clients):
        y = (torch.rand(rows, generator=g) < 1 / 6).long()
        parts.append(Samples(torch.randn(rows, dim, generator=g) + 0.5 * y[:, None], y))
    return Federation("bench", parts, 2)


def build(args: argparse.Namespace) -> dict[str, Simulation]:
    fed = federation(args.clients, args.rows, args.dim)
    model = FunctionalModel(build_model("mlp", (args.dim,), 1, hidden=list(args.hidden)))
    common: dict[str, Any] = {
        "model": model,
        "lr": 0.1,
        "local_steps": args.local_steps,
        "batch_pos": args.batch,
        "batch_neg": args.batch,
    }
    algorithms = {
        "local_pair": LocalPair(surrogate="sigmoid", **common),
        "fedxl1": FeDXL1(surrogate="sigmoid", **common),
        "local_pair_pauc": LocalPair(xrisk="pauc", surrogate="squared_hinge", beta=0.1, **common),
        "fedxl2": FeDXL2(**common),
        "fedxl2_ap": FeDXL2(xrisk="ap", **common),
        "fedxl2_tpauc": FeDXL2(xrisk="tpauc", **common),
        "fedxl2_cvar": FeDXL2(xrisk="pauc_cvar", **common),
    }
    sims = {name: Simulation(alg, fed, seed=0) for name, alg in algorithms.items()}
    for name in ("fedxl1", "fedxl2", "fedxl2_ap", "fedxl2_tpauc", "fedxl2_cvar"):
        sims[name].step()  # the bootstrap round (scores only) is not timed
    return sims


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-steps", type=int, default=32, help="K")
    parser.add_argument("--batch", type=int, default=32, help="B1 = B2")
    parser.add_argument("--hidden", type=int, nargs="*", default=[64], help="MLP hidden widths")
    parser.add_argument("--dim", type=int, default=784)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rows", type=int, default=300, help="training rows per client")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sims = build(args)
    times = measure(sims, args.repeats, args.warmup)
    median = {clock: {n: statistics.median(t[clock]) for n, t in times.items()} for clock in ("cpu", "wall")}
    ratios = {
        clock: {
            "fedxl1/local_pair": m["fedxl1"] / m["local_pair"],
            "fedxl2/local_pair_pauc": m["fedxl2"] / m["local_pair_pauc"],
            "fedxl2_ap/fedxl2": m["fedxl2_ap"] / m["fedxl2"],
            "fedxl2_tpauc/fedxl2": m["fedxl2_tpauc"] / m["fedxl2"],
            "fedxl2_cvar/fedxl2": m["fedxl2_cvar"] / m["fedxl2"],
        }
        for clock, m in median.items()
    }
    last = {name: sim.ledger.rounds[-1] for name, sim in sims.items()}
    result: dict[str, Any] = {
        "config": vars(args),
        "median_round_s": median,
        "ratios": ratios,
        "bytes_per_client_round": {n: {"down": r["down"][0], "up": r["up"][0]} for n, r in last.items()},
        "torch": torch.__version__,
    }
    print(
        f"K = {args.local_steps}, B1 = B2 = {args.batch}, MLP {args.dim}-{'-'.join(map(str, args.hidden))}-1, "
        f"N = {args.clients}, {args.repeats} interleaved repeats, {args.threads} thread(s)"
    )
    for name in sims:
        b = result["bytes_per_client_round"][name]
        print(
            f"  {name:16s} median {1e3 * median['cpu'][name]:8.1f} ms CPU ({1e3 * median['wall'][name]:8.1f} ms wall)"
            f" per round; bytes/client/round down {b['down']:8d} up {b['up']:7d}"
        )
    for clock in ("cpu", "wall"):
        r = ratios[clock]
        print(
            f"  {clock:4s}: FeDXL1 / Local Pair = {r['fedxl1/local_pair']:.3f} (target <= 1.5), "
            f"FeDXL2 / Local Pair (pAUC) = {r['fedxl2/local_pair_pauc']:.3f}; FeDXL2 AP / FeDXL2 pAUC = "
            f"{r['fedxl2_ap/fedxl2']:.3f} (target <= 1.5), two-way / pAUC = {r['fedxl2_tpauc/fedxl2']:.3f}, "
            f"CVaR / pAUC = {r['fedxl2_cvar/fedxl2']:.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
