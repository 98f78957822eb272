"""Seeded transforms: binarize / imratio, noise, label flipping, standardisation."""

from __future__ import annotations

import pytest
import torch

from fedrisk.data.federation import Samples
from fedrisk.data.transforms import (
    add_feature_noise,
    balance_classes,
    binarize,
    derive_seed,
    flip_labels,
    label_flip_attack,
    positive_count_for_ratio,
    standardize,
)
from fedrisk.errors import FedriskError


def make(n_per_class: int = 100, num_classes: int = 10, dim: int = 3) -> Samples:
    y = torch.arange(num_classes).repeat_interleave(n_per_class)
    x = torch.randn(len(y), dim, generator=torch.Generator().manual_seed(0))
    return Samples(x, y, {"group": y % 2})


def test_binarize_labels_and_original_class() -> None:
    s = make()
    b = binarize(s, positive_classes=[5, 6, 7, 8, 9])
    assert b.y.dtype == torch.int64
    assert torch.equal(b.y, (s.y >= 5).long())
    assert torch.equal(b.attrs["class"], s.y)
    assert torch.equal(b.attrs["group"], s.attrs["group"])
    assert "class" not in binarize(s, [1], keep_class=False).attrs


@pytest.mark.parametrize("imratio", [0.01, 0.05, 0.1, 0.2, 0.3, 0.5])
def test_imratio_fraction_within_one_over_n(imratio: float) -> None:
    b = binarize(make(), range(5, 10), imratio=imratio, seed=1)
    n = len(b)
    assert abs(float(b.y.float().mean()) - imratio) <= 1.0 / n
    assert int((b.y == 0).sum()) == 500  # every negative kept
    assert int(b.y.sum()) == positive_count_for_ratio(imratio, 500)


def test_imratio_is_seeded_and_keeps_order() -> None:
    s = make()
    a = binarize(s, range(5, 10), imratio=0.1, seed=3)
    assert torch.equal(a.x, binarize(s, range(5, 10), imratio=0.1, seed=3).x)
    assert not torch.equal(a.x, binarize(s, range(5, 10), imratio=0.1, seed=4).x)
    assert torch.all(a.attrs["class"][1:] >= a.attrs["class"][:-1])  # original order kept


def test_imratio_per_class_is_codasca_rounding() -> None:
    b = binarize(make(500), range(5, 10), imratio=0.1, seed=0, per_class=True)
    counts = torch.bincount(b.attrs["class"], minlength=10).tolist()
    assert counts == [500] * 5 + [55] * 5


def test_imratio_needs_enough_positives() -> None:
    with pytest.raises(FedriskError) as err:
        binarize(make(), [9], imratio=0.5)
    msg = str(err.value)
    assert "imratio = 0.5" in msg and "only 100 positives" in msg and "allowed: imratio <= 0.1" in msg


@pytest.mark.parametrize("imratio", [0.0, 1.0, -0.1])
def test_imratio_range(imratio: float) -> None:
    with pytest.raises(FedriskError, match=r"imratio = .* out of range; allowed: \(0\.0, 1\.0\)"):
        binarize(make(), [9], imratio=imratio)


def test_binarize_needs_positive_classes() -> None:
    with pytest.raises(FedriskError, match="at least one class"):
        binarize(make(), [])


def test_balance_classes() -> None:
    b = balance_classes(binarize(make(), [8, 9]), seed=0)
    assert int(b.y.sum()) == 200 and len(b) == 400
    with pytest.raises(FedriskError, match="binary labels"):
        balance_classes(make())


def test_add_feature_noise_moments_and_purity() -> None:
    s = make(1000, 2, 5)
    before = s.x.clone()
    n = add_feature_noise(s, std=0.2, seed=0, mean=-0.08)
    assert torch.equal(s.x, before)  # input untouched
    d = n.x - s.x
    assert abs(d.mean().item() + 0.08) < 0.01 and abs(d.std().item() - 0.2) < 0.01
    assert torch.equal(n.x, add_feature_noise(s, 0.2, seed=0, mean=-0.08).x)
    assert not torch.equal(n.x, add_feature_noise(s, 0.2, seed=1, mean=-0.08).x)
    assert torch.equal(n.y, s.y)
    with pytest.raises(FedriskError, match=r"std = -1\.0 is out of range; allowed: \[0\.0, inf\)"):
        add_feature_noise(s, -1.0)


def test_flip_labels_exact_per_class_rate_to_other_classes() -> None:
    s = make(100, 10)
    f = flip_labels(s, 0.2, 10, seed=0)
    changed = f.y != s.y
    assert torch.bincount(s.y[changed], minlength=10).tolist() == [20] * 10
    # the new labels are spread over the other classes
    assert len(torch.unique(f.y[changed & (s.y == 0)])) > 5
    assert torch.equal(f.y, flip_labels(s, 0.2, 10, seed=0).y)
    assert torch.equal(flip_labels(s, 0.0, 10, seed=0).y, s.y)
    binary = binarize(s, range(5, 10))
    fb = flip_labels(binary, 0.2, 2, seed=1)
    assert int((fb.y != binary.y).sum()) == 200 and set(fb.y.tolist()) == {0, 1}


def test_flip_labels_errors() -> None:
    with pytest.raises(FedriskError, match=r"rate = 1\.5 is out of range; allowed: \[0\.0, 1\.0\]"):
        flip_labels(make(), 1.5, 10)
    with pytest.raises(FedriskError, match=r"labels must lie in \[0, 4\]"):
        flip_labels(make(), 0.1, 5)
    with pytest.raises(FedriskError, match=r"num_classes = 1 is out of range; allowed: \[2, inf\)"):
        flip_labels(make(), 0.1, 1)


def test_label_flip_attack() -> None:
    y = torch.arange(10)
    assert label_flip_attack(y, 10).tolist() == list(range(9, -1, -1))
    assert label_flip_attack(torch.tensor([0, 1]), 2).tolist() == [1, 0]
    assert label_flip_attack(y, 10).dtype == y.dtype


def test_standardize_uses_train_statistics() -> None:
    tr = Samples(torch.tensor([[0.0, 5.0], [2.0, 5.0], [4.0, 5.0]]), torch.tensor([0, 1, 0]))
    te = Samples(torch.tensor([[2.0, 6.0]]), torch.tensor([1]))
    str_, ste = standardize(tr, te)
    assert torch.allclose(str_.x.mean(0), torch.zeros(2))
    assert torch.allclose(str_.x[:, 0].std(unbiased=False), torch.tensor(1.0))
    assert ste.x.tolist() == [[0.0, 1.0]]  # constant column: centred only
    assert torch.equal(ste.y, te.y)


def test_derive_seed_independent_streams() -> None:
    seeds = {derive_seed(s, tag, k) for s in range(3) for tag in ("a", "b") for k in range(3)}
    assert len(seeds) == 18
    assert derive_seed(7, "x") == derive_seed(7, "x")
