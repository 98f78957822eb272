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
from fedrisk.algorithms.codasca import CODA, CODASCA, NPA, CODAPlus
from fedrisk.algorithms.fedavg import FedAvg, FedProx
from fedrisk.algorithms.frpg import FRPG, LFRPG, RSA, RobustSGD
from fedrisk.algorithms.local_only import Centralized, LocalOnly, centralized
from fedrisk.algorithms.scaffold import Scaffold
from fedrisk.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")
ALGORITHMS.add("fedavg", FedAvg, "FedAvg: local SGD, sample-weighted (or uniform) model averaging")
ALGORITHMS.add("fedprox", FedProx, "FedProx: FedAvg with a proximal term mu/2 ||w - w_r||^2")
ALGORITHMS.add("scaffold", Scaffold, "SCAFFOLD: local SGD with control variates c - c_i (options I/II)")
ALGORITHMS.add("local_only", LocalOnly, "each client trains its own model; no communication")
ALGORITHMS.add("centralized", Centralized, "minibatch SGD on pooled data (a one-client federation)")
ALGORITHMS.add("coda", CODA, "CODA: stagewise local primal-dual AUC SGD + pooled dual reset per stage")
ALGORITHMS.add("codaplus", CODAPlus, "CODA+: stagewise local primal-dual AUC SGD with prox term (Alg. 1-2)")
ALGORITHMS.add("npa", NPA, "NPA: CODA+ with I = 1 and local minibatch M (naive parallel PPD-SG)")
ALGORITHMS.add("codasca", CODASCA, "CODASCA: CODA+ with primal/dual control variates, global step (Alg. 3-4)")
ALGORITHMS.add("frpg", FRPG, "FRPG: Byzantine-resilient accelerated proximal gradient, Huber penalty (Alg. 1)")
ALGORITHMS.add("lfrpg", LFRPG, "LFRPG: FRPG with T local slots per round (Alg. 2; variant seq / lit)")
ALGORITHMS.add("rsa", RSA, "RSA: robust stochastic aggregation with the l1 penalty, step lr/sqrt(k)")
ALGORITHMS.add("robust_sgd", RobustSGD, "SGD whose server combines gradients with any aggregator (krum, median, ...)")

__all__ = [
    "ALGORITHMS",
    "CODA",
    "CODASCA",
    "FRPG",
    "LFRPG",
    "NPA",
    "RSA",
    "Algorithm",
    "CODAPlus",
    "Centralized",
    "ClientResult",
    "FedAvg",
    "FedInfo",
    "FedProx",
    "LocalData",
    "LocalOnly",
    "RobustSGD",
    "RoundContext",
    "RoundPlan",
    "Scaffold",
    "centralized",
    "sample_clients",
]
