"""Per-batch supervised losses ``loss(outputs, labels) -> scalar``, as pure tensor functions.

Example:
    >>> import torch
    >>> round(float(cross_entropy(torch.zeros(2, 3), torch.tensor([0, 2]))), 4)
    1.0986
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrisk.autodiff import in_functorch_transform

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean softmax cross-entropy of ``logits`` [N, C] against integer ``labels`` [N].

    Eagerly this is ``F.cross_entropy`` (one fused kernel).  Under ``torch.func`` transforms
    it is the same quantity written as ``mean(logsumexp(logits) - logits[label])``: vmap
    decomposes ``F.cross_entropy`` into ``nll_loss`` with scatters, and the explicit form
    runs a vmapped gradient step twice as fast (logistic regression, 1000 clients x 16 rows:
    4.4 vs 9.6 ms).  The two agree to float rounding (1e-16 in float64).
    """
    if in_functorch_transform():
        labels = labels.long()
        return (torch.logsumexp(logits, -1) - logits.gather(-1, labels[:, None])[:, 0]).mean()
    return F.cross_entropy(logits, labels.long())


def binary_cross_entropy(scores: Tensor, labels: Tensor) -> Tensor:
    """Mean binary cross-entropy of logits ``scores`` [N] or [N, 1] against labels in {0, 1}."""
    return F.binary_cross_entropy_with_logits(scores.reshape(-1), labels.reshape(-1).to(scores.dtype))


def binary_cross_entropy_probs(probs: Tensor, labels: Tensor) -> Tensor:
    """Mean binary cross-entropy of probabilities in (0, 1) (sigmoid-output scorers)."""
    p = probs.reshape(-1).clamp(1e-7, 1 - 1e-7)
    y = labels.reshape(-1).to(p.dtype)
    return -(y * torch.log(p) + (1 - y) * torch.log1p(-p)).mean()


def mean_squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """``mean((outputs - targets)^2) / 2`` (the least-squares loss; targets shaped like outputs)."""
    return 0.5 * ((outputs.reshape(targets.shape) - targets.to(outputs.dtype)) ** 2).mean()


LOSSES: dict[str, tuple[LossFn, str]] = {
    "cross_entropy": (cross_entropy, "softmax cross-entropy on [N, C] logits"),
    "binary_cross_entropy": (binary_cross_entropy, "binary cross-entropy on one-output logits"),
    "binary_cross_entropy_probs": (binary_cross_entropy_probs, "binary cross-entropy on sigmoid scores"),
    "mse": (mean_squared_error, "least squares 0.5 * mean((f(x) - y)^2)"),
}
