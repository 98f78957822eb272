"""Synthetic data from the papers, as seeded pure functions.

Each generator comes in two forms:

* ``*_data(...) -> LoadedDataset``: the pooled train / test sets, with the structure the
  paper's federation uses kept in ``attrs`` (the cluster ``"class"``, the ``"client"``).
  These are registered in :data:`~fedrisk.data.loaders.DATASETS` so a config can name them
  and partition them like any dataset.
* ``*_federation(...) -> Federation``: the paper's federation itself, ready to train on.

Generators:

* :func:`class_split_auc_data` / :func:`class_split_auc_federation` ("synthetic_auc"):
  CODASCA spec §7.3, Gaussian clusters as stand-ins for CIFAR-100 classes, imbalanced
  binary labels, classes dealt to clients so that no two clients share one.
* :func:`least_squares_data` / :func:`least_squares_federation` ("least_squares"):
  heterogeneous linear regression, ``y = x·w_k + noise`` with client-specific ``w_k``
  (client drift: SCAFFOLD vs FedAvg).  :func:`least_squares_solution` gives the optimum.
* :func:`perm_two_cluster_data` / :func:`perm_two_cluster_federation` ("perm_synthetic"):
  PERM §4.1, two client clusters with opposite labelling functions.

Example:
    >>> fed = class_split_auc_federation(8, seed=0)
    >>> fed.num_clients, [round(r, 4) for r in fed.info["client_positive_ratios"]][:2]
    (8, [0.0991, 0.0991])
"""

from __future__ import annotations

import torch

from fedrisk.data.federation import Federation, Samples
from fedrisk.data.loaders import DATASETS, DatasetMeta, LoadedDataset
from fedrisk.data.partition import by_attribute, class_disjoint
from fedrisk.data.transforms import derive_seed, positive_count_for_ratio
from fedrisk.errors import check_range

__all__ = [
    "class_split_auc_data",
    "class_split_auc_federation",
    "least_squares_data",
    "least_squares_federation",
    "least_squares_solution",
    "perm_two_cluster_data",
    "perm_two_cluster_federation",
]


def _gen(seed: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, tag))


def _positive_ratios(parts: list[Samples]) -> list[float]:
    return [float(p.y.float().mean()) if len(p) else 0.0 for p in parts]


def _check_int(name: str, value: int, low: int) -> None:
    check_range(name, value, low, None)


# ----------------------------------------------------------------------------- CODASCA §7.3


