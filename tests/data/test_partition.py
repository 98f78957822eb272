"""Partitioners: determinism, disjointness, coverage, stated properties and error messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrisk.data.partition import (
    PARTITIONERS,
    by_attribute,
    by_sizes,
    class_disjoint,
    class_groups,
    dirichlet,
    iid,
    k_classes,
    shards,
    split_indices,
)
from fedrisk.errors import FedriskError

LABELS = np.repeat(np.arange(10), 40)  # 400 rows, 10 classes of 40
RNG_LABELS = np.random.default_rng(0).integers(0, 10, size=500)

# (name, call) pairs covering every partitioner with valid arguments
CASES = {
    "iid": lambda y, s: iid(y, 7, seed=s),
    "dirichlet": lambda y, s: dirichlet(y, 5, alpha=0.5, seed=s, min_size=5),
    "shards": lambda y, s: shards(y, 10, shards_per_client=2, seed=s),
    "k_classes": lambda y, s: k_classes(y, 10, classes_per_client=3, seed=s),
    "class_disjoint": lambda y, s: class_disjoint(y, 4, seed=s),
    "by_attribute": lambda y, s: by_attribute(y, 20, seed=s),
    "by_sizes": lambda y, s: by_sizes(y, [50, 30, 20], seed=s),
    "class_groups": lambda y, s: class_groups(y, 20, classes_per_group=2, seed=s),
}
FULL_COVERAGE = {"iid", "dirichlet", "shards", "k_classes", "class_disjoint", "by_attribute"}


def flat(parts: list[list[int]]) -> list[int]:
    return [i for p in parts for i in p]


def classes_of(parts: list[list[int]], labels: np.ndarray) -> list[set[int]]:
    return [set(labels[p].tolist()) for p in parts]


def test_registry_lists_every_partitioner_with_a_description() -> None:
    assert set(PARTITIONERS.names()) == set(CASES)
    assert all(e.description for e in PARTITIONERS.entries())


@pytest.mark.parametrize("name", sorted(CASES))
def test_deterministic_disjoint_sorted_and_covering(name: str) -> None:
    call = CASES[name]
    a, b = call(LABELS, 3), call(LABELS, 3)
    assert a == b
    idx = flat(a)
    assert len(idx) == len(set(idx)), "clients overlap"
    assert all(p == sorted(p) for p in a)
    assert all(isinstance(i, int) for i in idx)
    assert all(len(p) > 0 for p in a)
    if name in FULL_COVERAGE:
        assert sorted(idx) == list(range(len(LABELS)))


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "k_classes", "by_sizes"])
def test_different_seeds_give_different_partitions(name: str) -> None:
    assert CASES[name](RNG_LABELS, 1) != CASES[name](RNG_LABELS, 2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_accepts_tensor_numpy_and_list(name: str) -> None:
    call = CASES[name]
    ref = call(LABELS, 0)
    assert call(torch.as_tensor(LABELS), 0) == ref
    assert call(LABELS.tolist(), 0) == ref
    assert call(LABELS.astype(np.float32), 0) == ref  # integral floats are fine


def test_iid_sizes_differ_by_at_most_one() -> None:
    sizes = [len(p) for p in iid(RNG_LABELS, 7, seed=0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 500


def test_dirichlet_min_size_and_skew() -> None:
    parts = dirichlet(RNG_LABELS, 10, alpha=0.1, seed=0, min_size=10, balance=True)
    assert min(len(p) for p in parts) >= 10
    # small alpha: most clients are dominated by few classes
    counts = [np.bincount(RNG_LABELS[p], minlength=10) for p in parts]
    assert np.mean([c.max() / c.sum() for c in counts]) > 0.4
    # large alpha: close to uniform
    parts = dirichlet(RNG_LABELS, 5, alpha=1000.0, seed=0, min_size=10)
    counts = [np.bincount(RNG_LABELS[p], minlength=10) for p in parts]
    assert np.mean([c.max() / c.sum() for c in counts]) < 0.25


def test_dirichlet_impossible_min_size_raises_with_advice() -> None:
    with pytest.raises(FedriskError) as err:
        dirichlet(LABELS, 20, alpha=0.01, seed=0, min_size=19, max_tries=5)
    msg = str(err.value)
    assert "min_size = 19" in msg and "alpha = 0.01" in msg
    assert "larger alpha" in msg and "smaller min_size" in msg and "fewer clients" in msg


def test_dirichlet_min_size_beyond_samples_is_rejected_up_front() -> None:
    with pytest.raises(FedriskError, match=r"min_size = 50 .*allowed: \[0, 40\]"):
        dirichlet(LABELS, 10, alpha=1.0, min_size=50)


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_dirichlet_rejects_non_positive_alpha(alpha: float) -> None:
    with pytest.raises(FedriskError, match=r"alpha = .* out of range; allowed: \(0\.0, inf\)"):
        dirichlet(LABELS, 4, alpha=alpha)


def test_shards_give_each_client_few_classes() -> None:
    parts = shards(LABELS, 10, shards_per_client=2, seed=0)
    assert all(len(c) <= 2 for c in classes_of(parts, LABELS))
    assert [len(p) for p in parts] == [40] * 10


def test_shards_rejects_too_many_shards() -> None:
    with pytest.raises(FedriskError, match=r"shards_per_client = 50 .*allowed: \[1, 40\]"):
        shards(LABELS, 10, shards_per_client=50)


@pytest.mark.parametrize(("clients", "k"), [(10, 2), (7, 3), (20, 1), (3, 10)])
def test_k_classes_exactly_k_and_balanced_holders(clients: int, k: int) -> None:
    parts = k_classes(LABELS, clients, classes_per_client=k, seed=1)
    held = classes_of(parts, LABELS)
    assert all(len(c) == k for c in held)
    holders = np.bincount([c for h in held for c in h], minlength=10)
    if clients * k >= 10:
        assert holders.min() >= 1  # every class used
    assert holders.max() - holders.min() <= 1


def test_k_classes_errors() -> None:
    with pytest.raises(FedriskError, match=r"classes_per_client = 11 .*allowed: \[1, 10\]"):
        k_classes(LABELS, 5, classes_per_client=11)
    few = np.array([0] * 100 + [1] * 2)
    with pytest.raises(FedriskError, match="class 1 has 2 samples but 5 clients hold it"):
        k_classes(few, 10, classes_per_client=1, seed=0)


@pytest.mark.parametrize("clients", [1, 3, 10])
def test_class_disjoint_really_disjoint(clients: int) -> None:
    held = classes_of(class_disjoint(LABELS, clients, seed=5), LABELS)
    for i in range(clients):
        for j in range(i + 1, clients):
            assert not held[i] & held[j]
    assert set().union(*held) == set(range(10))
    sizes = sorted(len(h) for h in held)
    assert sizes[-1] - sizes[0] <= 1


def test_class_disjoint_round_robin_of_shuffled_classes() -> None:
    parts = class_disjoint(LABELS, 3, seed=0)
    perm = np.random.default_rng(0).permutation(np.arange(10))
    assert classes_of(parts, LABELS) == [set(perm[k::3].tolist()) for k in range(3)]


def test_class_disjoint_groups_deal_each_group_separately() -> None:
    groups = [list(range(5)), list(range(5, 10))]
    held = classes_of(class_disjoint(LABELS, 5, seed=0, groups=groups), LABELS)
    assert all(len(h & set(groups[0])) == 1 and len(h & set(groups[1])) == 1 for h in held)


def test_class_disjoint_errors() -> None:
    with pytest.raises(FedriskError, match=r"num_clients = 11 .*allowed: \[1, 10\].*10 classes"):
        class_disjoint(LABELS, 11)
    with pytest.raises(FedriskError, match=r"num_clients = 4 .*allowed: \[1, 3\]"):
        class_disjoint(LABELS, 4, groups=[[0, 1, 2], list(range(3, 10))])
    with pytest.raises(FedriskError, match=r"leave out classes \[9\]"):
        class_disjoint(LABELS, 2, groups=[[0, 1, 2, 3], [4, 5, 6, 7, 8]])
    with pytest.raises(FedriskError, match="must not share a class"):
        class_disjoint(LABELS, 2, groups=[[0, 1, 2, 3, 4, 5], [5, 6, 7, 8, 9]])


def test_by_attribute_natural_groups_and_multiples() -> None:
    values = np.array([2, 0, 2, 1, 0, 2, 1, 1, 0, 2])
    parts = by_attribute(values)
    assert [sorted(set(values[p].tolist())) for p in parts] == [[0], [1], [2]]
    parts = by_attribute(values, num_clients=3)
    assert parts == by_attribute(values)
    parts = by_attribute(values, num_clients=6, seed=0)
    assert [set(values[p].tolist()) for p in parts] == [{0}, {0}, {1}, {1}, {2}, {2}]


def test_by_attribute_errors() -> None:
    with pytest.raises(FedriskError, match=r"num_clients = 4 .*multiple of .*\(3: \[0, 1, 2\]\)"):
        by_attribute([0, 1, 2, 0], num_clients=4)
    with pytest.raises(FedriskError, match="value 1 has 1 samples, fewer than the 2 clients"):
        by_attribute([0, 0, 1], num_clients=4)


def test_by_sizes_exact_sizes_and_errors() -> None:
    parts = by_sizes(LABELS, [100, 1, 299], seed=3)
    assert [len(p) for p in parts] == [100, 1, 299]
    assert by_sizes(LABELS, [10, 10], num_clients=2) == by_sizes(LABELS, [10, 10])
    with pytest.raises(FedriskError, match=r"sizes sum to 401.*allowed: sum\(sizes\) <= 400"):
        by_sizes(LABELS, [400, 1])
    with pytest.raises(FedriskError, match=r"sizes\[1\] = 0 is out of range; allowed: \[1, 400\]"):
        by_sizes(LABELS, [5, 0])
    with pytest.raises(FedriskError, match=r"num_clients = 3 .*allowed: num_clients = len\(sizes\) = 2"):
        by_sizes(LABELS, [5, 5], num_clients=3)
    with pytest.raises(FedriskError, match="at least one client size"):
        by_sizes(LABELS, [])


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "k_classes"])
def test_more_clients_than_samples_is_an_error(name: str) -> None:
    fn = PARTITIONERS.get(name)
    with pytest.raises(FedriskError, match=r"num_clients = 11 is out of range; allowed: \[1, 10\]"):
        fn(np.arange(10) % 2, 11)
    with pytest.raises(FedriskError, match=r"num_clients = 0 is out of range"):
        fn(np.arange(10) % 2, 0)


def test_bad_label_arrays() -> None:
    with pytest.raises(FedriskError, match="1-D array of integers; got shape"):
        iid(np.zeros((4, 3)), 2)
    with pytest.raises(FedriskError, match="integer values"):
        iid(np.array([0.5, 1.0]), 2)
    with pytest.raises(FedriskError, match="empty"):
        iid(np.array([], dtype=int), 1)


def test_split_indices_stratified() -> None:
    keep, held = split_indices(LABELS, 0.25, seed=0)
    assert sorted(keep + held) == list(range(400))
    assert np.bincount(LABELS[held]).tolist() == [10] * 10
    assert split_indices(LABELS, 0.25, seed=0) == (keep, held)
    keep, held = split_indices(LABELS, 0.1, seed=0, stratify=False)
    assert len(held) == 40
    with pytest.raises(FedriskError, match=r"fraction = 1\.0 is out of range; allowed: \[0\.0, 1\.0\)"):
        split_indices(LABELS, 1.0)


def test_class_disjoint_subdivide_gives_more_clients_than_classes() -> None:
    labels = np.repeat(np.arange(10), 20)
    groups = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    parts = class_disjoint(labels, 8, seed=3, groups=groups, subdivide=2)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(200))  # disjoint and complete
    for p in parts:
        classes = set(labels[p].tolist())
        assert classes & set(groups[0]) and classes & set(groups[1])  # both groups on every client
        assert len(classes) <= 4
    assert class_disjoint(labels, 8, seed=3, groups=groups, subdivide=2) == parts
    with pytest.raises(FedriskError, match=r"num_clients = 8 is out of range; allowed: \[1, 5\].*subdivide"):
        class_disjoint(labels, 8, seed=3, groups=groups)
    with pytest.raises(FedriskError, match="subdivide = 0"):
        class_disjoint(labels, 4, groups=groups, subdivide=0)


def test_class_groups_pairs_per_class_reading_h1_and_h2() -> None:
    h1 = class_groups(LABELS, 20, seed=0)
    assert [sorted({int(LABELS[i]) for i in p}) for p in h1] == [[k // 2] for k in range(20)]
    assert [len(p) for p in h1] == [20] * 20  # each class of 40 split evenly over its pair
    h2 = class_groups(LABELS, 20, classes_per_group=5, seed=0)
    assert [sorted({int(LABELS[i]) for i in p}) for p in h2][:2] == [[0, 1, 2, 3, 4]] * 2
    assert [sorted({int(LABELS[i]) for i in p}) for p in h2][18] == [0, 1, 2, 3, 9]
    with pytest.raises(FedriskError, match="multiple of the number of classes"):
        class_groups(LABELS, 15)
    with pytest.raises(FedriskError, match="classes_per_group"):
        class_groups(LABELS, 20, classes_per_group=11)
