"""Users' own tables (registered as dataset ``table``): a CSV or Parquet file, one row per
sample, read with pandas.

The options are those of :func:`load_table`.

Empty cells are an error naming the column and row (fill or drop them first).

Example:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> rows = [f"{i % 3},{'ab'[i % 2]},s{i % 2},{int(i % 3 == 0)}" for i in range(24)]
    >>> _ = p.write_text("age,ward,site,label\\n" + "\\n".join(rows) + "\\n")
    >>> tr, te, meta = load_table(path=str(p), categorical=["ward"], client="site")
    >>> meta.feature_names, meta.attr_names["client"], meta.notes["natural_attribute"]
    (['age', 'ward=a', 'ward=b'], ['s0', 's1'], 'client')
    >>> len(tr) + len(te), sorted(set(tr.attrs["client"].tolist()))
    (24, [0, 1])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrisk.data.loaders import DATASETS, DEFAULT_TEST_FRACTION, LoadedDataset, _choice
from fedrisk.data.sources._user import client_codes, label_codes, resolve_path, user_dataset, value_codes
from fedrisk.errors import FedriskError

__all__ = ["load_table", "read_table"]

SUFFIXES = (".csv", ".csv.gz", ".tsv", ".parquet", ".pq")


def read_table(path: Path):  # -> pandas.DataFrame
    """The file as a pandas DataFrame (format from its name)."""
    try:
        import pandas as pd
    except ImportError:
        raise FedriskError(
            'dataset = "table" reads files with pandas, which is not installed: pip install "fedrisk[data]"'
        ) from None

    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            return pd.read_parquet(path)
        if name.endswith((".csv", ".csv.gz", ".tsv")):
            return pd.read_csv(path, sep="\t" if name.endswith(".tsv") else ",")
    except (ValueError, OSError, ImportError) as exc:
        raise FedriskError(f"cannot read table {str(path)!r}: {exc}") from None
    raise FedriskError(f"table {str(path)!r} has an unknown format; allowed endings: {', '.join(SUFFIXES)}")


def _column(df, col: str, role: str, path: Path):  # -> pandas.Series
    if col not in df.columns:
        raise FedriskError(
            f"{role} column {col!r} is not in {str(path)!r}; its columns: {', '.join(map(str, df.columns))}"
        )
    s = df[col]
    empty = np.flatnonzero(s.isna().to_numpy())
    if len(empty):
        raise FedriskError(
            f"{str(path)!r}: column {col!r} has {len(empty)} empty (NaN) cell(s), first at data row "
            f"{int(empty[0]) + 1}; fill or drop them first"
        )
    return s


@DATASETS.register("table", "your own CSV or Parquet table: label column, features, optional client / split columns")
def load_table(
    *,
    path: str,
    data_root: str | Path | None = None,
    seed: int = 0,
    label: str = "label",
    features: list[str] | None = None,
    categorical: list[str] | None = None,
    client: str | None = None,
    split: str | None = None,
    attributes: list[str] | None = None,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    scale: str = "standardize",
) -> LoadedDataset:
    """A CSV or Parquet table as a dataset, one row per sample.

    ===============  ===========================================================================
    option           meaning
    ===============  ===========================================================================
    ``path``         the file (``.csv``, ``.csv.gz``, ``.tsv``, ``.parquet``, ``.pq``); a relative
                     path is taken under ``data.data_root`` when that is set
    ``label``        the label column (default ``"label"``): integers or strings, ≥ 2 classes
    ``features``     the feature columns (default: every column but label, client and split)
    ``categorical``  feature columns to one-hot encode (categories sorted); any other
                     non-numeric feature is an error
    ``client``       a column of site / client ids: a natural partition (``partition =
                     "by_attribute"`` with ``num_clients`` = the number of sites)
    ``split``        a column of ``train`` / ``test`` values: the official split (else a seeded
                     split, stratified by label and client, of ``test_fraction``)
    ``attributes``   columns kept as coded ``attrs`` (sensitive groups for the fairness metrics,
                     or ``partition_options.on``)
    ``scale``        ``"standardize"`` (default), ``"unit"`` or ``"none"``: numeric features,
                     with train statistics
    ===============  ===========================================================================

    Empty cells are an error naming the column and row (fill or drop them first).
    """
    _choice("scale", scale, ("standardize", "unit", "none"))
    file = resolve_path(path, data_root, "dataset 'table'", f"a table ending in {', '.join(SUFFIXES)}")
    df = read_table(file)
    categorical = list(categorical or [])
    special = [c for c in (label, client, split) if c is not None]
    if features is None:
        features = [str(c) for c in df.columns if c not in special]
    for col in categorical:
        if col not in features:
            raise FedriskError(f"categorical column {col!r} is not a feature; features: {', '.join(features)}")
    if not features:
        raise FedriskError(f"{str(file)!r} has no feature column besides {', '.join(special)}")
    y, class_names = label_codes(_column(df, label, "label", file).to_numpy(), f"label column {label!r} of {file}")
    blocks, names, numeric = [], [], []
    for col in features:
        s = _column(df, col, "feature", file)
        if col in categorical:
            vocab = sorted(s.astype(str).unique())
            codes = np.searchsorted(vocab, s.astype(str).to_numpy())
            blocks.append(np.eye(len(vocab))[codes])
            names += [f"{col}={v}" for v in vocab]
            continue
        if s.dtype.kind not in "biuf":
            raise FedriskError(
                f"feature column {col!r} of {str(file)!r} is not numeric (e.g. {s.iloc[0]!r}); list it in "
                f"data.dataset_options.categorical to one-hot encode it, or leave it out of features"
            )
        numeric.append(sum(b.shape[1] for b in blocks))
        blocks.append(s.to_numpy(dtype=np.float64).reshape(-1, 1))
        names.append(col)
    x = np.concatenate(blocks, axis=1)
    clients = None
    if client is not None:
        clients = client_codes(_column(df, client, "client", file).to_numpy(), f"client column {client!r} of {file}")
    is_test = None
    if split is not None:
        values = _column(df, split, "split", file).astype(str).str.strip().str.lower()
        bad = sorted(set(values) - {"train", "test"})
        if bad:
            raise FedriskError(f"split column {split!r} of {str(file)!r} holds {bad[0]!r}; allowed: 'train', 'test'")
        is_test = (values == "test").to_numpy()
    attrs = {a: value_codes(_column(df, a, "attribute", file).to_numpy()) for a in attributes or []}
    return user_dataset(
        "table",
        x,
        y,
        class_names,
        clients=clients,
        attrs=attrs,
        is_test=is_test,
        test_fraction=test_fraction,
        seed=seed,
        scale=scale,
        scale_cols=np.array(numeric, dtype=np.int64),
        feature_names=names,
        source=str(file),
        notes={"label": label, "client": client, "split": split, "categorical": categorical},
    )