@DATASETS.register(
    "synthetic_auc",
    "CODASCA §7.3: Gaussian-cluster classes, binary imbalanced (imratio), for class_disjoint",
)
def class_split_auc_data(
    *,
    seed: int = 0,
    num_neg_classes: int = 16,
    num_pos_classes: int = 16,
    dim: int = 32,
    mean_std: float = 0.6,
    noise_std: float = 1.0,
    neg_per_class: int = 500,
    imratio: float | None = 0.1,
    test_per_class: int = 200,
) -> LoadedDataset:
    """Class-split Gaussian-cluster AUC data (CODASCA spec §7.3, a CIFAR100-IH analogue).

    There are ``num_neg_classes + num_pos_classes`` "classes"; class ``c`` is a Gaussian
    cluster ``N(m_c, noise_std^2 I_dim)`` with ``m_c ~ N(0, mean_std^2 I_dim)``.  Classes
    ``0 .. num_neg_classes-1`` are negative (label 0), the rest positive (label 1).  Training
    data: ``neg_per_class`` rows per negative class and
    ``int(imratio/(1-imratio) * neg_per_class)`` per positive class (55 for 0.1 and 500;
    ``imratio=None`` gives balanced classes).  Test data: ``test_per_class`` rows of every
    class (balanced).  ``attrs["class"]`` holds the cluster id, so the ``class_disjoint``
    partitioner deals clusters to clients (negative and positive classes separately).

    Example:
        >>> tr, te, meta = class_split_auc_data(seed=0)
        >>> len(tr), len(te), meta.notes["positive_classes"][:2]
        (8880, 6400, [16, 17])
    """
    for name, v in (
        ("num_neg_classes", num_neg_classes),
        ("num_pos_classes", num_pos_classes),
        ("dim", dim),
        ("neg_per_class", neg_per_class),
    ):
        _check_int(name, v, 1)
    _check_int("test_per_class", test_per_class, 0)
    check_range("mean_std", mean_std, 0.0, None)
    check_range("noise_std", noise_std, 0.0, None)
    pos_per_class = neg_per_class if imratio is None else positive_count_for_ratio(imratio, neg_per_class)
    n_cls = num_neg_classes + num_pos_classes
    g = _gen(seed, "synthetic_auc")
    means = mean_std * torch.randn(n_cls, dim, generator=g)

    def draw(counts: list[int]) -> Samples:
        cls = torch.repeat_interleave(torch.arange(n_cls), torch.tensor(counts))
        x = means[cls] + noise_std * torch.randn(len(cls), dim, generator=g)
        return Samples(x, (cls >= num_neg_classes).long(), {"class": cls})

    train = draw([neg_per_class] * num_neg_classes + [pos_per_class] * num_pos_classes)
    test = draw([test_per_class] * n_cls)
    meta = DatasetMeta(
        "synthetic_auc",
        2,
        ["negative", "positive"],
        source="generated (CODASCA spec §7.3)",
        attr_names={"class": [str(c) for c in range(n_cls)]},
        notes={
            "negative_classes": list(range(num_neg_classes)),
            "positive_classes": list(range(num_neg_classes, n_cls)),
            "imratio": imratio,
            "pos_per_class": pos_per_class,
        },
    )
    return LoadedDataset(train, test, meta)


def class_split_auc_federation(num_clients: int = 8, *, seed: int = 0, **options: object) -> Federation:
    """The CODASCA §7.3 federation: :func:`class_split_auc_data` with the negative and the
    positive class lists each shuffled and dealt ``[k::num_clients]`` (so with the defaults and
    8 clients each client holds 2 negative and 2 positive clusters, positive ratio 0.0991).

    ``options`` go to :func:`class_split_auc_data`.  The global test set is the balanced one.

    Example:
        >>> fed = class_split_auc_federation(4, seed=1, neg_per_class=50, test_per_class=10)
        >>> fed.client_sizes
        (220, 220, 220, 220)
    """
    ds = class_split_auc_data(seed=seed, **options)  # type: ignore[arg-type]
    groups = [ds.meta.notes["negative_classes"], ds.meta.notes["positive_classes"]]
    parts = class_disjoint(ds.train.attrs["class"], num_clients, seed=derive_seed(seed, "deal"), groups=groups)
    clients = [ds.train.subset(p) for p in parts]
    info = {
        "dataset": "synthetic_auc",
        "dataset_options": dict(options),
        "partition": "class_disjoint",
        "seed": seed,
        "client_classes": [sorted(set(c.attrs["class"].tolist())) for c in clients],
        "positive_ratio": float(ds.train.y.float().mean()),
        "client_positive_ratios": _positive_ratios(clients),
    }
    return Federation(
        f"synthetic_auc-class_disjoint-K{num_clients}",
        clients,
        2,
        test=ds.test,
        class_names=ds.meta.class_names,
        info=info,
    )


# ----------------------------------------------------------------------------- least squares


