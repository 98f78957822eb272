"""Federated algorithms: one module per family, all following :mod:`fedrisk.algorithms.base`.

``ALGORITHMS`` maps a config name to the algorithm's dataclass; its fields are the
hyper-parameters (``model``, ``loss``/objective, ``aggregator`` and ``server_opt`` are filled
in by the experiment layer).
"""

from fedrisk.algorithms.apple import APPLE
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.codaplus import CODA, NPA, CODAPlus
from fedrisk.algorithms.codasca import CODASCA
from fedrisk.algorithms.fedavg import FedAvg, FedProx
from fedrisk.algorithms.fedfomo import FedFomo
from fedrisk.algorithms.fedxl import FeDXL1, FeDXL2
from fedrisk.algorithms.fedxl_ndcg import CentralizedNDCG, FeDXL2NDCG, LocalNDCG
from fedrisk.algorithms.fessgda import FESSGDA, FESSGDARegularized
from fedrisk.algorithms.frpg import FRPG, LFRPG
from fedrisk.algorithms.frpg_baselines import RSA, RobustSGD
from fedrisk.algorithms.ifca import IFCA
from fedrisk.algorithms.local_only import Centralized, LocalOnly, centralized
from fedrisk.algorithms.local_pair import CentralizedPair, LocalPair
from fedrisk.algorithms.perm import PERM, PERMShuffling, PERMTwoStage
from fedrisk.algorithms.perm_hetero import PERMHetero
from fedrisk.algorithms.personalized import APFL, Ditto, LocalizedFedAvg, PerFedAvg, PFedMe
from fedrisk.algorithms.scaffold import Scaffold
from fedrisk.algorithms.sgda import FSGDA, SAGDA, FedNormSGDA, FedNormSGDAPlus, LocalSGDA, LocalSGDAPlus
from fedrisk.registry import Registry

