"""Users' own NumPy arrays (registered as dataset ``arrays``): one ``.npz`` file (``numpy.savez``)
holding ``x`` (``[N, ...]``: rows of features or images), ``y`` (``[N]`` class labels, integers
or strings) and optionally ``client`` (``[N]`` site ids: a natural partition, used with
``partition = "by_attribute"``).  ``x_test`` and ``y_test`` (and ``client_test``), when present,
are the official test set; otherwise a seeded split of ``test_fraction``, stratified by label
and client, is held out.  Read with ``allow_pickle=False``: nothing in the file is executed.

A relative ``path`` is taken under ``data.data_root`` when that is set.  ``scale``
(``"none"`` by default) standardises (``"standardize"``) or min-max scales (``"unit"``) the
columns of a 2-D ``x`` with train statistics.

Example:
    >>> import tempfile, pathlib, numpy as np
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.npz"
    >>> rng = np.random.default_rng(0)
    >>> np.savez(p, x=rng.normal(size=(40, 3)), y=np.arange(40) % 2, client=np.arange(40) % 4)
    >>> tr, te, meta = load_arrays(path=str(p))
    >>> tr.x.shape[1], meta.num_classes, meta.attr_names["client"], len(tr) + len(te)
    (3, 2, ['0', '1', '2', '3'], 40)
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from fedrisk.data.loaders import DATASETS, DEFAULT_TEST_FRACTION, LoadedDataset, _choice
from fedrisk.data.sources._user import client_codes, label_codes, resolve_path, user_dataset
from fedrisk.errors import FedriskError

__all__ = ["load_arrays"]


def _read(file: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(file, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise FedriskError(
            f"cannot read {str(file)!r} as a .npz of plain arrays ({exc}); write it with numpy.savez"
        ) from None


@DATASETS.register("arrays", "your own NumPy .npz: x, y and optional client (natural partition) / x_test, y_test")
def load_arrays(
    *,
    path: str,
    data_root: str | Path | None = None,
    seed: int = 0,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    scale: str = "none",
) -> LoadedDataset:
    """A ``.npz`` of arrays as a dataset: ``x`` ``[N, ...]``, ``y`` ``[N]`` (class labels) and
    optionally ``client`` ``[N]`` (a natural partition: ``partition = "by_attribute"``) and
    ``x_test``, ``y_test``, ``client_test`` (the official test set; else a seeded split of
    ``test_fraction``).  ``path`` is relative to ``data_root`` when that is set; ``scale``
    (``"none"``, ``"standardize"``, ``"unit"``) applies to the columns of a 2-D ``x``.
    """
    _choice("scale", scale, ("standardize", "unit", "none"))
    file = resolve_path(path, data_root, "dataset 'arrays'", "a .npz file with arrays x and y (numpy.savez)")
    arrays = _read(file)
    for key in ("x", "y"):
        if key not in arrays:
            raise FedriskError(
                f"{str(file)!r} has no array {key!r}; it holds {', '.join(arrays) or 'nothing'} "
                f"(needed: x, y; optional: client, x_test, y_test, client_test)"
            )
    has_test = "x_test" in arrays or "y_test" in arrays
    if has_test and not ("x_test" in arrays and "y_test" in arrays):
        raise FedriskError(f"{str(file)!r} holds only one of x_test, y_test; give both or neither")
    parts = [("x", "y", "client")] + ([("x_test", "y_test", "client_test")] if has_test else [])
    xs, ys, cs = [], [], []
    for xk, yk, ck in parts:
        x, y = arrays[xk], arrays[yk]
        if x.dtype.kind not in "biuf":
            raise FedriskError(f"{str(file)!r}: array {xk!r} has dtype {x.dtype}; allowed: numbers")
        if x.ndim < 1 or y.ndim != 1 or len(x) != len(y):
            raise FedriskError(
                f"{str(file)!r}: {xk} has shape {list(x.shape)} and {yk} {list(y.shape)}; "
                f"allowed: {xk} [N, ...] and {yk} [N] with the same N"
            )
        bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1).astype(np.float64)).all(axis=1))
        if len(bad):
            raise FedriskError(f"{str(file)!r}: {xk}[{int(bad[0])}] holds NaN or inf ({len(bad)} row(s) do)")
        if (ck in arrays) != ("client" in arrays):
            raise FedriskError(f"{str(file)!r}: give client and client_test together (or neither)")
        if ck in arrays and arrays[ck].shape != y.shape:
            raise FedriskError(f"{str(file)!r}: {ck} has shape {list(arrays[ck].shape)}; allowed: [{len(y)}]")
        xs.append(x.reshape(len(x), -1) if x.ndim == 1 else x)
        ys.append(y)
        if ck in arrays:
            cs.append(arrays[ck])
    if has_test and xs[0].shape[1:] != xs[1].shape[1:]:
        raise FedriskError(f"{str(file)!r}: x is {list(xs[0].shape)} but x_test {list(xs[1].shape)}")
    y, class_names = label_codes(np.concatenate(ys), f"array 'y' of {file}")
    clients = client_codes(np.concatenate(cs), f"array 'client' of {file}") if cs else None
    is_test = np.arange(len(y)) >= len(ys[0]) if has_test else None
    x = np.concatenate(xs).astype(np.float32)
    return user_dataset(
        "arrays",
        x,
        y,
        class_names,
        clients=clients,
        is_test=is_test,
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
        scale_cols=None,
        feature_names=[str(i) for i in range(x.shape[1])] if x.ndim == 2 else None,
        source=str(file),
        notes={"official_split": has_test},
    )
