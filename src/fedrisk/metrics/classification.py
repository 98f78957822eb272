"""Classification and ranking metrics as pure functions returning Python floats.

Every function accepts torch tensors (any device, gradients are ignored), numpy arrays or
(nested) lists, and computes in float64 numpy.  Ranking metrics (:func:`auroc`,
:func:`partial_auroc`, :func:`two_way_partial_auroc`, :func:`auprc`) take one score per sample
(shape ``[N]`` or ``[N, 1]``; larger means "more positive") and binary labels in ``{0, 1}`` or
``{-1, +1}``; they agree with scikit-learn to rounding error but do not call it.

Configs name metrics through :data:`METRICS` / :func:`parse_metric`.

Example:
    >>> import torch
    >>> scores = torch.tensor([0.9, 0.2, 0.6, 0.6, 0.1])
    >>> labels = torch.tensor([1, 0, 1, 0, 0])
    >>> auroc(scores, labels)  # 5 of 6 pairs ordered correctly, one tie counted 1/2
    0.9166666666666666
    >>> accuracy(torch.tensor([[2.0, 0.1], [0.3, 0.4]]), [0, 0])
    0.5
    >>> parse_metric("pauroc:0.5")(scores, labels)  # ROC area over FPR in [0, 0.5], / 0.5
    0.8333333333333334
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.registry import Registry

ArrayLike = torch.Tensor | np.ndarray | Sequence[Any]
"""Anything :func:`numpy.asarray` understands, or a torch tensor."""

LOG_LOSS_EPS = 1e-15
"""Probabilities are clipped to ``[LOG_LOSS_EPS, 1 - LOG_LOSS_EPS]`` by :func:`log_loss`."""

__all__ = [
    "LOG_LOSS_EPS",
    "METRICS",
    "accuracy",
    "accuracy_on_classes",
    "auprc",
    "auroc",
    "group_accuracies",
    "log_loss",
    "parse_metric",
    "partial_auroc",
    "per_class_accuracy",
    "two_way_partial_auroc",
    "worst_class_accuracy",
    "worst_group_accuracy",
]


# --------------------------------------------------------------------------------------------
# input conversion and validation
# --------------------------------------------------------------------------------------------


def _as_array(x: ArrayLike, fn: str, what: str) -> np.ndarray:
    """``x`` as a numpy array keeping its dtype family (bool / integer / floating)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.is_floating_point() and t.dtype not in (torch.float32, torch.float64):
            t = t.double()  # bfloat16 / float16 have no (or a lossy) numpy equivalent
        arr = t.numpy()
    else:
        try:
            arr = np.asarray(x)
        except ValueError as err:  # ragged nested lists
            raise FedriskError(f"{fn}: {what} must be a rectangular array; {err}") from None
    if arr.dtype.kind not in "biuf":
        raise FedriskError(f"{fn}: {what} must be numeric (bool, int or float); got dtype {arr.dtype}")
    if arr.ndim == 0 or arr.shape[0] == 0:
        raise FedriskError(f"{fn}: {what} must be a non-empty array with one row per sample")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise FedriskError(f"{fn}: {what} contain NaN or infinite values; all must be finite")
    return arr


def _squeeze_column(arr: np.ndarray, fn: str, what: str) -> np.ndarray:
    """``[N]`` or ``[N, 1]`` to ``[N]``; anything else is an error."""
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise FedriskError(f"{fn}: {what} must have shape [N] or [N, 1]; got shape {list(arr.shape)}")
    return arr


def _check_lengths(n: int, m: int, fn: str, what: str = "scores") -> None:
    if n != m:
        raise FedriskError(f"{fn}: {what} has {n} rows but labels has {m}; they must match")


def _labels(labels: ArrayLike, fn: str) -> np.ndarray:
    """Integer-valued labels of shape ``[N]`` (or ``[N, 1]``) as int64."""
    y = _squeeze_column(_as_array(labels, fn, "labels"), fn, "labels")
    if y.dtype.kind == "f" and not np.all(y == np.round(y)):
        raise FedriskError(f"{fn}: labels must be integer class ids; got non-integer values")
    return y.astype(np.int64)