@DATASETS.register("least_squares", "heterogeneous linear regression y = x·w_k + noise (attr 'client')")
def least_squares_data(
    *,
    seed: int = 0,
    num_clients: int = 10,
    samples_per_client: int = 100,
    dim: int = 10,
    heterogeneity: float = 1.0,
    noise_std: float = 0.1,
    test_per_client: int = 50,
) -> LoadedDataset:
    """Least-squares regression with client drift.

    ``w_0 ~ N(0, I_dim)``; client ``k`` has ``w_k = w_0 + heterogeneity * N(0, I_dim)``, inputs
    ``x ~ N(0, I_dim)`` and targets ``y = x·w_k + noise_std * N(0, 1)`` (float32, shape
    ``[n]``).  ``heterogeneity = 0`` makes all clients identical.  ``attrs["client"]`` says
    whose row it is (partition with ``by_attribute`` on ``"client"`` to get the clients back);
    the test set holds ``test_per_client`` fresh rows of every client.

    Example:
        >>> tr, te, meta = least_squares_data(num_clients=3, samples_per_client=5, dim=2)
        >>> tr.x.shape, tr.y.dtype, meta.task, tr.attrs["client"].tolist()[:6]
        (torch.Size([15, 2]), torch.float32, 'regression', [0, 0, 0, 0, 0, 1])
    """
    for name, v in (("num_clients", num_clients), ("samples_per_client", samples_per_client), ("dim", dim)):
        _check_int(name, v, 1)
    _check_int("test_per_client", test_per_client, 0)
    check_range("heterogeneity", heterogeneity, 0.0, None)
    check_range("noise_std", noise_std, 0.0, None)
    g = _gen(seed, "least_squares")
    w0 = torch.randn(dim, generator=g)
    w = w0 + heterogeneity * torch.randn(num_clients, dim, generator=g)

    def draw(per_client: int) -> Samples:
        who = torch.arange(num_clients).repeat_interleave(per_client)
        x = torch.randn(len(who), dim, generator=g)
        y = (x * w[who]).sum(dim=1) + noise_std * torch.randn(len(who), generator=g)
        return Samples(x, y, {"client": who})

    train, test = draw(samples_per_client), draw(test_per_client)
    meta = DatasetMeta(
        "least_squares",
        1,
        ["target"],
        task="regression",
        source="generated",
        attr_names={"client": [str(k) for k in range(num_clients)]},
        notes={"natural_attribute": "client", "w_mean": w0.tolist(), "w_clients": w.tolist()},
    )
    return LoadedDataset(train, test, meta)


def least_squares_solution(samples: Samples) -> torch.Tensor:
    """The minimiser of ``mean((x·w - y)^2)`` over ``samples`` (float64 least squares).

    On the pooled data of a federation with equal client sizes this is the optimum of the
    federated objective (the average of the client losses).

    Example:
        >>> fed = least_squares_federation(4, noise_std=0.0, heterogeneity=0.0, seed=0)
        >>> w = least_squares_solution(fed.pooled())
        >>> torch.allclose(w.float(), torch.tensor(fed.info["w_clients"][0]), atol=1e-4)
        True
    """
    x = samples.x.double().reshape(len(samples), -1)
    return torch.linalg.lstsq(x, samples.y.double().reshape(-1, 1)).solution.reshape(-1)


def _natural_federation(ds: LoadedDataset, num_clients: int, name: str, info: dict[str, object]) -> Federation:
    parts = by_attribute(ds.train.attrs["client"], num_clients)
    tests = by_attribute(ds.test.attrs["client"], num_clients) if len(ds.test) else None
    return Federation(
        name,
        [ds.train.subset(p) for p in parts],
        ds.meta.num_classes,
        client_tests=None if tests is None else [ds.test.subset(p) for p in tests],
        test=ds.test if len(ds.test) else None,
        class_names=ds.meta.class_names,
        info=info,
    )


def least_squares_federation(num_clients: int = 10, *, seed: int = 0, **options: object) -> Federation:
    """:func:`least_squares_data` split back into its clients, each with its own test rows.

    ``info`` carries ``w_clients`` (the true ``w_k``) and ``task = "regression"``.

    Example:
        >>> fed = least_squares_federation(3, samples_per_client=20, seed=0)
        >>> fed.client_sizes, len(fed.client_tests[0])
        ((20, 20, 20), 50)
    """
    ds = least_squares_data(seed=seed, num_clients=num_clients, **options)  # type: ignore[arg-type]
    info = {
        "dataset": "least_squares",
        "dataset_options": dict(options),
        "seed": seed,
        "task": "regression",
        "w_clients": ds.meta.notes["w_clients"],
    }
    return _natural_federation(ds, num_clients, f"least_squares-K{num_clients}", info)


