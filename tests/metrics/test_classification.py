"""Tests for fedrisk.metrics.classification: agreement with scikit-learn, hand cases, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from fedrisk.errors import FedriskError
from fedrisk.metrics import (
    METRICS,
    accuracy,
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

SEEDS = range(8)


def random_binary(seed: int, n: int = 300, decimals: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Scores correlated with labels, rounded so that many ties occur."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    y[:2] = [0, 1]
    s = np.round(rng.normal(size=n) + 0.8 * y, decimals)
    return s, y


def sklearn_partial_area(y: np.ndarray, s: np.ndarray, max_fpr: float) -> float:
    """scikit-learn's own unstandardised partial area (from ``_binary_roc_auc_score``)."""
    fpr, tpr, _ = skm.roc_curve(y, s)
    if max_fpr == 1:
        return float(skm.auc(fpr, tpr))
    stop = np.searchsorted(fpr, max_fpr, "right")
    x_interp = [fpr[stop - 1], fpr[stop]]
    y_interp = [tpr[stop - 1], tpr[stop]]
    tpr = np.append(tpr[:stop], np.interp(max_fpr, x_interp, y_interp))
    fpr = np.append(fpr[:stop], max_fpr)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))


def libauc_tpauc(y: np.ndarray, s: np.ndarray, max_fpr: float, min_tpr: float) -> float:
    """AUROC between the lowest (1 - min_tpr) positives and the highest max_fpr negatives."""
    pos, neg = np.sort(s[y == 1]), np.sort(s[y != 1])[::-1]
    n_pos, n_neg = round(len(pos) * (1 - min_tpr)), round(len(neg) * max_fpr)
    sp, sn = pos[:n_pos], neg[:n_neg]
    diff = sp[:, None] - sn[None, :]
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


# ------------------------------------------------------------------------------ accuracy


def test_accuracy_multiclass_argmax_numpy_and_torch() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(50, 4))
    labels = rng.integers(0, 4, size=50)
    expected = skm.accuracy_score(labels, scores.argmax(1))
    assert accuracy(scores, labels) == pytest.approx(expected, abs=1e-15)
    assert accuracy(torch.from_numpy(scores).float(), torch.from_numpy(labels)) == pytest.approx(expected, abs=1e-15)
    assert isinstance(accuracy(scores, labels), float)


def test_accuracy_binary_scores_threshold_and_pm1_labels() -> None:
    logits = [2.0, -1.0, 0.0, 0.5]  # 0.0 is not > 0, so predicted negative
    assert accuracy(logits, [1, 0, 0, 0]) == 0.75
    assert accuracy(logits, [1, -1, -1, -1]) == 0.75
    assert accuracy(torch.tensor(logits).unsqueeze(1), torch.tensor([1, 0, 0, 0])) == 0.75
    probs = [0.9, 0.2, 0.6, 0.4]
    assert accuracy(probs, [1, 0, 1, 0], threshold=0.5) == 1.0
    assert accuracy(probs, [1, 0, 1, 0]) == 0.5  # default threshold 0 suits logits only


def test_accuracy_integer_predictions() -> None:
    assert accuracy([2, 0, 1, 1], [2, 1, 1, 0]) == 0.5
    assert accuracy(torch.tensor([1, -1, 1]), torch.tensor([1, -1, -1])) == pytest.approx(2 / 3)
    assert accuracy(np.array([True, False]), [1, 1]) == 0.5


def test_per_class_and_worst_class_accuracy() -> None:
    scores = np.eye(3)[[0, 1, 1, 2, 2, 0]]  # predictions 0 1 1 2 2 0
    labels = [0, 1, 2, 2, 2, 1]
    assert per_class_accuracy(scores, labels) == [1.0, 0.5, pytest.approx(2 / 3)]
    assert worst_class_accuracy(scores, labels) == 0.5
    recall = skm.recall_score(labels, scores.argmax(1), average=None)
    np.testing.assert_allclose(per_class_accuracy(scores, labels), recall)


def test_per_class_accuracy_missing_class_is_nan_and_ignored_by_worst() -> None:
    scores = np.eye(3)[[0, 0, 1]]
    per_class = per_class_accuracy(scores, [0, 1, 1])
    assert per_class[:2] == [1.0, 0.5] and math.isnan(per_class[2])
    assert worst_class_accuracy(scores, [0, 1, 1]) == 0.5
    assert len(per_class_accuracy([0, 1], [0, 1], num_classes=5)) == 5


def test_per_class_binary_scores_index_zero_is_negative() -> None:
    assert per_class_accuracy([-1.0, 1.0, 1.0, 2.0], [-1, -1, 1, 1]) == [0.5, 1.0]


