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
from fedrisk.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")
ALGORITHMS.add("fedavg", FedAvg, "FedAvg: local SGD, sample-weighted (or uniform) model averaging")
ALGORITHMS.add("fedprox", FedProx, "FedProx: FedAvg with a proximal term mu/2 ||w - w_r||^2")

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ClientResult",
    "FedAvg",
    "FedInfo",
    "FedProx",
    "LocalData",
    "RoundContext",
    "RoundPlan",
    "sample_clients",
]