ALGORITHMS: Registry = Registry("algorithm")
ALGORITHMS.add("fedavg", FedAvg, "FedAvg: local SGD, sample-weighted (or uniform) model averaging")
ALGORITHMS.add("fedprox", FedProx, "FedProx: FedAvg with a proximal term mu/2 ||w - w_r||^2")
ALGORITHMS.add("scaffold", Scaffold, "SCAFFOLD: local SGD with control variates c - c_i (options I/II)")
ALGORITHMS.add("local_only", LocalOnly, "each client trains its own model; no communication")
ALGORITHMS.add("centralized", Centralized, "minibatch SGD on pooled data (a one-client federation)")
ALGORITHMS.add("perm", PERM, "PERM single loop (Alg. 2): learned mixing weights + model shuffling")
ALGORITHMS.add("perm_two_stage", PERMTwoStage, "PERM two-stage: FedAvg, weights at w^R (Alg. 3), then Alg. 1")
ALGORITHMS.add("perm_hetero", PERMHetero, "PERM with per-client model widths (Sec. 3.3; partial training)")
ALGORITHMS.add("perm_shuffling", PERMShuffling, "Shuffling Local SGD (PERM Alg. 1) with fixed weights")
ALGORITHMS.add("fedavg_ft", LocalizedFedAvg, "localized FedAvg: FedAvg + local fine-tuning of the received model")
ALGORITHMS.add("perfedavg", PerFedAvg, "Per-FedAvg (Fallah et al. 2020): local MAML steps, FO or HF variant")
ALGORITHMS.add("pfedme", PFedMe, "pFedMe (Dinh et al. 2020): Moreau-envelope personal models theta_i")
ALGORITHMS.add("ditto", Ditto, "Ditto (Li et al. 2021): FedAvg + personal models pulled towards w")
ALGORITHMS.add("apfl", APFL, "APFL (Deng et al. 2020): mixture a_i v_i + (1 - a_i) w with adaptive a_i")
ALGORITHMS.add("apple", APPLE, "APPLE (Luo and Wu 2022): personal model sum_j p_ij theta_j with learned DR vectors p_i")
ALGORITHMS.add("fedfomo", FedFomo, "FedFomo (Zhang et al. 2021): clients mix downloaded models by validation gain")
ALGORITHMS.add("ifca", IFCA, "IFCA (Ghosh et al. 2020): k cluster models, each client trains the one it fits best")
ALGORITHMS.add("coda", CODA, "CODA: stagewise local primal-dual AUC SGD + pooled dual reset per stage")
ALGORITHMS.add("codaplus", CODAPlus, "CODA+: stagewise local primal-dual AUC SGD with prox term (Alg. 1-2)")
ALGORITHMS.add("npa", NPA, "NPA: CODA+ with I = 1 and local minibatch M (naive parallel PPD-SG)")
ALGORITHMS.add("codasca", CODASCA, "CODASCA: CODA+ with primal/dual control variates, global step (Alg. 3-4)")
ALGORITHMS.add("fedxl1", FeDXL1, "FeDXL1: pairwise X-risk (linear f), active/passive split, score pools (Alg. 1)")
ALGORITHMS.add("fedxl2", FeDXL2, "FeDXL2: compositional X-risk (KL-DRO pAUC), u-table, momentum (Alg. 2-3)")
ALGORITHMS.add("local_pair", LocalPair, "Local Pair: X-risk of local pairs only, periodic averaging (FeDXL baseline)")
ALGORITHMS.add("centralized_pair", CentralizedPair, "pairwise SGD / SOX on pooled data (FeDXL's centralised baseline)")
ALGORITHMS.add("fedxl2_ndcg", FeDXL2NDCG, "FeDXL2 with NDCG (SONG): per-query u, passive items / anchors by query")
ALGORITHMS.add("local_ndcg", LocalNDCG, "Local Pair for NDCG: SONG on each client's own items of each query")
ALGORITHMS.add("centralized_ndcg", CentralizedNDCG, "SONG (NDCG) on pooled data (FeDXL NDCG's centralised baseline)")
# federated minimax (paper 001): fair classification over classes / groups, 1-D WGAN, NC-SC quadratic game
ALGORITHMS.add("fessgda", FESSGDA, "FESS-GDA: local SGDA + server-side smoothing toward z (Alg. 1)")
ALGORITHMS.add("fessgda_ncc", FESSGDARegularized, "FESS-GDA on f - eps/(4D)||y - y0||^2 (Thm 3.3, general NC-C)")
ALGORITHMS.add("local_sgda", LocalSGDA, "Local SGDA: K local simultaneous SGDA steps, plain averaging")
ALGORITHMS.add("local_sgda_plus", LocalSGDAPlus, "Local SGDA+: y-steps at a snapshot x refreshed every S rounds")
ALGORITHMS.add("fsgda", FSGDA, "FSGDA: Local SGDA with global step sizes eta_g")
ALGORITHMS.add("fed_norm_sgda", FedNormSGDA, "Fed-Norm-SGDA: normalised client updates, global step sizes")
ALGORITHMS.add("fed_norm_sgda_plus", FedNormSGDAPlus, "Fed-Norm-SGDA+: Fed-Norm-SGDA with a snapshot x for y-steps")
ALGORITHMS.add("sagda", SAGDA, "SAGDA: FSGDA with sampled-client gradient control variates (2 rounds/iter)")
ALGORITHMS.add("frpg", FRPG, "FRPG: Byzantine-resilient accelerated proximal gradient, Huber penalty (Alg. 1)")
ALGORITHMS.add("lfrpg", LFRPG, "LFRPG: FRPG with T local slots per round (Alg. 2; variant seq / lit)")
ALGORITHMS.add("rsa", RSA, "RSA: robust stochastic aggregation with the l1 penalty, step lr/sqrt(k)")
ALGORITHMS.add("robust_sgd", RobustSGD, "SGD whose server combines gradients with any aggregator (krum, median, ...)")

__all__ = [
    "ALGORITHMS",
    "APFL",
    "APPLE",
    "CODA",
    "CODASCA",
    "FESSGDA",
    "FRPG",
    "FSGDA",
    "IFCA",
    "LFRPG",
    "NPA",
    "PERM",
    "RSA",
    "SAGDA",
    "Algorithm",
    "CODAPlus",
    "Centralized",
    "CentralizedPair",
    "ClientResult",
    "Ditto",
    "FESSGDARegularized",
    "FeDXL1",
    "FeDXL2",
    "FedAvg",
    "FedFomo",
    "FedInfo",
    "FedNormSGDA",
    "FedNormSGDAPlus",
    "FedProx",
    "LocalData",
    "LocalOnly",
    "LocalPair",
    "LocalSGDA",
    "LocalSGDAPlus",
    "LocalizedFedAvg",
    "PERMHetero",
    "PERMShuffling",
    "PERMTwoStage",
    "PFedMe",
    "PerFedAvg",
    "RobustSGD",
    "RoundContext",
    "RoundPlan",
    "Scaffold",
    "centralized",
    "sample_clients",
]