def test_group_accuracies_and_worst_group() -> None:
    preds = torch.tensor([1, 0, 1, 1, 0, 0])
    labels = torch.tensor([1, 0, 0, 1, 0, 1])
    groups = torch.tensor([5, 5, 7, 7, 9, 9])
    assert group_accuracies(preds, labels, groups) == {5: 1.0, 7: 0.5, 9: 0.5}
    assert worst_group_accuracy(preds, labels, groups) == 0.5


# ------------------------------------------------------------------------------ AUROC family


@pytest.mark.parametrize("seed", SEEDS)
def test_auroc_matches_sklearn_with_ties(seed: int) -> None:
    s, y = random_binary(seed)
    assert abs(auroc(s, y) - skm.roc_auc_score(y, s)) < 1e-12


def test_auroc_pm1_labels_and_input_types_agree() -> None:
    s, y = random_binary(11, n=101, decimals=2)
    ref = skm.roc_auc_score(y, s)
    pm = 2 * y - 1
    for scores, labels in [
        (s, pm),
        (torch.from_numpy(s), torch.from_numpy(pm)),
        (torch.from_numpy(s).unsqueeze(1), torch.from_numpy(y).float()),
        (s.tolist(), y.tolist()),
        (torch.from_numpy(s).requires_grad_(), torch.from_numpy(y).bool()),
    ]:
        assert abs(auroc(scores, labels) - ref) < 1e-12


def test_auroc_hand_cases() -> None:
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5  # all tied
    # positives 0.9, 0.6; negatives 0.2, 0.6, 0.1: 5 wins + one tie over 6 pairs
    assert auroc([0.9, 0.2, 0.6, 0.6, 0.1], [1, 0, 1, 0, 0]) == pytest.approx(5.5 / 6, abs=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_fpr", [0.05, 0.1, 0.3, 0.5, 0.77, 1.0])
def test_partial_auroc_matches_sklearn(seed: int, max_fpr: float) -> None:
    s, y = random_binary(seed, n=200)
    std = partial_auroc(s, y, max_fpr, standardized=True)
    assert abs(std - skm.roc_auc_score(y, s, max_fpr=max_fpr)) < 1e-12
    plain = partial_auroc(torch.from_numpy(s), torch.from_numpy(2 * y - 1), max_fpr)
    assert abs(plain - sklearn_partial_area(y, s, max_fpr) / max_fpr) < 1e-12
    assert 0.0 <= plain <= 1.0


def test_partial_auroc_full_range_is_auroc() -> None:
    s, y = random_binary(3)
    assert partial_auroc(s, y, 1.0) == pytest.approx(auroc(s, y), abs=1e-12)


def test_partial_auroc_hand_case() -> None:
    # ROC vertices (0,0) (0,1/2) (1/3,1) (2/3,1) (1,1); area on [0, 1/2] is 1/4 + 1/6
    scores, labels = [0.9, 0.2, 0.6, 0.6, 0.1], [1, 0, 1, 0, 0]
    assert partial_auroc(scores, labels, 0.5) == pytest.approx((1 / 4 + 1 / 6) / 0.5, abs=1e-15)
    assert partial_auroc([0.1, 0.9], [0, 1], 0.2) == 1.0
    assert partial_auroc([0.9, 0.1], [0, 1], 0.2) == 0.0


def test_two_way_partial_auroc_hand_cases() -> None:
    assert two_way_partial_auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], 0.5, 0.5) == 1.0
    assert two_way_partial_auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1], 0.5, 0.5) == 0.0
    # pos 0.9, 0.7; neg 0.8, 0.1.  Region FPR <= 1/2, TPR >= 1/2: the only pair there is the
    # lowest positive (0.7) against the highest negative (0.8), ranked wrongly -> 0.
    assert two_way_partial_auroc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0], 0.5, 0.5) == 0.0
    # ROC (0,0) (0,1/2) (1/2,1/2) (1/2,1) (1,1); with min_tpr 0.25 the box is [0,1] x [1/4,1]:
    # area above 1/4 = 1/2 * 1/4 + 1/2 * 3/4 = 1/2, normalised by 3/4.
    value = two_way_partial_auroc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0], 1.0, 0.25)
    assert value == pytest.approx(2 / 3, abs=1e-15)
    # a tie between the lowest positive and the highest negative counts 1/2
    assert two_way_partial_auroc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0], 0.5, 0.5) == 0.5
    # a crossing segment: all tied, ROC is the diagonal; triangle above 1/2 left of 1 is 1/8
    # (a pair estimator that keeps 1 of the 2 tied positives would say 1/2 instead)
    value = two_way_partial_auroc([0.3] * 4, [1, 1, 0, 0], 1.0, 0.5)
    assert value == pytest.approx(0.125 / 0.5, abs=1e-15)


