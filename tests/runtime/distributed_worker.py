"""One rank of the distributed equivalence test (launched by ``tests/runtime/test_distributed.py``).

    python -m torch.distributed.run --nnodes 1 --nproc-per-node N \\
        --master-addr 127.0.0.1 --master-port PORT tests/runtime/distributed_worker.py OUT_DIR LOCAL

Runs every case of ``_distributed_cases.py`` with ``DistributedExecutor(local=LOCAL,
check_replicas=True)`` in one process group and writes ``OUT_DIR/rank{r}.pt``: per case either
the run's summary or ``{"error": message}`` for a FedriskError.
It also records what bad launches do (more processes than clients, ranks with different data,
ranks with different seeds) and what the helpers offered to the experiment layer return.
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

import _distributed_cases as C

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.distributed import DistributedExecutor
from fedrisk.runtime.simulation import Simulation


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
        results[case.name] = C.run_case(case, executor, checkpoint)  # {"error": ...} for a FedriskError
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

    # the helpers offered to the experiment layer
    helper = executor()

    def refuse() -> None:
        raise FedriskError(f"refused on rank {rank}")

    results["helpers"] = {
        "run_on_primary": helper.run_on_primary(lambda: f"computed on rank {rank}"),
        "run_on_primary_error": _error(lambda: helper.run_on_primary(refuse)),
        "any_rank_last": helper.any_rank(rank == world - 1),
        "any_rank_none": helper.any_rank(False),
    }

    results["_meta"] = {"rank": rank, "world_size": world, "local": local, "timings": timings}
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
