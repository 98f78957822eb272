"""Objectives (risk functions) optimised by the federated algorithms.

* :mod:`fedrisk.objectives.auc` -- AUC min-max objectives (square loss of eq. (2) of CODA+/CODASCA,
  the AUC-margin form); :mod:`fedrisk.objectives.auc_setup` -- their set-up (labels, the ratio p).
* :mod:`fedrisk.objectives.xrisk` -- deep X-risks of FeDXL: pairwise surrogates, the pairwise AUROC
  and KL-DRO one-way pAUC forms, the moving-average inner estimator.
"""

from .auc import auc_dual_closed_form_direction, auc_margin_minmax, auc_square_minmax, optimal_dual
from .auc_setup import (
    DEFAULT_POSITIVE_RATIO,
    PositiveRatio,
    check_binary_labels,
    check_ratio,
    positive_ratio,
    resolve_positive_ratios,
)

__all__ = [
    "DEFAULT_POSITIVE_RATIO",
    "PositiveRatio",
    "auc_dual_closed_form_direction",
    "auc_margin_minmax",
    "auc_square_minmax",
    "check_binary_labels",
    "check_ratio",
    "optimal_dual",
    "positive_ratio",
    "resolve_positive_ratios",
]