# ----------------------------------------------------------------------------- PERM §4.1


@DATASETS.register("perm_synthetic", "PERM §4.1: two client clusters with opposite labels (attr 'client')")
def perm_two_cluster_data(
    *,
    seed: int = 0,
    num_clients: int = 50,
    samples_per_client: int = 500,
    dim: int = 60,
    mu: float = 0.2,
    w_mean: float = 0.1,
    w_std: float = 1.0,
    test_per_client: int = 100,
) -> LoadedDataset:
    """PERM's synthetic two-cluster data (spec 003 §4.1).

    Clients ``0 .. N/2-1`` draw ``x ~ N(mu·1, Σ)``, the others ``x ~ N(-mu·1, Σ)``, with the
    FedProx covariance ``Σ = diag(k^-1.2), k = 1..dim``.  One ``w ~ N(w_mean·1, w_std^2 I)``
    labels the first cluster ``y = 1[w·x > 0]`` and the second ``y = 1[-w·x > 0]`` (opposite
    labelling functions; labels mapped from ±1 to {0, 1}).  ``attrs``: ``client`` and
    ``cluster`` (0 or 1).  Ambiguities resolved as the spec recommends: the means are the
    all-``mu`` vectors, ``Σ_w = I``; no bias term.

    Example:
        >>> tr, te, meta = perm_two_cluster_data(num_clients=4, samples_per_client=10, dim=5)
        >>> len(tr), len(te), sorted(set(tr.attrs["cluster"].tolist()))
        (40, 400, [0, 1])
    """
    _check_int("num_clients", num_clients, 2)
    _check_int("samples_per_client", samples_per_client, 1)
    _check_int("dim", dim, 1)
    _check_int("test_per_client", test_per_client, 0)
    check_range("w_std", w_std, 0.0, None)
    g = _gen(seed, "perm_synthetic")
    w = w_mean + w_std * torch.randn(dim, generator=g)
    scale = torch.arange(1, dim + 1, dtype=torch.float32).pow(-1.2).sqrt()
    cluster_of = (torch.arange(num_clients) >= num_clients // 2).long()

    def draw(per_client: int) -> Samples:
        who = torch.arange(num_clients).repeat_interleave(per_client)
        cl = cluster_of[who]
        sign = 1.0 - 2.0 * cl.float()  # +1 for cluster 0, -1 for cluster 1
        x = sign[:, None] * mu + scale * torch.randn(len(who), dim, generator=g)
        y = (sign * (x @ w) > 0).long()
        return Samples(x, y, {"client": who, "cluster": cl})

    train, test = draw(samples_per_client), draw(test_per_client)
    meta = DatasetMeta(
        "perm_synthetic",
        2,
        ["0", "1"],
        source="generated (PERM spec §4.1)",
        attr_names={"client": [str(k) for k in range(num_clients)], "cluster": ["+mu", "-mu"]},
        notes={"natural_attribute": "client", "w": w.tolist()},
    )
    return LoadedDataset(train, test, meta)


def perm_two_cluster_federation(num_clients: int = 50, *, seed: int = 0, **options: object) -> Federation:
    """:func:`perm_two_cluster_data` split back into its clients (each with its own test rows).

    Example:
        >>> fed = perm_two_cluster_federation(4, samples_per_client=30, seed=0)
        >>> fed.client_sizes, fed.info["client_clusters"]
        ((30, 30, 30, 30), [0, 0, 1, 1])
    """
    ds = perm_two_cluster_data(seed=seed, num_clients=num_clients, **options)  # type: ignore[arg-type]
    info = {
        "dataset": "perm_synthetic",
        "dataset_options": dict(options),
        "seed": seed,
        "client_clusters": [int(k >= num_clients // 2) for k in range(num_clients)],
    }
    fed = _natural_federation(ds, num_clients, f"perm_synthetic-K{num_clients}", info)
    fed.info["client_positive_ratios"] = _positive_ratios(fed.clients)
    return fed