def _binary_labels(labels: ArrayLike, fn: str) -> np.ndarray:
    """Boolean "is positive" mask from labels in ``{0, 1}`` or ``{-1, +1}``."""
    y = _labels(labels, fn)
    values = set(np.unique(y).tolist())
    if not (values <= {0, 1} or values <= {-1, 1}):
        shown = sorted(values)[:10]
        raise FedriskError(f"{fn}: labels must be binary, either {{0, 1}} or {{-1, +1}}; got values {shown}")
    return y == 1


def _binary_scores(scores: ArrayLike, fn: str) -> np.ndarray:
    s = _as_array(scores, fn, "scores")
    return _squeeze_column(s, fn, "scores").astype(np.float64)


def _ranking_inputs(
    scores: ArrayLike, labels: ArrayLike, fn: str, *, need_negatives: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 scores and boolean positives for a ranking metric."""
    s = _binary_scores(scores, fn)
    pos = _binary_labels(labels, fn)
    _check_lengths(len(s), len(pos), fn)
    n_pos = int(pos.sum())
    if n_pos == 0 or (need_negatives and n_pos == len(pos)):
        present = "positive" if n_pos else "negative"
        raise FedriskError(
            f"{fn}: only one class ({present}) is present in labels; "
            "the metric needs at least one positive and one negative sample"
        )
    return s, pos


# --------------------------------------------------------------------------------------------
# accuracy family
# --------------------------------------------------------------------------------------------


def _predictions(
    scores_or_preds: ArrayLike, labels: ArrayLike, threshold: float, fn: str
) -> tuple[np.ndarray, np.ndarray, int]:
    """Predicted and true class ids (int64) plus the number of classes.

    See :func:`accuracy` for how the input is interpreted.
    """
    arr = _as_array(scores_or_preds, fn, "scores")
    if arr.ndim == 2 and arr.shape[1] > 1:
        y = _labels(labels, fn)
        _check_lengths(len(arr), len(y), fn)
        num_classes = arr.shape[1]
        if y.min() < 0 or y.max() >= num_classes:
            raise FedriskError(
                f"{fn}: labels must lie in [0, {num_classes - 1}] for scores with "
                f"{num_classes} columns; got labels in [{y.min()}, {y.max()}]"
            )
        return np.argmax(arr, axis=1).astype(np.int64), y, num_classes
    arr = _squeeze_column(arr, fn, "scores")
    if arr.dtype.kind in "biu":
        return _integer_predictions(arr.astype(np.int64), _labels(labels, fn), fn)
    pos = _binary_labels(labels, fn)
    _check_lengths(len(arr), len(pos), fn)
    return (arr > threshold).astype(np.int64), pos.astype(np.int64), 2


def _integer_predictions(pred: np.ndarray, y: np.ndarray, fn: str) -> tuple[np.ndarray, np.ndarray, int]:
    _check_lengths(len(pred), len(y), fn, "predictions")
    if set(np.unique(y).tolist()) <= {-1, 1} and set(np.unique(pred).tolist()) <= {-1, 1}:
        pred, y = (pred == 1).astype(np.int64), (y == 1).astype(np.int64)
    if y.min() < 0 or pred.min() < 0:
        raise FedriskError(
            f"{fn}: integer predictions and labels must be class ids >= 0 (or both in {{-1, +1}}); got negative values"
        )
    return pred, y, int(max(y.max(), pred.max())) + 1


def accuracy(scores_or_preds: ArrayLike, labels: ArrayLike, *, threshold: float = 0.0) -> float:
    """Fraction of samples whose predicted class equals the label.

    The first argument is interpreted by shape and dtype:

    * ``[N, C]`` with ``C >= 2`` (any dtype): class scores / logits / probabilities; the
      prediction is the argmax (first index on ties) and labels must lie in ``[0, C)``.
    * ``[N]`` or ``[N, 1]`` of **integer or bool** dtype: predicted class ids, compared with
      the labels as they are (if both are in ``{-1, +1}`` that is fine too).
    * ``[N]`` or ``[N, 1]`` of **floating** dtype: binary scores; the prediction is
      "positive" iff ``score > threshold`` (default ``0``, right for logits; pass
      ``threshold=0.5`` for sigmoid probabilities).  Labels must be in ``{0, 1}`` or
      ``{-1, +1}``, and ``1`` is the positive class.

    Example:
        >>> accuracy([0.3, -1.2, 2.0], [1, -1, -1])
        0.6666666666666666
        >>> accuracy([2, 0, 1], [2, 1, 1])
        0.6666666666666666
    """
    pred, y, _ = _predictions(scores_or_preds, labels, threshold, "accuracy")
    return float(np.mean(pred == y))


def accuracy_on_classes(
    scores_or_preds: ArrayLike, labels: ArrayLike, classes: Sequence[int], *, threshold: float = 0.0
) -> float:
    """:func:`accuracy` over the samples whose label is in ``classes`` (``nan`` if there are none).

    A prediction outside ``classes`` counts as wrong.  Byzantine experiments report it for the
    classes the reliable workers hold (spec 002, P13): ``"accuracy_on:0-7"`` in a config.

    Example:
        >>> accuracy_on_classes([0, 1, 9, 8], [0, 1, 2, 9], classes=range(8))
        0.6666666666666666
    """
    pred, y, _ = _predictions(scores_or_preds, labels, threshold, "accuracy_on_classes")
    keep = np.isin(y, np.asarray(list(classes), dtype=np.int64))
    return float(np.mean(pred[keep] == y[keep])) if keep.any() else math.nan


def _parse_classes(text: str, name: str) -> list[int]:
    """``"0-7"`` or ``"0,2,5"`` (or a mix, ``"0-3,8"``) as a sorted list of class ids."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if dash else int(lo)
            if first < 0 or last < first:
                raise ValueError
            out.update(range(first, last + 1))
    except ValueError:
        raise FedriskError(
            f"metric {name!r}: expected class ids >= 0 after ':' as ranges or a comma list, "
            "e.g. 'accuracy_on:0-7' or 'accuracy_on:0,2,5'"
        ) from None
    return sorted(out)


def per_class_accuracy(
    scores_or_preds: ArrayLike,
    labels: ArrayLike,
    *,
    threshold: float = 0.0,
    num_classes: int | None = None,
) -> list[float]:
    """Accuracy (recall) within each true class, as a list indexed by class id.

    The input is interpreted as in :func:`accuracy`; for binary scores index 0 is the negative
    class (label ``0`` or ``-1``) and index 1 the positive class.  The list has
    ``num_classes`` entries (default: ``C`` for ``[N, C]`` scores, 2 for binary scores, and
    ``max(label, prediction) + 1`` for integer predictions); a class without samples gets
    ``nan``.

    Example:
        >>> per_class_accuracy([0, 1, 1, 2], [0, 1, 2, 2])
        [1.0, 1.0, 0.5]
    """
    fn = "per_class_accuracy"
    pred, y, c = _predictions(scores_or_preds, labels, threshold, fn)
    if num_classes is not None:
        check_range(f"{fn}: num_classes", num_classes, max(c, 1))
        c = num_classes
    correct = np.bincount(y, weights=(pred == y).astype(np.float64), minlength=c)
    counts = np.bincount(y, minlength=c)
    return [float(k / n) if n else math.nan for k, n in zip(correct, counts)]


def worst_class_accuracy(scores_or_preds: ArrayLike, labels: ArrayLike, *, threshold: float = 0.0) -> float:
    """The smallest :func:`per_class_accuracy` over classes present in ``labels``.

    Example:
        >>> worst_class_accuracy([0, 1, 1, 2], [0, 1, 2, 2])
        0.5
    """
    per_class = per_class_accuracy(scores_or_preds, labels, threshold=threshold)
    return float(np.nanmin(per_class))


def group_accuracies(
    scores_or_preds: ArrayLike, labels: ArrayLike, groups: ArrayLike, *, threshold: float = 0.0
) -> dict[int, float]:
    """Accuracy within each group (e.g. a sensitive attribute), keyed by integer group id.

    Example:
        >>> group_accuracies([1, 0, 1, 1], [1, 0, 0, 0], groups=[0, 0, 1, 1])
        {0: 1.0, 1: 0.0}
    """
    fn = "group_accuracies"
    pred, y, _ = _predictions(scores_or_preds, labels, threshold, fn)
    g = _group_ids(groups, fn)
    _check_lengths(len(g), len(y), fn, "groups")
    correct = pred == y
    return {int(k): float(np.mean(correct[g == k])) for k in np.unique(g)}


def _group_ids(groups: ArrayLike, fn: str) -> np.ndarray:
    try:
        return _labels(groups, fn)
    except FedriskError:
        raise FedriskError(f"{fn}: groups must be integer group ids, one per sample") from None


def worst_group_accuracy(
    scores_or_preds: ArrayLike, labels: ArrayLike, groups: ArrayLike, *, threshold: float = 0.0
) -> float:
    """The minimum of :func:`group_accuracies` over the groups present.

    Example:
        >>> worst_group_accuracy([1, 0, 1, 1], [1, 0, 0, 1], groups=[0, 0, 1, 1])
        0.5
    """
    per_group = group_accuracies(scores_or_preds, labels, groups, threshold=threshold)
    return min(per_group.values())


# --------------------------------------------------------------------------------------------
# ranking metrics
# --------------------------------------------------------------------------------------------


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count 1/2.

    Computed from mid-ranks (Mann-Whitney U) in O(N log N); equals
    ``sklearn.metrics.roc_auc_score``.  Errors if only one class is present.

    Example:
        >>> auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
        0.75
    """
    s, pos = _ranking_inputs(scores, labels, "auroc")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mid_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each value
    n_pos = int(pos.sum())
    n_neg = len(s) - n_pos
    u = float(mid_ranks[inverse.reshape(-1)][pos].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def _roc_curve(s: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROC vertices (fpr, tpr) from (0, 0) to (1, 1), one per distinct score."""
    order = np.argsort(-s, kind="mergesort")
    s, pos = s[order], pos[order]
    ends = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tps = np.cumsum(pos, dtype=np.int64)[ends]
    fps = ends + 1 - tps
    return np.r_[0, fps] / fps[-1], np.r_[0, tps] / tps[-1]


def _clip_roc(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> tuple[np.ndarray, np.ndarray]:
    """The ROC polyline restricted to ``fpr <= max_fpr``, ending exactly at ``max_fpr``.

    Mirrors scikit-learn's ``_binary_roc_auc_score``: linear interpolation between the last
    vertex at or before ``max_fpr`` and the next one.
    """
    if max_fpr == 1:
        return fpr, tpr
    stop = int(np.searchsorted(fpr, max_fpr, "right"))
    t = np.interp(max_fpr, fpr[stop - 1 : stop + 1], tpr[stop - 1 : stop + 1])
    return np.append(fpr[:stop], max_fpr), np.append(tpr[:stop], t)


def _trapezoid(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def _check_max_fpr(max_fpr: float, fn: str) -> float:
    check_range(f"{fn}: max_fpr", max_fpr, 0.0, 1.0, low_inclusive=False)
    return float(max_fpr)


def partial_auroc(scores: ArrayLike, labels: ArrayLike, max_fpr: float, *, standardized: bool = False) -> float:
    """One-way partial AUROC over false-positive rates ``[0, max_fpr]``.

    The ROC curve (with diagonal segments for ties) is cut at ``max_fpr`` by linear
    interpolation, exactly as scikit-learn does, and its area ``A`` is computed with the
    trapezoid rule.  ``standardized=False`` returns ``A / max_fpr`` (in ``[0, 1]``, 1 for a
    perfect ranking).  ``standardized=True`` returns McClish's standardisation
    ``0.5 * (1 + (A - max_fpr**2 / 2) / (max_fpr - max_fpr**2 / 2))``, which equals
    ``sklearn.metrics.roc_auc_score(labels, scores, max_fpr=max_fpr)``.  With
    ``max_fpr = 1`` both give :func:`auroc`.

    Example:
        >>> partial_auroc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0], max_fpr=0.5)
        0.5
    """
    fn = "partial_auroc"
    max_fpr = _check_max_fpr(max_fpr, fn)
    s, pos = _ranking_inputs(scores, labels, fn)
    area = _trapezoid(*_clip_roc(*_roc_curve(s, pos), max_fpr))
    if max_fpr == 1:
        return area
    if standardized:
        min_area = 0.5 * max_fpr**2
        return 0.5 * (1 + (area - min_area) / (max_fpr - min_area))
    return area / max_fpr


def _area_above(fpr: np.ndarray, tpr: np.ndarray, level: float) -> float:
    """Area between the (non-decreasing) ROC polyline and the line ``tpr = level``, above it."""
    a0, a1, dx = tpr[:-1] - level, tpr[1:] - level, np.diff(fpr)
    full = np.where(a0 >= 0, dx * (a0 + a1) / 2.0, 0.0)
    crossing = (a0 < 0) & (a1 > 0)
    safe = np.where(crossing, a1 - a0, 1.0)
    part = np.where(crossing, dx * np.maximum(a1, 0.0) ** 2 / (2.0 * safe), 0.0)
    return float(np.sum(full + part))


def two_way_partial_auroc(scores: ArrayLike, labels: ArrayLike, max_fpr: float, min_tpr: float) -> float:
    """Two-way partial AUROC (TPAUC): the ROC area with ``FPR <= max_fpr`` and ``TPR >= min_tpr``.

    The area of the region under the ROC polyline, left of ``max_fpr`` and above
    ``min_tpr``, divided by the area ``max_fpr * (1 - min_tpr)`` of that box, so a perfect
    ranking gives 1 and a reversed one 0.  Ties make diagonal ROC segments, and a cut through
    one is interpolated linearly (as in :func:`partial_auroc`).  When ``max_fpr * n_neg`` and
    ``(1 - min_tpr) * n_pos`` are integers and no group of tied negatives (positives)
    straddles either cut, this equals the plain AUROC between the lowest-scored
    ``(1 - min_tpr)`` fraction of positives and the highest-scored ``max_fpr`` fraction of
    negatives (ties count 1/2), the estimator used by FeDXL / LibAUC.  With ``min_tpr = 0``
    it equals ``partial_auroc(..., standardized=False)``.

    Example:
        >>> two_way_partial_auroc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0], max_fpr=0.5, min_tpr=0.5)
        0.0
    """
    fn = "two_way_partial_auroc"
    max_fpr = _check_max_fpr(max_fpr, fn)
    check_range(f"{fn}: min_tpr", min_tpr, 0.0, 1.0, high_inclusive=False)
    s, pos = _ranking_inputs(scores, labels, fn)
    fpr, tpr = _clip_roc(*_roc_curve(s, pos), max_fpr)
    return _area_above(fpr, tpr, float(min_tpr)) / (max_fpr * (1.0 - min_tpr))


def auprc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Average precision ``sum_k (R_k - R_{k-1}) P_k`` over distinct score thresholds.

    Equals ``sklearn.metrics.average_precision_score`` (no interpolation).  Needs at least
    one positive; negatives may be absent (the result is then 1).

    Example:
        >>> auprc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0])
        0.8333333333333333
    """
    s, pos = _ranking_inputs(scores, labels, "auprc", need_negatives=False)
    order = np.argsort(-s, kind="mergesort")
    s, pos = s[order], pos[order]
    ends = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tps = np.cumsum(pos, dtype=np.int64)[ends]
    precision = tps / (ends + 1)
    recall = tps / tps[-1]
    return max(0.0, float(np.sum(np.diff(np.r_[0.0, recall]) * precision)))


# --------------------------------------------------------------------------------------------
# log loss
# --------------------------------------------------------------------------------------------


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def _check_probabilities(p: np.ndarray, fn: str) -> None:
    if p.min() < 0 or p.max() > 1:
        raise FedriskError(
            f"{fn}: probabilities must lie in [0, 1]; got values in [{p.min():.4g}, "
            f"{p.max():.4g}] (pass from_logits=True for logits)"
        )
    if p.ndim == 2 and not np.allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-6):
        raise FedriskError(
            f"{fn}: each row of class probabilities must sum to 1 (within 1e-6) (pass from_logits=True for logits)"
        )


def _true_class_log_prob(values: np.ndarray, labels: ArrayLike, from_logits: bool, fn: str) -> np.ndarray:
    """log P(true class) per sample, before clipping."""
    if values.ndim == 2 and values.shape[1] > 1:
        y = _labels(labels, fn)
        _check_lengths(len(values), len(y), fn, "probabilities")
        c = values.shape[1]
        if c == 2 and set(np.unique(y).tolist()) <= {-1, 1}:
            y = (y == 1).astype(np.int64)
        if y.min() < 0 or y.max() >= c:
            raise FedriskError(
                f"{fn}: labels must lie in [0, {c - 1}] for {c} columns; got labels in [{y.min()}, {y.max()}]"
            )
        if not from_logits:
            _check_probabilities(values, fn)
            with np.errstate(divide="ignore"):
                return np.log(values[np.arange(len(y)), y])
        return _log_softmax(values)[np.arange(len(y)), y]
    v = _squeeze_column(values, fn, "probabilities")
    pos = _binary_labels(labels, fn)
    _check_lengths(len(v), len(pos), fn, "probabilities")
    if from_logits:
        return _log_sigmoid(np.where(pos, v, -v))
    _check_probabilities(v, fn)
    with np.errstate(divide="ignore"):
        return np.log(np.where(pos, v, 1.0 - v))


def log_loss(probs_or_logits: ArrayLike, labels: ArrayLike, *, from_logits: bool = False) -> float:
    """Mean negative log-likelihood of the true class (cross-entropy), natural log.

    ``[N, C]`` inputs are class probabilities (rows summing to 1) or, with
    ``from_logits=True``, logits passed through a softmax; labels are class ids in
    ``[0, C)`` (for ``C = 2`` also ``{-1, +1}``).  ``[N]`` / ``[N, 1]`` inputs are the
    probability (or logit, through a sigmoid) of the positive class, with labels in
    ``{0, 1}`` or ``{-1, +1}``.

    The probability of the true class is clipped to ``[1e-15, 1 - 1e-15]``
    (:data:`LOG_LOSS_EPS`) in both modes (logits clip the log-probability, which is the same
    thing), so the loss per sample is at most ``-log(1e-15) ~= 34.5``.  Away from the clip
    this equals ``sklearn.metrics.log_loss``; scikit-learn >= 1.5 clips at the dtype's
    machine epsilon instead, so results differ only for probabilities within 1e-15 of 0 or 1.

    Example:
        >>> round(log_loss([0.8, 0.4], [1, 0]), 6)
        0.366985
        >>> round(log_loss([[0.0, 0.0]], [1], from_logits=True), 6)
        0.693147
    """
    fn = "log_loss"
    values = _as_array(probs_or_logits, fn, "probabilities").astype(np.float64)
    log_p = _true_class_log_prob(values, labels, from_logits, fn)
    log_p = np.clip(log_p, math.log(LOG_LOSS_EPS), math.log1p(-LOG_LOSS_EPS))
    return float(-np.mean(log_p))


# --------------------------------------------------------------------------------------------
# names for configs
# --------------------------------------------------------------------------------------------

METRICS: Registry[Callable[..., float]] = Registry("metric")
"""Metrics taking ``(scores, labels)`` by fixed name; see :func:`parse_metric` for the
parametrised partial-AUROC names."""

METRICS.add("accuracy", accuracy, "fraction of correct argmax / thresholded predictions")
METRICS.add("worst_class_accuracy", worst_class_accuracy, "minimum over classes of per-class accuracy")
METRICS.add("auroc", auroc, "area under the ROC curve (ties count 1/2)")
METRICS.add("auprc", auprc, "average precision (area under the precision-recall curve)")
METRICS.add("log_loss", log_loss, "mean cross-entropy of probabilities, clipped at 1e-15")

_PARAMETRISED = (
    "accuracy_on:<classes>",
    "pauroc:<max_fpr>",
    "spauroc:<max_fpr>",
    "tpauroc:<max_fpr>,<min_tpr>",
    "ndcg@<k>",
)


def _parse_floats(text: str, count: int, name: str) -> list[float]:
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != count:
        raise FedriskError(
            f"metric {name!r}: expected {count} comma-separated number(s) after ':'; "
            f"allowed forms: {', '.join(_PARAMETRISED)}"
        )
    return values


def parse_metric(name: str) -> Callable[[ArrayLike, ArrayLike], float]:
    """The metric function ``f(scores, labels) -> float`` named ``name``.

    ``name`` is one of :data:`METRICS`' names, ``"accuracy_on:<classes>"`` (:func:`accuracy_on_classes`,
    e.g. ``"accuracy_on:0-7"``), ``"pauroc:<max_fpr>"`` (unstandardised
    :func:`partial_auroc`, e.g. ``"pauroc:0.3"``), ``"spauroc:<max_fpr>"`` (McClish-standardised, as
    scikit-learn's ``roc_auc_score(max_fpr=...)`` and FeDXL's tables) or ``"tpauroc:<max_fpr>,<min_tpr>"``
    (:func:`two_way_partial_auroc`, e.g. ``"tpauroc:0.5,0.5"``); ``"ndcg"`` / ``"ndcg@<k>"``
    (:func:`fedrisk.metrics.ranking.parse_ndcg`: ``f(scores, relevance, queries=None)``).

    Example:
        >>> parse_metric("tpauroc:0.5,0.5")([0.9, 0.1, 0.8, 0.3], [1, 0, 1, 0])
        1.0
    """
    if name == "ndcg" or name.startswith("ndcg@"):
        from fedrisk.metrics.ranking import parse_ndcg  # ranking imports this module

        return parse_ndcg(name)
    kind, sep, arg = name.strip().partition(":")
    if not sep:
        if name in METRICS:
            return METRICS.get(name)
        raise unknown_name("metric", name, [*METRICS.names(), *_PARAMETRISED])
    if kind == "accuracy_on":
        return functools.partial(accuracy_on_classes, classes=_parse_classes(arg, name))
    if kind == "pauroc":
        (max_fpr,) = _parse_floats(arg, 1, name)
        _check_max_fpr(max_fpr, f"metric {name!r}")
        return functools.partial(partial_auroc, max_fpr=max_fpr)
    if kind == "spauroc":
        (max_fpr,) = _parse_floats(arg, 1, name)
        _check_max_fpr(max_fpr, f"metric {name!r}")
        return functools.partial(partial_auroc, max_fpr=max_fpr, standardized=True)
    if kind == "tpauroc":
        max_fpr, min_tpr = _parse_floats(arg, 2, name)
        _check_max_fpr(max_fpr, f"metric {name!r}")
        check_range(f"metric {name!r}: min_tpr", min_tpr, 0.0, 1.0, high_inclusive=False)
        return functools.partial(two_way_partial_auroc, max_fpr=max_fpr, min_tpr=min_tpr)
    raise unknown_name("metric kind", kind, ["accuracy_on", "pauroc", "spauroc", "tpauroc"])
