"""Helpers shared by the benchmarks: round timing (`codasca_round_cost.py`, `fedxl_round_cost.py`) and JSON results."""

from __future__ import annotations

import time
from typing import Any


def measure(sims: dict[str, Any], repeats: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """Wall-clock and process CPU seconds of each round, one round of every simulation in turn
    (CPU time is the steadier of the two on a machine shared with other jobs: it does not count
    the time the process waits for a core); the first ``warmup`` rounds are not kept."""
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in sims}
    for i in range(warmup + repeats):
        for name, sim in sims.items():
            wall, cpu = time.perf_counter(), time.process_time()
            sim.step()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if i >= warmup:
                times[name]["wall"].append(wall)
                times[name]["cpu"].append(cpu)
    return times


def save_json(path: str, obj: Any, indent: int = 1) -> None:
    """Write a benchmark's result ``obj`` to ``path`` as JSON, creating its folder."""
    import json
    import os

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=indent)
