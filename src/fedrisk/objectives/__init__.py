"""Objectives (risk functions) optimised by the federated algorithms.

* :mod:`fedrisk.objectives.auc` -- AUC min-max objectives (square loss of eq. (2) of CODA+/CODASCA,
  the AUC-margin form) and their set-up helpers.
"""

from .auc import (
    DEFAULT_POSITIVE_RATIO,
    PositiveRatio,
    auc_dual_closed_form_direction,
    auc_margin_minmax,
    auc_square_minmax,
    check_binary_labels,
    check_ratio,
    optimal_dual,
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
