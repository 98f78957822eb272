"""One rank of the distributed equivalence test (launched by ``tests/runtime/test_distributed.py``).

    python -m torch.distributed.run --nnodes 1 --nproc-per-node N \\
        --master-addr 127.0.0.1 --master-port PORT tests/runtime/distributed_worker.py OUT_DIR LOCAL

Runs every case of ``_distributed_cases.py`` with ``DistributedExecutor(local=LOCAL,
check_replicas=True)`` in one process group and writes ``OUT_DIR/rank{r}.pt``: per case either
the run's summary or ``{"error": message}`` for a FedriskError.  It also checks the world-size
error (a federation with fewer clients than processes) under the case name ``"world_size_error"``.
Every rank writes its own file so that the test can check that the ranks' states are identical.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _distributed_cases as C  # noqa: E402

from fedrisk.algorithms.fedavg import FedAvg  # noqa: E402
from fedrisk.errors import FedriskError  # noqa: E402
from fedrisk.objectives.supervised import cross_entropy  # noqa: E402
from fedrisk.runtime.distributed import DistributedExecutor  # noqa: E402
from fedrisk.runtime.simulation import Simulation  # noqa: E402


def _error(fn: Any) -> dict[str, Any]:
    """``{"error": message}`` of the FedriskError / RuntimeError that ``fn()`` raises (None if none)."""
    try:
        fn()
    except (FedriskError, RuntimeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def main(out_dir: str, local: str) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    executor = lambda: DistributedExecutor(local=local, check_replicas=True)  # noqa: E731
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}

    def checkpoint(state: dict[str, Any]) -> dict[str, Any]:
        path = out / "checkpoint.pt"
        if dist.get_rank() == 0:  # the primary writes, every rank reads (as the runner's --resume does)
            torch.save(state, path)
        dist.barrier()
        return torch.load(path)

    for case in C.cases():
        if case.skip:
            continue
        start = time.perf_counter()
        try:
            results[case.name] = C.run_case(case, executor, checkpoint)
        except FedriskError as exc:
            results[case.name] = {"error": str(exc)}
        timings[case.name] = time.perf_counter() - start

    world, rank = dist.get_world_size(), dist.get_rank()
    alg = FedAvg(model=C.model(), loss=cross_entropy)
    # more processes than clients
    results["world_size_error"] = _error(
        lambda: Simulation(alg, C.federation(num_clients=world - 1), executor=executor(), dtype=torch.float64)
    )
    # ranks started with different data (a config that differs between ranks)
    results["federation_mismatch"] = _error(
        lambda: Simulation(alg, C.federation(num_clients=world + rank), executor=executor(), dtype=torch.float64)
    )
    # ranks started with different seeds: the plans (payloads) differ, check_replicas sees it
    results["replica_mismatch"] = _error(
        lambda: Simulation(C.Shuffle(C.model()), C.federation(), seed=rank, executor=executor()).step()
    )

    results["_meta"] = {"rank": rank, "world_size": world, "local": local, "timings": timings}
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
