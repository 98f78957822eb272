"""multi_org_auc: the CODASCA Tables 4-5 stand-in (five shifted organisations, target = org 0)."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.data import build_federation
from fedrisk.data.loaders import DATASETS
from fedrisk.data.sources.synthetic import (
    CHEST_XRAY_POSITIVE_RATIOS,
    CHEST_XRAY_SIZES,
    multi_org_auc_data,
    multi_org_auc_federation,
)
from fedrisk.data.transforms import derive_seed
from fedrisk.errors import FedriskError
from fedrisk.metrics import auroc

SIZES = [449, 224, 221, 754, 30]  # round(0.002 * Table 2)
CARDIOMEGALY_POSITIVES = [95, 6, 20, 148, 5]  # round(Table 6 ratio * size)


def rows_of(samples, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    m = samples.attrs["client"] == k
    return samples.x[m], samples.y[m]


def test_registered_with_natural_clients() -> None:
    assert DATASETS.get("multi_org_auc") is multi_org_auc_data
    tr, te, meta = multi_org_auc_data(seed=0)
    assert meta.notes["natural_attribute"] == "client" and meta.notes["target"] == 0
    assert meta.attr_names["client"] == ["CheXpert", "ChestXray8", "PadChest", "MIMIC-CXR", "ChestXrayAD"]
    assert tr.x.shape == (sum(SIZES), 64) and te.x.shape == (5000, 64)
    assert tr.attrs["client"].tolist() == [k for k, n in enumerate(SIZES) for _ in range(n)]
    assert set(te.attrs["client"].tolist()) == {0}


def test_deterministic_per_seed() -> None:
    a, b, c = (multi_org_auc_data(seed=s) for s in (3, 3, 4))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y)
    assert a.meta.notes == b.meta.notes
    assert not torch.equal(a.train.x, c.train.x) and not torch.equal(a.test.x, c.test.x)


def test_target_test_and_organisations_identical_for_every_k() -> None:
    full = multi_org_auc_data(seed=7, num_clients=5)
    for K in range(1, 6):
        tr, te, _ = multi_org_auc_data(seed=7, num_clients=K)
        assert torch.equal(te.x, full.test.x) and torch.equal(te.y, full.test.y)
        assert sorted(set(tr.attrs["client"].tolist())) == list(range(K))
        assert len(tr) == sum(SIZES[:K])
        for k in range(K):  # organisation k's rows do not depend on how many others are drawn in
            for got, want in zip(rows_of(tr, k), rows_of(full.train, k)):
                assert torch.equal(got, want)


def test_target_test_independent_of_the_sources_options() -> None:
    """The test set is the target's own: it ignores the size scale of the training sets."""
    a = multi_org_auc_data(seed=1)
    b = multi_org_auc_data(seed=1, size_scale=0.001)
    assert torch.equal(a.test.x, b.test.x)


@pytest.mark.parametrize("disease", sorted(CHEST_XRAY_POSITIVE_RATIOS))
def test_sizes_and_positive_ratios_follow_tables_2_and_6(disease: str) -> None:
    tr, te, meta = multi_org_auc_data(seed=0, disease=disease)
    ratios = CHEST_XRAY_POSITIVE_RATIOS[disease]
    assert meta.notes["train_sizes"] == SIZES
    for k, (n, pi) in enumerate(zip(SIZES, ratios)):
        _, y = rows_of(tr, k)
        assert len(y) == n == max(1, round(0.002 * CHEST_XRAY_SIZES[k]))
        assert int(y.sum()) == round(pi * n) == meta.notes["train_positives"][k]
        assert abs(float(y.float().mean()) - pi) <= 0.5 / n
    assert int(te.y.sum()) == round(ratios[0] * 5000)


def test_cardiomegaly_counts() -> None:
    _, te, meta = multi_org_auc_data(seed=0)
    assert meta.notes["positive_ratios"] == [0.211, 0.025, 0.089, 0.196, 0.153]
    assert meta.notes["train_positives"] == CARDIOMEGALY_POSITIVES
    assert int(te.y.sum()) == 1055


