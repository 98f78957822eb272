"""CIFAR-10 / CIFAR-100 from the "python version" pickles under ``data_root``; only arrays and
plain containers are unpickled.

Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

    train, test, meta = load_cifar10(data_root="~/data")
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedrisk.data.federation import Samples
from fedrisk.errors import DatasetMissingError, FedriskError

__all__ = ["load_cifar10", "load_cifar100"]

from fedrisk.data.loaders import (
    DATASETS,
    DatasetMeta,
    LoadedDataset,
    _choice,
    _images,
    _need_root,
    _samples,
)


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
