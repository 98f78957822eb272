"""The vectorised executor with and without this repository's ``vmap`` fast paths, interleaved.

Runs ``simulation_speed.py``'s workload (``W1`` or ``W2``) with several
:class:`~simulation_speed.VectorizedRunner` copies and the compute floor in one process, round r
of each in turn, each copy with some of the fast paths switched off for its own rounds
(``fedrisk.algorithms.local.fast_paths``):

* ``fused``: plain local SGD of a zoo MLP / logistic regression as one explicit stacked program
  without ``vmap`` (``fedrisk.algorithms.fused``);
* ``gather``: minibatch rows as an embedding lookup under ``vmap`` (``fedrisk.algorithms.local.rows``);
* ``in_place``: in-place local SGD updates from step 1 on under ``vmap`` (``fedrisk.algorithms.local.sgd_steps``).

With ``--hand`` the hand-written ``vmap`` and stacked programs of ``simulation_speed.py``
(``--impl vmap`` / ``stacked``) take their turns too.  Prints the median CPU milliseconds per
round (rounds 3..R), the median per-round ratio to the floor, the largest difference of each
copy's final parameters from the copy without any fast path (float rounding) and the test
accuracy::

    .venv/bin/python benchmarks/vectorized_ab.py W1 --rounds 20 --hand
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import simulation_speed as ss  # this script's folder
import torch

from fedrisk.algorithms import local

VARIANTS = {
    "all": set(),
    "no fused": {"fused"},
    "vmap, no gather": {"fused", "gather"},
    "vmap, no inplace": {"fused", "in_place"},
    "none": {"fused", "gather", "in_place"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=["W1", "W2"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument(
        "--hand", action="store_true", help="also the hand-written vmap and stacked programs (simulation_speed.py)"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    wl = ss.replace(ss.WORKLOADS[args.workload], rounds=args.rounds)
    runners = {name: ss.VectorizedRunner(wl) for name in VARIANTS}
    hand = {"hand vmap": ss.VmapRunner(wl), "hand stacked": ss.StackedRunner(wl)} if args.hand else {}
    floor = ss.FloorRunner(wl)
    cpu: dict[str, list[float]] = {name: [] for name in [*VARIANTS, *hand, "floor"]}
    load = [os.getloadavg()[0]]
    for r in range(wl.rounds):
        for name, runner in runners.items():
            with local.fast_paths(**dict.fromkeys(VARIANTS[name], False)):
                start = time.process_time()
                runner.step(r)
                cpu[name].append(time.process_time() - start)
        for name, other in [*hand.items(), ("floor", floor)]:
            start = time.process_time()
            other.step(r)
            cpu[name].append(time.process_time() - start)
    load.append(os.getloadavg()[0])
    print(f"{args.workload}, {args.rounds} rounds, load average {load[0]:.1f} -> {load[1]:.1f}")
    params = {name: runner.sim.server_state["params"] for name, runner in runners.items()}
    accuracy = {name: runner.accuracy() for name, runner in [*runners.items(), *hand.items(), ("floor", floor)]}
    for name, times in cpu.items():
        ratio = statistics.median(a / b for a, b in zip(times[2:], cpu["floor"][2:]))
        ref = params["none"]
        diff = max(float((params[name][k] - ref[k]).abs().max()) for k in ref) if name in params else 0.0
        ms = statistics.median(times[2:]) * 1e3
        print(
            f"{name:>16}: {ms:7.2f} ms CPU/round, {ratio:.3f} x floor, max |diff| {diff:.1e}, "
            f"accuracy {accuracy[name]:.4f}"
        )


if __name__ == "__main__":
    main()
