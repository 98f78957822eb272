"""Evaluation metrics (classification accuracy family, AUROC / partial AUROC, AP, log loss; NDCG@k
for multi-query ranking in :mod:`fedrisk.metrics.ranking`).

Example:
    >>> from fedrisk.metrics import auroc, parse_metric
    >>> auroc([0.2, 0.7, 0.4], [0, 1, 1])
    1.0
    >>> parse_metric("accuracy")([[0.1, 0.9]], [1])
    1.0
"""

from fedrisk.metrics.classification import (
    LOG_LOSS_EPS,
    METRICS,
    ArrayLike,
    accuracy,
    accuracy_on_classes,
    auprc,
    auroc,
    group_accuracies,
    log_loss,
    parse_metric,
    partial_auroc,
    per_class_accuracy,
    two_way_partial_auroc,
    worst_class_accuracy,
    worst_group_accuracy,
)
from fedrisk.metrics.ranking import ndcg_at_k, ndcg_per_query

__all__ = [
    "LOG_LOSS_EPS",
    "METRICS",
    "ArrayLike",
    "accuracy",
    "accuracy_on_classes",
    "auprc",
    "auroc",
    "group_accuracies",
    "log_loss",
    "ndcg_at_k",
    "ndcg_per_query",
    "parse_metric",
    "partial_auroc",
    "per_class_accuracy",
    "two_way_partial_auroc",
    "worst_class_accuracy",
    "worst_group_accuracy",
]
