"""Data layer: offline dataset loaders, seeded transforms and partitioners, synthetic
generators from the papers, and :func:`build_federation`, which turns a dataset name and a
partition name into a :class:`Federation`.

Example:
    >>> from fedrisk.data import build_federation
    >>> fed = build_federation("breast_cancer", "iid", 4, seed=0)
    >>> fed.num_clients, fed.num_classes
    (4, 2)
"""

import fedrisk.data.sources  # noqa: F401  (every source registers itself in DATASETS)
from fedrisk.data.build import build_federation
from fedrisk.data.federation import Federation, PartitionReport, Samples
from fedrisk.data.loaders import (
    DATASETS,
    DatasetMeta,
    LoadedDataset,
    load_adult,
    load_breast_cancer,
    load_cifar10,
    load_cifar100,
    load_compas,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_german,
    load_mnist,
    load_mnist_5k,
    load_wine,
    read_idx,
)
from fedrisk.data.partition import (
    PARTITIONERS,
    by_attribute,
    by_sizes,
    class_disjoint,
    dirichlet,
    iid,
    k_classes,
    shards,
    split_indices,
)
from fedrisk.data.sources.chexpert import load_chexpert
from fedrisk.data.sources.synthetic import (
    class_split_auc_data,
    class_split_auc_federation,
    least_squares_data,
    least_squares_federation,
    least_squares_solution,
    perm_two_cluster_data,
    perm_two_cluster_federation,
)
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

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "DatasetMeta",
    "Federation",
    "LoadedDataset",
    "PartitionReport",
    "Samples",
    "add_feature_noise",
    "balance_classes",
    "binarize",
    "build_federation",
    "by_attribute",
    "by_sizes",
    "class_disjoint",
    "class_split_auc_data",
    "class_split_auc_federation",
    "derive_seed",
    "dirichlet",
    "flip_labels",
    "iid",
    "k_classes",
    "label_flip_attack",
    "least_squares_data",
    "least_squares_federation",
    "least_squares_solution",
    "load_adult",
    "load_breast_cancer",
    "load_chexpert",
    "load_cifar10",
    "load_cifar100",
    "load_compas",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_german",
    "load_mnist",
    "load_mnist_5k",
    "load_wine",
    "perm_two_cluster_data",
    "perm_two_cluster_federation",
    "positive_count_for_ratio",
    "read_idx",
    "shards",
    "split_indices",
    "standardize",
]
