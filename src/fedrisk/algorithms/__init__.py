"""Federated algorithms: one module per family, all following :mod:`fedrisk.algorithms.base`.

``ALGORITHMS`` maps a config name to the algorithm's dataclass; its fields are the
hyper-parameters (``model``, ``loss``/objective, ``aggregator`` and ``server_opt`` are filled
in by the experiment layer).
"""

from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.fedavg import FedAvg, FedProx
from fedrisk.algorithms.local_only import Centralized, LocalOnly, centralized
from fedrisk.algorithms.scaffold import Scaffold
from fedrisk.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")
ALGORITHMS.add("fedavg", FedAvg, "FedAvg: local SGD, sample-weighted (or uniform) model averaging")
ALGORITHMS.add("fedprox", FedProx, "FedProx: FedAvg with a proximal term mu/2 ||w - w_r||^2")
ALGORITHMS.add("scaffold", Scaffold, "SCAFFOLD: local SGD with control variates c - c_i (options I/II)")
ALGORITHMS.add("local_only", LocalOnly, "each client trains its own model; no communication")
ALGORITHMS.add("centralized", Centralized, "minibatch SGD on pooled data (a one-client federation)")

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Centralized",
    "ClientResult",
    "FedAvg",
    "FedInfo",
    "FedProx",
    "LocalData",
    "LocalOnly",
    "RoundContext",
    "RoundPlan",
    "Scaffold",
    "centralized",
    "sample_clients",
]
