"""What the users'-own-data sources share: a path under ``data_root``, labels and client ids
as codes, and the seeded train/test split with train-statistics scaling.

A source returns a :class:`~fedrisk.data.loaders.LoadedDataset` like every built-in loader, so
the same binarisation, validation split and partitioners apply.  A ``client`` column becomes
``attrs["client"]`` and ``meta.notes["natural_attribute"] = "client"``: the partitioner
``by_attribute`` then deals one client per distinct value (the natural partition).

Example:
    >>> import numpy as np
    >>> codes, names = label_codes(np.array(["no", "yes", "no"]), "label column 'y' of t.csv")
    >>> codes.tolist(), names
    ([0, 1, 0], ['no', 'yes'])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedrisk.data.loaders import DatasetMeta, LoadedDataset, _samples, _scale_samples
from fedrisk.data.partition import split_indices
from fedrisk.errors import DatasetMissingError, FedriskError, check_range

__all__ = ["client_codes", "label_codes", "resolve_path", "user_dataset", "value_codes"]


def resolve_path(path: str, data_root: str | Path | None, what: str, expect: str, folder: bool = False) -> Path:
    """``path`` (relative ones under ``data_root`` when it is set), checked to exist."""
    p = Path(path).expanduser()
    if not p.is_absolute() and data_root is not None:
        p = Path(data_root).expanduser() / p
    if not (p.is_dir() if folder else p.is_file()):
        kind = "folder" if folder else "file"
        raise DatasetMissingError(f"{what}: {kind} {str(p)!r} does not exist; expected {expect}")
    return p


def _codes(values: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    uniq, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), uniq.tolist()


def value_codes(values: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes ``0..G-1`` of any values (sorted as strings) and their names."""
    codes, uniq = _codes(np.asarray(values).astype(str).reshape(-1))
    return codes, [str(v) for v in uniq]


def label_codes(values: np.ndarray, where: str) -> tuple[np.ndarray, list[str]]:
    """Class codes ``0..C-1`` of a label array (integers ``0..C-1`` kept as they are; other
    integers or strings numbered in sorted order) and the class names; at least two classes."""
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind == "f":
        bad = np.flatnonzero(np.isnan(values) | (values != np.round(values)))
        if len(bad):
            raise FedriskError(
                f"{where} holds {values[bad[0]]!r} at row {int(bad[0])}; allowed: class labels "
                f"(integers or strings, no empty cells)"
            )
        values = values.astype(np.int64)
    if values.dtype.kind not in "iub":
        values = values.astype(str)
    codes, uniq = _codes(values)
    if len(uniq) < 2:
        raise FedriskError(
            f"{where} holds a single class ({uniq[0] if uniq else 'no rows'!s}); a classification task needs at least 2"
        )
    return codes, [str(v) for v in uniq]


def client_codes(values: np.ndarray, where: str) -> tuple[np.ndarray, list[str]]:
    """Client ids as codes ``0..K-1`` (sorted) and their names; every client needs two rows."""
    codes, uniq = _codes(np.asarray(values).astype(str).reshape(-1))
    counts = np.bincount(codes, minlength=len(uniq))
    single = [str(uniq[i]) for i in np.flatnonzero(counts < 2)]
    if single:
        hint = " (is it a row id?)" if len(single) == len(uniq) else ""
        raise FedriskError(
            f"{where} gives {len(single)} of its {len(uniq)} clients a single row (e.g. {single[0]!r}){hint}; "
            f"allowed: a site/client id with at least 2 rows per client"
        )
    return codes, [str(v) for v in uniq]


def user_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    class_names: list[str],
    *,
    clients: tuple[np.ndarray, list[str]] | None,
    attrs: dict[str, tuple[np.ndarray, list[str]]] | None = None,
    is_test: np.ndarray | None,
    test_fraction: float,
    seed: int,
    scale: str,
    scale_cols: np.ndarray | None,
    feature_names: list[str] | None,
    source: str,
    notes: dict[str, Any],
) -> LoadedDataset:
    """Split (``is_test`` given, else seeded and stratified by label, and by client when there
    are clients, so every client keeps rows on both sides), then scale ``scale_cols`` (all
    columns when None) of a 2-D ``x`` with train statistics."""
    coded = dict(attrs or {})
    if clients is not None:
        coded["client"] = clients
    all_rows = _samples(x, y, **{k: v[0] for k, v in coded.items()})
    if is_test is not None:
        if is_test.all() or not is_test.any():
            side = "test" if is_test.all() else "train"
            raise FedriskError(f"{source}: every row is a {side} row; the split must give rows to both train and test")
        train, test = all_rows.subset(np.flatnonzero(~is_test)), all_rows.subset(np.flatnonzero(is_test))
    else:
        check_range("test_fraction", test_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        strata = y if clients is None else clients[0] * len(class_names) + y
        keep, held = split_indices(strata, test_fraction, seed, stratify=True)
        train, test = all_rows.subset(keep), all_rows.subset(held)
    if len(np.unique(train.y.numpy())) < 2:
        raise FedriskError(f"{source}: the training rows hold a single class; a classification task needs at least 2")
    if train.x.dim() == 2 and scale != "none":
        train, test = _scale_samples(train, test, scale, scale_cols)
    meta_notes = {"scale": scale, **notes}
    if clients is not None:
        meta_notes["natural_attribute"] = "client"
    if is_test is None:
        meta_notes["test_fraction"] = test_fraction
    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        attr_names={k: v[1] for k, v in coded.items()},
        feature_names=feature_names,
        source=source,
        notes=meta_notes,
    )
    return LoadedDataset(train, test, meta)