def straddles(values: np.ndarray, k: int) -> bool:
    """Whether the first ``k`` of the sorted ``values`` end inside a group of ties."""
    return 0 < k < len(values) and values[k - 1] == values[k]


@pytest.mark.parametrize("seed", SEEDS)
def test_two_way_partial_auroc_equals_pair_estimator(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = np.array([1] * 40 + [0] * 60)
    s = np.round(rng.normal(size=100) + y, 2)  # ties, also between positives and negatives
    pos, neg = np.sort(s[y == 1]), np.sort(s[y == 0])[::-1]
    checked = 0
    for max_fpr, min_tpr in [(0.5, 0.5), (0.3, 0.25), (1.0, 0.0), (0.1, 0.9), (0.2, 0.5)]:
        if straddles(pos, round(40 * (1 - min_tpr))) or straddles(neg, round(60 * max_fpr)):
            continue  # the pair estimator then depends on which tied samples it keeps
        ours = two_way_partial_auroc(s, y, max_fpr, min_tpr)
        assert abs(ours - libauc_tpauc(y, s, max_fpr, min_tpr)) < 1e-12
        checked += 1
    assert checked >= 3


def test_two_way_with_min_tpr_zero_is_one_way() -> None:
    s, y = random_binary(5)
    for max_fpr in (0.13, 0.5, 1.0):
        assert two_way_partial_auroc(s, y, max_fpr, 0.0) == pytest.approx(partial_auroc(s, y, max_fpr), abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_auprc_matches_sklearn(seed: int) -> None:
    s, y = random_binary(seed)
    assert abs(auprc(s, y) - skm.average_precision_score(y, s)) < 1e-12
    assert abs(auprc(torch.from_numpy(s), torch.from_numpy(2 * y - 1)) - auprc(s, y)) < 1e-15


def test_auprc_hand_cases() -> None:
    # ranks: P N P N -> precision at the positives 1 and 2/3
    assert auprc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx((1 + 2 / 3) / 2)
    assert auprc([0.3, 0.4], [1, 1]) == 1.0  # no negatives is allowed


# ------------------------------------------------------------------------------ log loss


@pytest.mark.parametrize("seed", range(4))
def test_log_loss_binary_matches_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=80)
    logits = rng.normal(size=80) * 3
    p = 1 / (1 + np.exp(-logits))
    ref = skm.log_loss(y, p)
    assert abs(log_loss(p, y) - ref) < 1e-12
    assert abs(log_loss(torch.from_numpy(p), torch.from_numpy(2 * y - 1)) - ref) < 1e-12
    assert abs(log_loss(logits, y, from_logits=True) - ref) < 1e-12
    assert abs(log_loss(np.stack([1 - p, p], 1), y) - ref) < 1e-12


@pytest.mark.parametrize("seed", range(4))
def test_log_loss_multiclass_matches_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(60, 5)) * 2
    y = rng.integers(0, 5, size=60)
    p = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    ref = skm.log_loss(y, p, labels=range(5))
    assert abs(log_loss(p, y) - ref) < 1e-12
    assert abs(log_loss(torch.from_numpy(logits), y, from_logits=True) - ref) < 1e-12


def test_log_loss_clips_at_1e_15() -> None:
    cap = -math.log(1e-15)
    assert log_loss([0.0, 1.0], [1, 0]) == pytest.approx(cap, rel=1e-12)
    assert log_loss([-1e4], [1], from_logits=True) == pytest.approx(cap, rel=1e-12)
    assert log_loss([[1.0, 0.0]], [1]) == pytest.approx(cap, rel=1e-12)
    assert log_loss([1.0, 0.0], [1, 0]) == pytest.approx(-math.log1p(-1e-15), rel=1e-6)


# ------------------------------------------------------------------------------ names


def test_registry_and_parse_metric() -> None:
    assert METRICS.names() == ["accuracy", "auprc", "auroc", "log_loss", "worst_class_accuracy"]
    s, y = random_binary(2)
    assert parse_metric("auroc")(s, y) == auroc(s, y)
    assert parse_metric("pauroc:0.3")(s, y) == partial_auroc(s, y, 0.3)
    assert parse_metric(" tpauroc:0.5,0.25 ")(s, y) == two_way_partial_auroc(s, y, 0.5, 0.25)


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("aucroc", ["unknown metric 'aucroc'", "auroc", "pauroc:<max_fpr>"]),
        ("pauroc:abc", ["expected 1 comma-separated number", "tpauroc:<max_fpr>,<min_tpr>"]),
        ("tpauroc:0.5", ["expected 2 comma-separated number"]),
        ("pauroc:1.5", ["max_fpr = 1.5 is out of range", "(0.0, 1.0]"]),
        ("tpauroc:0.5,1", ["min_tpr = 1.0 is out of range", "[0.0, 1.0)"]),
        ("xauroc:0.5", ["unknown metric kind 'xauroc'", "pauroc, tpauroc"]),
    ],
)
def test_parse_metric_errors(name: str, fragments: list[str]) -> None:
    with pytest.raises(FedriskError) as info:
        parse_metric(name)
    for fragment in fragments:
        assert fragment in str(info.value)


