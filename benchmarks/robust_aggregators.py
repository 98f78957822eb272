"""Wall time of the robust aggregation rules on n replies of dimension d (default n = 100, d = 1e6).

The replies are n - f honest rows ``N(0, I)`` plus f Byzantine rows ``1e4 N(0, I)`` (the
Gaussian attack of paper 002), float32 by default.  Each rule runs ``--repeat`` times; the table
gives the median and the minimum seconds, the machine's load average before and after, and the
torch thread count.  Wall time (``perf_counter``) and CPU time (``process_time``, summed over the
process's threads) are both reported: on a shared machine the wall time grows with the other
processes' load, the CPU time much less so.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/robust_aggregators.py --n 100 --d 1000000 --f 20 --repeat 3

Bulyan and MDA at n = 50, d = 1e5 (Bulyan needs n >= 4f + 3, so f = 10):

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/robust_aggregators.py --n 50 --d 100000 --f 10 \
        --rules bulyan mda mda_exact_f3 meamed monna static_clipping arc_then_trimmed_mean krum

Results: ``benchmarks/RESULTS_byzantine.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fedrisk.aggregators.extended import arc, bulyan, mda, meamed, monna, static_clipping
from fedrisk.aggregators.preaggregation import nearest_neighbor_mixing
from fedrisk.aggregators.robust import (
    centered_clipping,
    coordinate_median,
    geometric_median,
    krum,
    mean,
    multi_krum,
    trimmed_mean,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--f", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--rules", nargs="*", default=None, help="subset of the rules to time")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.d, generator=gen, dtype=dtype)
    x[args.n - args.f :] *= 1e4
    f = args.f
    rules = {
        "mean": lambda: mean(x),
        "coordinate_median": lambda: coordinate_median(x),
        "trimmed_mean": lambda: trimmed_mean(x, f),
        "krum": lambda: krum(x, f),
        "multi_krum": lambda: multi_krum(x, f),
        "geometric_median": lambda: geometric_median(x),
        "centered_clipping": lambda: centered_clipping(x, tau=10.0, iters=3),
        "nnm": lambda: nearest_neighbor_mixing(x, f),
        "bulyan": lambda: bulyan(x, f),  # needs n >= 4f + 3
        "mda": lambda: mda(x, f),  # exact while C(n, f) <= 200,000, greedy beyond
        "mda_exact_f3": lambda: mda(x, 3, exact=True),  # C(n, 3) subsets: n = 50 -> 19,600
        "meamed": lambda: meamed(x, f),
        "monna": lambda: monna(x, f),
        "static_clipping": lambda: static_clipping(x, tau=10.0),
        "arc_then_trimmed_mean": lambda: trimmed_mean(arc(x, f), f),
    }
    chosen = args.rules or list(rules)
    load_before = os.getloadavg()
    print(
        f"n = {args.n}, d = {args.d}, f = {f}, {args.dtype}, torch threads = {torch.get_num_threads()}, "
        f"load average before = {load_before[0]:.2f}"
    )
    print("| rule | wall s (median) | wall s (min) | CPU s (median) | honest-normalised error |")
    print("|---|---:|---:|---:|---:|")
    for name in chosen:
        times, cpu = [], []
        out = None
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            out = rules[name]()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        # distance of the output from the honest mean, relative to sqrt(d) (honest rows have norm ~ sqrt(d))
        honest = x[: args.n - f].double().mean(0)
        err = float(torch.linalg.vector_norm(out.double() - honest)) / args.d**0.5 if out.dim() == 1 else float("nan")
        print(
            f"| {name} | {statistics.median(times):.2f} | {min(times):.2f} "
            f"| {statistics.median(cpu):.2f} | {err:.3g} |",
            flush=True,
        )
    print(f"load average after = {os.getloadavg()[0]:.2f}")
    try:
        import resource

        print(f"peak resident memory = {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
    except ImportError:  # not on every platform
        pass


if __name__ == "__main__":
    main()
