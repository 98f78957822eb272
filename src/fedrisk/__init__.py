"""fedrisk: federated optimisation beyond plain averaging.

The Python entry point is :func:`fedrisk.run_federation`; the command line is ``fedrisk``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Callback", "History", "Simulation", "run_federation", "run_simulation"]


def __getattr__(name: str) -> Any:  # lazy, so that ``import fedrisk.data`` stays light
    if name in ("Callback", "History", "run_federation", "run_simulation"):
        from fedrisk import api

        return getattr(api, name)
    if name == "Simulation":
        from fedrisk.runtime.simulation import Simulation

        return Simulation
    raise AttributeError(f"module 'fedrisk' has no attribute {name!r}")
