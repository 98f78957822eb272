"""scikit-learn's bundled sets (``digits``, ``breast_cancer``, ``wine``): offline, with a
seeded stratified test split and train-statistics scaling.

Example:
    >>> tr, te, meta = load_wine(seed=0)
    >>> tr.x.shape[1], meta.num_classes
    (13, 3)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fedrisk.data.loaders import (
    DATASETS,
    DEFAULT_TEST_FRACTION,
    DatasetMeta,
    LoadedDataset,
    _as_images,
    _choice,
    _samples,
    _scale_samples,
    _split,
)


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
    train, test = _scale_samples(train, test, scale)
    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        feature_names=feature_names,
        source=f"scikit-learn load_{name}",
        notes={"scale": scale, "test_fraction": test_fraction},
    )
    return LoadedDataset(train, test, meta)


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
