"""Hostile data files and federations, fuzzed with hypothesis: idx files (bad magic, truncated,
wrong or negative dimensions, corrupt gzip), MNIST-like sets with wrong shapes, mismatched
counts and labels out of range, and in-memory federations with NaN / inf features, labels out of
range or empty clients.  Each case loads correctly or ends in a FedriskError; none raises
anything else.  ``FEDRISK_FUZZ_EXAMPLES`` sets the number of examples (default 60).
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.loaders import load_dataset, read_idx
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation

EXAMPLES = int(os.environ.get("FEDRISK_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)


@st.composite
def idx_bytes(draw: st.DrawFn) -> bytes:
    code = draw(st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x07, 0xFF]))
    ndim = draw(st.integers(0, 4))
    dims = draw(st.lists(st.integers(-3, 40), min_size=ndim, max_size=ndim))
    head = bytes([draw(st.sampled_from([0, 0, 1])), 0, code, ndim]) + b"".join(struct.pack(">i", d) for d in dims)
    data = head + draw(st.binary(max_size=300))
    cut = draw(st.integers(0, len(data)))
    data = data[:cut] if draw(st.booleans()) else data
    if draw(st.booleans()):
        data = gzip.compress(data)
        if draw(st.booleans()):  # a truncated / damaged gzip stream
            data = data[: draw(st.integers(0, len(data)))]
    return data


@FUZZ
@given(data=idx_bytes())
def test_idx_files_load_or_fail_cleanly(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("idx") / "f-idx1-ubyte"
    path.write_bytes(data)
    try:
        arr = read_idx(path)
    except FedriskError:
        return
    assert isinstance(arr, np.ndarray)


def _idx(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", d) for d in arr.shape) + arr.tobytes()


@FUZZ
@given(
    n_images=st.integers(0, 5),
    n_labels=st.integers(0, 5),
    shape=st.sampled_from([(28, 28), (4, 4), (7,), (2, 3, 3)]),
    label_max=st.sampled_from([9, 10, 255]),
)
def test_mnist_like_sets_load_or_fail_cleanly(
    tmp_path_factory: pytest.TempPathFactory, n_images: int, n_labels: int, shape: tuple, label_max: int
) -> None:
    root = tmp_path_factory.mktemp("mnist")
    rng = np.random.default_rng(n_images * 7 + n_labels)
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 256, size=(n_images, *shape), dtype=np.uint8)
        labels = rng.integers(0, label_max + 1, size=(n_labels,), dtype=np.uint8)
        (root / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(images))
        (root / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(labels))
    try:
        train, test, meta = load_dataset("mnist", data_root=root)
    except FedriskError:
        return
    for split in (train, test):
        assert split.x.dim() == 4 and split.x.shape[1] == 1 and len(split.x) == len(split.y)
        assert bool(((split.y >= 0) & (split.y < meta.num_classes)).all())


@st.composite
def federations(draw: st.DrawFn) -> Federation:
    g = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    clients = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 6))
        x = torch.randn(n, 3, generator=g)
        y = torch.randint(0, 2, (n,), generator=g)
        if n and draw(st.booleans()):
            x[draw(st.integers(0, n - 1)), draw(st.integers(0, 2))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        if n and draw(st.booleans()):
            y[draw(st.integers(0, n - 1))] = draw(st.sampled_from([-1, 2, 100]))
        clients.append(Samples(x, y))
    return Federation("fuzz", clients, num_classes=2)


@FUZZ
@given(fed=federations(), executor=st.sampled_from(["sequential", "vectorized"]))
def test_bad_federations_fail_cleanly(fed: Federation, executor: str) -> None:
    alg = FedAvg(model=FunctionalModel(build_model("logreg", (3,), 2)), loss=cross_entropy, batch_size=2)
    try:
        sim = Simulation(alg, fed, executor=executor)
        sim.step()
    except FedriskError:
        return
    bad = [bool(~torch.isfinite(c.x).all()) or bool(((c.y < 0) | (c.y > 1)).any()) or len(c) == 0 for c in fed.clients]
    assert not any(bad), "bad data was accepted"


def test_bad_data_messages_name_the_client() -> None:
    x = torch.zeros(4, 3)
    good = Samples(x, torch.tensor([0, 1, 0, 1]))
    nan = Samples(x.clone().index_fill_(0, torch.tensor([2]), float("nan")), torch.tensor([0, 1, 0, 1]))
    alg = FedAvg(model=FunctionalModel(build_model("logreg", (3,), 2)), loss=cross_entropy, batch_size=2)
    with pytest.raises(FedriskError, match=r"client 1 \(training data\): 1 of 4 rows have NaN/inf features"):
        Simulation(alg, Federation("f", [good, nan], num_classes=2))
    with pytest.raises(
        FedriskError, match=r"client 0 \(training data\): label -1 is out of range; allowed: .*\[0, 1\]"
    ):
        Simulation(alg, Federation("f", [Samples(x, torch.tensor([0, -1, 0, 1])), good], num_classes=2))
    with pytest.raises(FedriskError, match=r"the test set: label 5 is out of range"):
        Simulation(alg, Federation("f", [good], num_classes=2, test=Samples(x, torch.tensor([0, 5, 0, 1]))))
    # the boundary: label num_classes is out of range
    with pytest.raises(FedriskError, match=r"client 0 \(training data\): label 2 is out of range"):
        Simulation(alg, Federation("f", [Samples(x, torch.tensor([0, 2, 0, 1]))], num_classes=2))
    # rows counted, not entries: two bad entries in row 0, one in row 3
    rows = x.clone()
    rows[0, :2], rows[3, 1] = float("inf"), float("nan")
    with pytest.raises(FedriskError, match=r"client 0 \(training data\): 2 of 4 rows have NaN/inf features"):
        Simulation(alg, Federation("f", [Samples(rows, good.y)], num_classes=2))
    # client test splits are checked too
    bad_split = Samples(x, torch.tensor([0, 1, 3, 1]))
    with pytest.raises(FedriskError, match=r"client 1 \(test split\): label 3 is out of range"):
        Simulation(alg, Federation("f", [good, good], num_classes=2, client_tests=[good, bad_split]))


def test_regression_targets_must_be_finite() -> None:
    from fedrisk.data.validate import check_samples

    x = torch.zeros(3, 2)
    check_samples(Samples(x, torch.tensor([0.5, -1.0, 2.0])), 0, "client 0")
    with pytest.raises(FedriskError, match=r"client 0: NaN/inf targets; allowed: finite numbers"):
        check_samples(Samples(x, torch.tensor([0.5, float("nan"), 2.0])), 0, "client 0")


def test_negative_idx_dimension_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "neg"
    path.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">i", -2))
    with pytest.raises(FedriskError, match="negative dimension"):
        read_idx(path)