# ------------------------------------------------------------------------------ input errors


@pytest.mark.parametrize(
    ("call", "fragments"),
    [
        (lambda: auroc([0.1, 0.2], [1, 1]), ["only one class (positive)", "at least one"]),
        (lambda: auroc([0.1, 0.2], [0, 0]), ["only one class (negative)"]),
        (lambda: auroc([0.1, 0.2, 0.3], [0, 1, 2]), ["binary", "{0, 1} or {-1, +1}", "[0, 1, 2]"]),
        (lambda: auroc([0.1, 0.2], [-1, 0]), ["must be binary"]),
        (lambda: auroc([0.1, 0.2], [0, 1, 1]), ["scores has 2 rows but labels has 3"]),
        (lambda: auroc([[0.1, 0.2]] * 2, [0, 1]), ["shape [N] or [N, 1]", "[2, 2]"]),
        (lambda: auroc([0.1, float("nan")], [0, 1]), ["NaN or infinite"]),
        (lambda: auroc([], []), ["non-empty"]),
        (lambda: auroc([0.1, 0.2], [0.5, 1]), ["integer class ids"]),
        (lambda: auroc(["a", "b"], [0, 1]), ["must be numeric"]),
        (lambda: auprc([0.1, 0.2], [0, 0]), ["only one class (negative)"]),
        (lambda: partial_auroc([0.1, 0.2], [0, 1], 0.0), ["max_fpr = 0.0", "(0.0, 1.0]"]),
        (lambda: partial_auroc([0.1, 0.2], [0, 1], 1.2), ["max_fpr = 1.2 is out of range"]),
        (lambda: two_way_partial_auroc([0.1, 0.2], [0, 1], 0.5, -0.1), ["min_tpr = -0.1"]),
        (lambda: accuracy([[0.1, 0.9]], [2]), ["labels must lie in [0, 1]", "2 columns"]),
        (lambda: accuracy([0.1, 0.9], [0, 2]), ["must be binary"]),
        (lambda: accuracy([0, -2], [0, 1]), ["class ids >= 0"]),
        (lambda: worst_group_accuracy([1, 0], [1, 0], [0.5, 1]), ["groups must be integer"]),
        (lambda: worst_group_accuracy([1, 0], [1, 0], [0]), ["groups has 1 rows"]),
        (lambda: log_loss([1.2, 0.5], [1, 0]), ["[0, 1]", "from_logits=True"]),
        (lambda: log_loss([[0.2, 0.2]], [0]), ["sum to 1", "from_logits=True"]),
        (lambda: log_loss([[0.5, 0.5]], [3]), ["labels must lie in [0, 1]"]),
        (lambda: per_class_accuracy([0, 2], [0, 1], num_classes=2), ["num_classes = 2"]),
    ],
)
def test_bad_inputs_raise_fedrisk_error(call, fragments: list[str]) -> None:
    with pytest.raises(FedriskError) as info:
        call()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_accuracy_on_classes_and_its_config_name() -> None:
    from fedrisk.metrics import accuracy_on_classes, parse_metric

    scores = np.eye(10)[[0, 1, 9, 8, 3]]  # predictions 0, 1, 9, 8, 3
    labels = [0, 1, 2, 9, 3]
    assert accuracy_on_classes(scores, labels, classes=range(8)) == pytest.approx(3 / 4)  # 9 is not counted
    assert parse_metric("accuracy_on:0-7")(scores, labels) == pytest.approx(3 / 4)
    assert parse_metric("accuracy_on:0,2-3")(scores, labels) == pytest.approx(2 / 3)
    assert parse_metric("accuracy_on:9")(scores, labels) == 0.0
    assert math.isnan(accuracy_on_classes(scores, labels, classes=[5]))
    for bad in ("accuracy_on:7-3", "accuracy_on:", "accuracy_on:a-b", "accuracy_on:-1"):
        with pytest.raises(FedriskError, match="class ids >= 0"):
            parse_metric(bad)
