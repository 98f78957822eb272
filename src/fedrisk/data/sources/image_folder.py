"""Users' own images (registered as dataset ``image_folder``): one folder per class,
optionally one folder per client above them::

    <path>/<class>/*.png|jpg|jpeg                  (layout "class")
    <path>/<client>/<class>/*.png|jpg|jpeg         (layout "client/class": a natural partition,
                                                   used with partition = "by_attribute")

``layout = "auto"`` (default) picks "class" when the first-level folders hold images and
"client/class" when they hold folders of images.  Class names are the sorted folder names
(across all clients).  Images are read with Pillow, converted to RGB (``grayscale = true``:
one channel), resized to ``image_size`` pixels square (bilinear), scaled to ``[0, 1]`` and,
when ``mean`` / ``std`` are given (one value, or one per channel), normalised to
``(x - mean) / std``.  ``x`` is ``[N, C, S, S]`` (``[N, C·S²]`` with ``flatten``).  A seeded
split of ``test_fraction``, stratified by class and client, is held out.  A relative ``path`` is
taken under ``data.data_root`` when that is set.

Example:
    >>> import tempfile, pathlib
    >>> from PIL import Image
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for c in ("cat", "dog"):
    ...     (root / c).mkdir()
    ...     for i in range(3):
    ...         Image.new("RGB", (10, 12), (40 * i, 0, 200)).save(root / c / f"{i}.png")
    >>> tr, te, meta = load_image_folder(path=str(root), image_size=4, test_fraction=0.34)
    >>> tuple(tr.x.shape[1:]), meta.class_names, len(tr), len(te)
    ((3, 4, 4), ['cat', 'dog'], 4, 2)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrisk.data.loaders import DATASETS, DEFAULT_TEST_FRACTION, LoadedDataset, _choice
from fedrisk.data.sources._user import client_codes, resolve_path, user_dataset
from fedrisk.errors import FedriskError, check_range

__all__ = ["IMAGE_SUFFIXES", "load_image_folder"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
LAYOUTS = ("auto", "class", "client/class")


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _scan(root: Path, layout: str) -> list[tuple[Path, str, str | None]]:
    """``(image, class name, client name or None)`` of every image."""
    firsts = _subdirs(root)
    if layout == "auto":
        layout = "client/class" if firsts and not any(_images(d) for d in firsts) else "class"
    found: list[tuple[Path, str, str | None]] = []
    if layout == "class":
        found = [(p, d.name, None) for d in firsts for p in _images(d)]
    else:
        found = [(p, c.name, d.name) for d in firsts for c in _subdirs(d) for p in _images(c)]
    if not found:
        shape = "<class>/" if layout == "class" else "<client>/<class>/"
        raise FedriskError(
            f"no images under {str(root)!r}; expected {root}/{shape}*{'|'.join(IMAGE_SUFFIXES)} (layout {layout!r})"
        )
    return found


def _read(path: Path, size: int, mode: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
            a = np.asarray(im, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise FedriskError(f"cannot read image {str(path)!r}: {exc}") from None
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _per_channel(name: str, values: list[float] | None, channels: int) -> np.ndarray | None:
    if values is None:
        return None
    if len(values) not in (1, channels):
        raise FedriskError(f"{name} has {len(values)} values; allowed: 1 or {channels} (one per channel)")
    return np.asarray(values, dtype=np.float32).reshape(-1, 1, 1)


@DATASETS.register("image_folder", "your own images: <path>/<class>/*.png or <path>/<client>/<class>/*.png")
def load_image_folder(
    *,
    path: str,
    data_root: str | Path | None = None,
    seed: int = 0,
    layout: str = "auto",
    image_size: int = 32,
    grayscale: bool = False,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    flatten: bool = False,
) -> LoadedDataset:
    """A folder of images as a dataset: ``<path>/<class>/*.png|jpg`` (``layout = "class"``) or
    ``<path>/<client>/<class>/*`` (``"client/class"``, a natural partition: ``partition =
    "by_attribute"``); ``"auto"`` tells them apart.  Images are resized to ``image_size``
    square, RGB (``grayscale``: one channel), scaled to [0, 1], then ``(x - mean) / std`` when
    given (one value or one per channel); ``flatten`` gives rows.  A seeded split of
    ``test_fraction``, stratified by class and client, is the test set.
    """
    _choice("layout", layout, LAYOUTS)
    check_range("image_size", image_size, 1, 4096)
    channels = 1 if grayscale else 3
    shift, div = _per_channel("mean", mean, channels), _per_channel("std", std, channels)
    if div is not None and (div <= 0).any():
        raise FedriskError(f"std = {std!r} is out of range; allowed: values > 0")
    root = resolve_path(path, data_root, "dataset 'image_folder'", "a folder <class>/*.png", folder=True)
    found = _scan(root, layout)
    x = np.stack([_read(p, image_size, "L" if grayscale else "RGB") for p, _, _ in found])
    if shift is not None:
        x = x - shift
    if div is not None:
        x = x / div
    if flatten:
        x = x.reshape(len(x), -1)
    class_names = sorted({c for _, c, _ in found})
    if len(class_names) < 2:
        raise FedriskError(f"{str(root)!r} holds a single class folder ({class_names[0]}); at least 2 are needed")
    y = np.searchsorted(class_names, [c for _, c, _ in found]).astype(np.int64)
    clients = None
    if found[0][2] is not None:
        clients = client_codes(np.array([k for _, _, k in found]), f"client folders of {root}")
    return user_dataset(
        "image_folder",
        x,
        y,
        class_names,
        clients=clients,
        is_test=None,
        test_fraction=test_fraction,
        seed=seed,
        scale="none",
        scale_cols=None,
        feature_names=None,
        source=str(root),
        notes={"image_size": image_size, "grayscale": grayscale, "mean": mean, "std": std, "flatten": flatten},
    )