def test_edema_has_a_single_class_organisation() -> None:
    tr, _, _ = multi_org_auc_data(seed=0, disease="edema")
    assert int(rows_of(tr, 4)[1].sum()) == 0  # ChestXrayAD: Edema ratio 0.000 in Table 6


def test_domain_shift_and_bayes_auroc() -> None:
    tr, te, meta = multi_org_auc_data(seed=0, test_size=20000)
    assert meta.notes["bayes_auroc"] == pytest.approx(0.5 * (1 + math.erf(1.5 / 2)), abs=1e-15)
    cos = meta.notes["direction_cosines_to_target"]
    assert cos[0] == 1.0 and all(0.85 < c < 0.99 for c in cos[1:])
    # the class-mean difference of every organisation is separation * w_k (unit w_k): estimated
    # from the training rows, its norm is about 1.5 for the well-populated organisations
    for k in (0, 3):
        x, y = rows_of(tr, k)
        diff = x[y == 1].mean(0) - x[y == 0].mean(0)
        assert 1.2 < float(diff @ diff / diff.norm()) < 2.5
    # the organisations' feature means differ (class-independent shift m_k)
    means = torch.stack([rows_of(tr, k)[0][rows_of(tr, k)[1] == 0].mean(0) for k in (0, 3)])
    assert float((means[0] - means[1]).norm()) > 0.4
    # the oracle score w_0 . x on the target's test rows reaches the Bayes AUROC (to sampling error)
    w0 = te.x[te.y == 1].mean(0) - te.x[te.y == 0].mean(0)
    assert float(auroc(te.x @ w0, te.y)) == pytest.approx(meta.notes["bayes_auroc"], abs=0.015)


def test_build_federation_gives_one_client_per_organisation() -> None:
    tests = []
    for K in (1, 3, 5):
        fed = build_federation("multi_org_auc", "by_attribute", K, seed=11)
        assert fed.num_clients == K and fed.num_classes == 2
        assert list(fed.client_sizes) == SIZES[:K]
        assert [sorted(set(c.attrs["client"].tolist())) for c in fed.clients] == [[k] for k in range(K)]
        assert [int(c.y.sum()) for c in fed.clients] == CARDIOMEGALY_POSITIVES[:K]
        tests.append(fed.test)
    assert all(torch.equal(t.x, tests[0].x) and torch.equal(t.y, tests[0].y) for t in tests)
    # the builder's data seed is derived from the run seed: the same data as the direct federation
    direct = multi_org_auc_federation(3, seed=derive_seed(11, "dataset"))
    fed = build_federation("multi_org_auc", "by_attribute", 3, seed=11)
    assert all(torch.equal(a.x, b.x) for a, b in zip(direct.clients, fed.clients))
    assert torch.equal(direct.test.x, fed.test.x)
    other = build_federation("multi_org_auc", "by_attribute", 3, seed=12)
    assert not torch.equal(other.test.x, fed.test.x)


def test_federation_info() -> None:
    fed = multi_org_auc_federation(2, seed=0)
    assert fed.info["organisations"] == ["CheXpert", "ChestXray8"]
    assert fed.info["client_positive_ratios"] == pytest.approx([95 / 449, 6 / 224])
    assert fed.info["positive_ratio"] == pytest.approx(101 / 673)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_clients": 6}, r"num_clients = 6 is out of range; allowed: \[1, 5\]"),
        ({"num_clients": 0}, r"num_clients = 0 is out of range"),
        ({"disease": "pneumonia"}, r"unknown disease 'pneumonia'.*atelectasis, cardiomegaly, consolidation"),
        ({"size_scale": 0.0}, r"size_scale = 0.0 is out of range"),
        ({"dim": 0}, r"dim = 0 is out of range"),
        ({"test_size": 0}, r"test_size = 0 is out of range"),
        ({"direction_shift": -1.0}, r"direction_shift = -1.0 is out of range"),
    ],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        multi_org_auc_data(**options)


def test_too_many_clients_through_the_builder() -> None:
    with pytest.raises(FedriskError, match=r"num_clients = 6 is out of range; allowed: \[1, 5\]"):
        build_federation("multi_org_auc", "by_attribute", 6, seed=0)
