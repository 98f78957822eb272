"""``build_federation``: dataset name + partition name + options -> :class:`Federation`.

This is the one function the config runner calls.  The pipeline, each step seeded from
``derive_seed(seed, step)`` so that switching one step on or off leaves the others unchanged:

1. **load** ``dataset`` from :data:`~fedrisk.data.loaders.DATASETS` with ``dataset_options``
   (its own split seed defaults to ``derive_seed(seed, "dataset")``; set
   ``dataset_options["seed"]`` to pin it);
2. **binarize** (optional): classes in ``positive_classes`` -> 1, others -> 0; ``imratio``
   subsamples positives of the *training* set only; the test set stays as loaded unless
   ``balanced_test`` is set.  The original class is kept in ``attrs["class"]``;
3. **validation** (optional): a stratified ``validation_fraction`` of the training set is
   held out as the global validation set (ranking data with ``attrs["query"]``: that share of
   whole queries, so that NDCG scores complete lists);
4. **partition** the rest with ``partition`` from
   :data:`~fedrisk.data.partition.PARTITIONERS` and ``partition_options``.  The partitioner
   sees the array named by ``partition_options["on"]``: ``"label"`` (``y``), ``"class"``
   (the original class of a binarised set) or any attribute name.  Default: ``"class"`` when
   that attribute exists (so a binarised CIFAR-100 is dealt by its fine classes, as CODASCA
   does), else ``"label"``; for ``by_attribute`` the dataset's natural attribute
   (``"client"`` of the synthetic sets, else the first sensitive attribute, e.g. Adult's
   ``"sex"``).  ``class_disjoint`` on the classes of a binary task deals the negative and the
   positive classes separately unless ``groups`` is given;
5. **per client**: an optional stratified ``client_test_fraction`` split into a personal test
   set, then an optional stratified ``client_validation_fraction`` of the remaining training
   rows into a personal validation set (seeded by ``derive_seed(seed, "client_validation", k)``;
   disjoint from the client's training and test rows), symmetric ``label_noise`` on the
   client's training rows, and Gaussian ``feature_noise`` (FeDXL: mean
   ``mean + (k - K//2) * mean_step`` for client ``k``) on its training, personal validation and
   personal test rows.  The global validation and test sets stay clean.  A client that the
   validation split would leave without validation rows or without training rows is an error
   naming it.

``Federation.info`` records every resolved parameter plus per-client sizes and, for binary
tasks, positive ratios.

Example:
    >>> fed = build_federation(
    ...     "digits", "class_disjoint", 4, seed=0,
    ...     binarize={"positive_classes": [5, 6, 7, 8, 9], "imratio": 0.2},
    ...     client_test_fraction=0.2,
    ... )
    >>> fed.num_clients, fed.num_classes, round(fed.info["positive_ratio"], 2)
    (4, 2, 0.2)
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import fedrisk.data.sources  # noqa: F401  (every source registers itself, the synthetic sets included)
from fedrisk.data import transforms as T
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.loaders import DATASETS, DatasetMeta, LoadedDataset, call_with_options
from fedrisk.data.partition import PARTITIONERS, split_indices
from fedrisk.errors import FedriskError, check_range

__all__ = ["build_federation", "reuse_federations"]

_BINARIZE_KEYS = ("positive_classes", "imratio", "per_class", "balanced_test")
_FEATURE_NOISE_KEYS = ("std", "mean", "mean_step")
_LABEL_NOISE_KEYS = ("rate",)
_LABEL_FREE_PARTITIONS = ("iid", "by_sizes", "by_attribute")


def _options(what: str, given: Mapping[str, Any] | None, allowed: Sequence[str]) -> dict[str, Any]:
    opts = dict(given or {})
    for key in opts:
        if key not in allowed:
            raise FedriskError(f"unknown {what} option {key!r}; allowed: {', '.join(allowed)}")
    return opts


# ----------------------------------------------------------------------------- reuse


class _Reused:
    """The federations kept by :func:`reuse_federations` (least recently used first)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self.kept: OrderedDict[str, Federation] = OrderedDict()

    def get(self, key: str) -> Federation | None:
        fed = self.kept.get(key)
        if fed is not None:
            self.kept.move_to_end(key)
        return fed

    def put(self, key: str, fed: Federation) -> None:
        self.kept[key] = fed
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)


_reused: _Reused | None = None  # active inside reuse_federations()


@contextlib.contextmanager
def reuse_federations(capacity: int = 2) -> Iterator[None]:
    """Within the block, :func:`build_federation` builds each distinct federation once.

    A call with the same arguments as an earlier one in the block returns a copy of the
    federation it built (the same tensors, fresh lists and ``info``), so the trials of a tune
    (the same data and seed, other hyper-parameters) load, split and partition the data once
    per process instead of once per trial.  The tensors are shared: nothing in fedrisk writes
    into a federation's tensors (attacks and dtype casts make new ones).  At most ``capacity``
    federations are kept (least recently used first out); a nested block uses the outer one's.
    A process forked inside the block (the workers of ``fedrisk tune --jobs``) inherits them.

    Example:
        >>> with reuse_federations():
        ...     a = build_federation("wine", "iid", 2, seed=0)
        ...     b = build_federation("wine", "iid", 2, seed=0)
        >>> a is b, a.clients[0].x is b.clients[0].x
        (False, True)
    """
    global _reused
    if _reused is not None:
        yield
        return
    _reused = _Reused(capacity)
    try:
        yield
    finally:
        _reused = None


def _reuse_key(args: Mapping[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, default=repr)


def _reuse(reused: _Reused, key: str, build: Callable[[], Federation]) -> Federation:
    """A copy of the federation kept under ``key``, built (outside the reuse) when missing."""
    global _reused
    fed = reused.get(key)
    if fed is None:
        _reused = None
        try:
            fed = build()
        finally:
            _reused = reused
        reused.put(key, fed)
    out = fed.to()  # fresh lists, the same tensors
    out.info = copy.deepcopy(fed.info)
    return out


# ----------------------------------------------------------------------------- steps


def _load(
    dataset: str,
    options: Mapping[str, Any] | None,
    data_root: str | Path | None,
    seed: int,
    num_clients: int,
) -> tuple[LoadedDataset, int]:
    """The loaded dataset and the seed its loader got (for its split or its generator).

    A generator with natural clients (a ``num_clients`` option) makes ``num_clients`` of them
    unless ``options`` says otherwise.
    """
    opts = dict(options or {})
    data_seed = opts.pop("seed", T.derive_seed(seed, "dataset"))
    fn = DATASETS.get(dataset)
    if "num_clients" in inspect.signature(fn).parameters:
        opts.setdefault("num_clients", num_clients)
    ds = call_with_options("dataset", dataset, fn, opts, data_root=data_root, seed=data_seed)
    return ds, data_seed


def _positive_classes(spec: Mapping[str, Any], meta: DatasetMeta) -> list[int]:
    C = meta.num_classes
    pos = spec.get("positive_classes")
    if pos is None:  # LibAUC's convention: the upper half of the classes is positive
        return list(range(C // 2, C))
    pos = [pos] if isinstance(pos, int) else list(pos)
    bad = [c for c in pos if not isinstance(c, int) or not 0 <= c < C]
    if not pos or bad or len(set(pos)) == C:
        raise FedriskError(
            f"binarize.positive_classes = {pos!r} is not allowed; allowed: a non-empty list of "
            f"distinct class ids in [0, {C - 1}] that leaves at least one class negative"
        )
    return sorted(set(pos))


def _binarize(ds: LoadedDataset, spec: Mapping[str, Any], seed: int) -> tuple[Samples, Samples, list[int]]:
    if ds.meta.task != "classification":
        raise FedriskError(f"binarize needs a classification dataset; {ds.meta.name!r} is a regression task")
    pos = _positive_classes(spec, ds.meta)
    imratio = spec.get("imratio")
    train = T.binarize(
        ds.train,
        pos,
        imratio,
        seed=T.derive_seed(seed, "imratio"),
        per_class=bool(spec.get("per_class", False)),
    )
    test = T.binarize(ds.test, pos)
    if spec.get("balanced_test", False):
        test = T.balance_classes(test, seed=T.derive_seed(seed, "balanced_test"))
    return train, test, pos


def _partition_key(train: Samples, partition: str, on: str | None, meta: DatasetMeta) -> tuple[str, torch.Tensor]:
    if on is None:
        if partition == "by_attribute":
            natural = meta.notes.get("natural_attribute")
            candidates = [natural] if natural else [a for a in meta.attr_names if a != "class"]
            if not candidates or candidates[0] not in train.attrs:
                raise FedriskError(
                    f"by_attribute needs partition option 'on' naming an attribute; dataset "
                    f"{meta.name!r} has attributes: {', '.join(train.attrs) or '(none)'}"
                )
            on = candidates[0]
        else:
            on = "class" if "class" in train.attrs else "label"
    if on == "label":
        if meta.task != "classification" and partition not in _LABEL_FREE_PARTITIONS:
            raise FedriskError(
                f"partition {partition!r} needs class labels but {meta.name!r} is a regression "
                f"task; allowed: {', '.join(_LABEL_FREE_PARTITIONS)} (by_attribute with on = "
                f"an attribute)"
            )
        # label-free partitioners only need the row count: give them integer placeholders
        return on, train.y if meta.task == "classification" else torch.zeros(len(train), dtype=torch.long)
    if on not in train.attrs:
        allowed = ["label", *train.attrs]
        raise FedriskError(f"partition option on = {on!r} is not allowed; allowed: {', '.join(allowed)}")
    return on, train.attrs[on]


def _class_groups(train: Samples, classes: torch.Tensor) -> list[list[int]] | None:
    """Classes grouped by their (binary) label, if every class has a single label."""
    groups: dict[int, set[int]] = {}
    for c, y in zip(classes.tolist(), train.y.reshape(-1).long().tolist()):
        groups.setdefault(y, set()).add(c)
    flat = [c for g in groups.values() for c in g]
    if len(groups) < 2 or len(flat) != len(set(flat)):
        return None
    return [sorted(groups[y]) for y in sorted(groups)]


def _split_queries(s: Samples, fraction: float, seed: int) -> tuple[Samples, Samples]:
    """Hold out ``ceil(fraction · Q)`` whole queries (``attrs["query"]``, at most ``Q − 1``)."""
    queries = s.attrs["query"]
    ids = torch.unique(queries)
    if ids.numel() < 2:
        raise FedriskError(
            f"data.validation_fraction = {fraction}: the ranking training set has {ids.numel()} query; "
            "a validation split of whole queries needs at least 2"
        )
    n_held = min(max(1, int(torch.ceil(torch.tensor(fraction * ids.numel())).item())), ids.numel() - 1)
    perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))
    held = torch.isin(queries, ids[perm[:n_held]])
    return s.subset(torch.nonzero(~held).flatten().tolist()), s.subset(torch.nonzero(held).flatten().tolist())


def _split_client(s: Samples, fraction: float, seed: int, stratify: bool) -> tuple[Samples, Samples | None]:
    if fraction <= 0:
        return s, None
    keep, held = split_indices(
        s.y if stratify else torch.zeros(len(s), dtype=torch.long), fraction, seed, stratify=stratify
    )
    return s.subset(keep), s.subset(held)


# ----------------------------------------------------------------------------- entry point


def build_federation(
    dataset: str,
    partition: str = "iid",
    num_clients: int = 10,
    *,
    seed: int = 0,
    data_root: str | Path | None = None,
    dataset_options: Mapping[str, Any] | None = None,
    partition_options: Mapping[str, Any] | None = None,
    binarize: Mapping[str, Any] | None = None,
    client_test_fraction: float = 0.0,
    validation_fraction: float = 0.0,
    client_validation_fraction: float = 0.0,
    feature_noise: Mapping[str, Any] | None = None,
    label_noise: Mapping[str, Any] | None = None,
) -> Federation:
    """Load, transform and partition a dataset into a :class:`Federation` (see module doc).

    Args:
        dataset: a name in :data:`DATASETS` (``fedrisk list datasets``).
        partition: a name in :data:`PARTITIONERS`.
        num_clients: number of clients ``K``.
        seed: the run seed; every random step derives its own seed from it.
        data_root: folder holding user-supplied files (MNIST, CIFAR); never downloaded.
        dataset_options: keyword options of the loader (``test_fraction``, ``flatten``, ...).
        partition_options: keyword options of the partitioner (``alpha``, ``min_size``,
            ``classes_per_client``, ``sizes``, ``groups``...) plus ``on`` (what to partition).
        binarize: ``{"positive_classes": [...], "imratio": 0.1, "per_class": False,
            "balanced_test": False}``; ``positive_classes`` defaults to the upper half.
        client_test_fraction: share of each client's rows kept as its personal test set.
        validation_fraction: share of the training set held out as global validation.
        client_validation_fraction: share of each client's training rows (after its test split)
            held out as its personal validation set, stratified by label.
        feature_noise: ``{"std": 0.2, "mean": 0.0, "mean_step": 0.01}`` per-client Gaussian
            input noise (client ``k`` gets mean ``mean + (k - K//2) * mean_step``).
        label_noise: ``{"rate": 0.2}`` symmetric label noise on client training rows.

    Example:
        >>> fed = build_federation("wine", "dirichlet", 3, seed=0,
        ...                        partition_options={"alpha": 1.0, "min_size": 5})
        >>> fed.num_clients, sum(fed.client_sizes) + len(fed.test)
        (3, 178)
    """
    if _reused is not None:  # inside reuse_federations(): build each distinct federation once
        args = dict(locals())
        return _reuse(_reused, _reuse_key(args), lambda: build_federation(**args))
    check_range("client_test_fraction", client_test_fraction, 0.0, 1.0, high_inclusive=False)
    check_range("validation_fraction", validation_fraction, 0.0, 1.0, high_inclusive=False)
    check_range("client_validation_fraction", client_validation_fraction, 0.0, 1.0, high_inclusive=False)
    if not isinstance(num_clients, int) or isinstance(num_clients, bool) or num_clients < 1:
        raise FedriskError(f"num_clients = {num_clients!r} is out of range; allowed: an integer >= 1")
    PARTITIONERS.get(partition)  # fail on an unknown name before loading anything
    bin_spec = _options("binarize", binarize, _BINARIZE_KEYS) if binarize is not None else None
    fn_spec = _options("feature_noise", feature_noise, _FEATURE_NOISE_KEYS) if feature_noise else None
    ln_spec = _options("label_noise", label_noise, _LABEL_NOISE_KEYS) if label_noise else None
    if fn_spec is not None:
        if "std" not in fn_spec:
            raise FedriskError("feature_noise needs 'std' (the noise standard deviation, >= 0)")
        check_range("feature_noise.std", fn_spec["std"], 0.0, None)
    if ln_spec is not None:
        check_range("label_noise.rate", ln_spec.get("rate", 0.0), 0.0, 1.0)

    # 1-2. load and binarise
    ds, data_seed = _load(dataset, dataset_options, data_root, seed, num_clients)
    meta = ds.meta
    train, test = ds.train, ds.test
    num_classes, class_names = meta.num_classes, list(meta.class_names)
    positive_classes = meta.notes.get("positive_classes")
    if bin_spec is not None:
        train, test, positive_classes = _binarize(ds, bin_spec, seed)
        num_classes, class_names = 2, ["negative", "positive"]
    classification = meta.task == "classification"

    # 3. global validation split
    validation = None
    if validation_fraction > 0:
        if meta.task == "ranking" and "query" in train.attrs:  # whole queries
            train, validation = _split_queries(train, validation_fraction, T.derive_seed(seed, "validation"))
        else:
            train, validation = _split_client(
                train, validation_fraction, T.derive_seed(seed, "validation"), classification
            )

    # 4. partition
    popts = dict(partition_options or {})
    on, key = _partition_key(train, partition, popts.pop("on", None), meta)
    if partition == "class_disjoint" and on == "class" and num_classes == 2 and "groups" not in popts:
        popts["groups"] = _class_groups(train, key)
    fn = PARTITIONERS.get(partition)
    parts = call_with_options(
        "partitioner",
        partition,
        fn,
        popts,
        key,
        num_clients=num_clients,
        seed=T.derive_seed(seed, "partition"),
    )
    if len(parts) != num_clients:
        raise FedriskError(f"partition {partition!r} made {len(parts)} clients but num_clients = {num_clients}")

    # 5. per-client splits and noise
    clients: list[Samples] = []
    client_tests: list[Samples] = []
    client_validations: list[Samples] = []
    for k, idx in enumerate(parts):
        s, ct = _split_client(
            train.subset(idx),
            client_test_fraction,
            T.derive_seed(seed, "client_test", k),
            classification,
        )
        cv = None
        if client_validation_fraction > 0:
            n = len(s)
            s, cv = _split_client(
                s, client_validation_fraction, T.derive_seed(seed, "client_validation", k), classification
            )
            if cv is None or len(cv) == 0 or len(s) == 0:
                raise FedriskError(
                    f"data.client_validation_fraction = {client_validation_fraction} leaves client {k} "
                    f"({n} training rows) with {len(cv) if cv is not None else 0} validation and {len(s)} training "
                    "rows; allowed: a fraction that gives every client at least one row on each side (a larger "
                    "fraction, fewer clients or a partition with a larger min_size)"
                )
        if ln_spec is not None and ln_spec.get("rate", 0.0) > 0:
            if not classification:
                raise FedriskError("label_noise needs a classification dataset")
            s = T.flip_labels(s, ln_spec["rate"], num_classes, T.derive_seed(seed, "label_noise", k))
        if fn_spec is not None:
            mean_k = fn_spec.get("mean", 0.0) + (k - num_clients // 2) * fn_spec.get("mean_step", 0.0)
            s = T.add_feature_noise(s, fn_spec["std"], T.derive_seed(seed, "noise", k), mean_k)
            if ct is not None:
                ct = T.add_feature_noise(ct, fn_spec["std"], T.derive_seed(seed, "noise_test", k), mean_k)
            if cv is not None:
                cv = T.add_feature_noise(cv, fn_spec["std"], T.derive_seed(seed, "noise_validation", k), mean_k)
        clients.append(s)
        if ct is not None:
            client_tests.append(ct)
        if cv is not None:
            client_validations.append(cv)

    info: dict[str, Any] = {
        "dataset": dataset,
        "dataset_options": dict(dataset_options or {}),
        "dataset_seed": data_seed,
        "dataset_meta": meta.to_dict(),
        "task": meta.task,
        "partition": partition,
        "partition_options": {**popts, "on": on},
        "num_clients": num_clients,
        "seed": seed,
        "binarize": None if bin_spec is None else {**bin_spec, "positive_classes": positive_classes},
        "positive_classes": positive_classes,
        "client_test_fraction": client_test_fraction,
        "validation_fraction": validation_fraction,
        "client_validation_fraction": client_validation_fraction,
        "feature_noise": fn_spec,
        "label_noise": ln_spec,
        "attr_names": dict(meta.attr_names),
        "client_sizes": [len(c) for c in clients],
    }
    if client_validations:
        info["client_validation_sizes"] = [len(c) for c in client_validations]
    if fn_spec is not None:
        info["client_noise_means"] = [
            fn_spec.get("mean", 0.0) + (k - num_clients // 2) * fn_spec.get("mean_step", 0.0)
            for k in range(num_clients)
        ]
    if classification and num_classes == 2:
        info["positive_ratio"] = train.positive_ratio
        info["client_positive_ratios"] = [c.positive_ratio for c in clients]
        info["test_positive_ratio"] = test.positive_ratio
    return Federation(
        name=f"{dataset}-{partition}-K{num_clients}",
        clients=clients,
        num_classes=num_classes,
        client_tests=client_tests if client_test_fraction > 0 else None,
        client_validations=client_validations if client_validation_fraction > 0 else None,
        validation=validation,
        test=test,
        class_names=class_names,
        info=info,
    )
