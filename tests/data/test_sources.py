"""Users' own data: ``table`` (CSV / Parquet), ``arrays`` (.npz) and ``image_folder`` sources,
their natural partition through ``by_attribute``, and their one-line bad-input errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from fedrisk.data import build_federation, load_dataset
from fedrisk.errors import DatasetMissingError, FedriskError


def hospital(n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "site": np.array(["a", "b", "c"])[np.arange(n) % 3],
            "age": rng.integers(20, 90, n),
            "ward": rng.choice(["icu", "gen"], n),
            "bmi": rng.normal(27, 4, n).round(1),
            "y": (np.arange(n) % 4 == 0).astype(int),
        }
    )


@pytest.fixture
def csv(tmp_path: Path) -> Path:
    p = tmp_path / "h.csv"
    hospital().to_csv(p, index=False)
    return p


def test_table_features_encoding_and_scaling(csv: Path) -> None:
    tr, te, meta = load_dataset("table", path=str(csv), label="y", categorical=["ward"], client="site")
    assert meta.feature_names == ["age", "ward=gen", "ward=icu", "bmi"]
    assert meta.class_names == ["0", "1"] and meta.attr_names["client"] == ["a", "b", "c"]
    df = hospital()
    assert len(tr) + len(te) == len(df) and int(tr.y.sum() + te.y.sum()) == int(df["y"].sum())
    # numeric columns standardised with train statistics; the one-hot columns left as 0/1
    assert torch.allclose(tr.x[:, [0, 3]].mean(0), torch.zeros(2), atol=1e-5)
    assert set(tr.x[:, 1].tolist()) == {0.0, 1.0} and torch.equal(tr.x[:, 1] + tr.x[:, 2], torch.ones(len(tr)))
    # every site keeps rows on both sides of the (label x site stratified) split
    assert set(tr.attrs["client"].tolist()) == set(te.attrs["client"].tolist()) == {0, 1, 2}


def test_table_client_column_is_the_natural_partition(csv: Path) -> None:
    opts = {"path": str(csv), "label": "y", "categorical": ["ward"], "client": "site", "scale": "none"}
    fed = build_federation("table", "by_attribute", 3, seed=0, dataset_options=opts)
    df = hospital()
    for k, site in enumerate(["a", "b", "c"]):
        rows = df[df.site == site]
        client = fed.clients[k]
        test_rows = int((fed.test.attrs["client"] == k).sum())
        assert len(client) + test_rows == len(rows)
        assert set(client.attrs["client"].tolist()) == {k}
        # the client's rows are that site's rows: compare the raw ages (scale = "none")
        assert set(client.x[:, 0].long().tolist()) <= set(rows.age.tolist())
    assert fed.info["partition_options"]["on"] == "client"


def test_table_split_column_and_parquet_give_the_same_numbers(tmp_path: Path) -> None:
    df = hospital()
    df["part"] = np.where(np.arange(len(df)) < 45, "train", "test")
    df.to_csv(tmp_path / "h.csv", index=False)
    df.to_parquet(tmp_path / "h.parquet")
    opts = {"label": "y", "categorical": ["ward"], "split": "part", "features": ["age", "ward"]}
    a = load_dataset("table", path="h.csv", data_root=tmp_path, **opts)
    b = load_dataset("table", path=str(tmp_path / "h.parquet"), **opts)
    assert (len(a.train), len(a.test)) == (45, 15)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert a.meta.feature_names == ["age", "ward=gen", "ward=icu"]


def test_table_attributes_are_coded_groups_for_partitions_and_metrics(csv: Path) -> None:
    opts = {"path": str(csv), "label": "y", "features": ["age", "bmi"], "attributes": ["ward"]}
    tr, te, meta = load_dataset("table", **opts)
    assert meta.attr_names == {"ward": ["gen", "icu"]} and meta.feature_names == ["age", "bmi"]
    wards = hospital()["ward"].map({"gen": 0, "icu": 1})
    assert int(tr.attrs["ward"].sum() + te.attrs["ward"].sum()) == int(wards.sum())
    fed = build_federation("table", "by_attribute", 2, dataset_options=opts, partition_options={"on": "ward"})
    assert [set(c.attrs["ward"].tolist()) for c in fed.clients] == [{0}, {1}]


def test_table_string_labels_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    df = hospital()
    df["y"] = np.where(df["y"] == 1, "sick", "healthy")
    df.to_csv(tmp_path / "h.csv", index=False)
    tr, te, meta = load_dataset("table", path=str(tmp_path / "h.csv"), label="y", features=["age", "bmi"])
    assert meta.class_names == ["healthy", "sick"] and int(tr.y.sum() + te.y.sum()) == 15


@pytest.mark.parametrize(
    ("change", "options", "message"),
    [
        (None, {"label": "outcome"}, r"label column 'outcome' is not in '.*h\.csv'; its columns: site, age, ward"),
        (None, {"label": "y"}, r"feature column 'site' of '.*' is not numeric \(e\.g\. 'a'\); list it in data\.data"),
        ("nan", {"label": "y", "client": "site", "categorical": ["ward"]}, r"column 'bmi' has 1 empty \(NaN\) cell"),
        ("one_class", {"label": "y", "client": "site", "categorical": ["ward"]}, r"single class \(0\); a classif"),
        ("row_ids", {"label": "y", "client": "id", "features": ["age"]}, r"gives 60 of its 60 clients a single row"),
        (None, {"label": "y", "client": "site", "categorical": ["wrd"]}, r"categorical column 'wrd' is not a feature"),
        ("split", {"label": "y", "client": "site", "categorical": ["ward"], "split": "part"}, r"holds 'val'; allowed"),
    ],
)
def test_table_bad_input_is_one_line(tmp_path: Path, change, options, message) -> None:
    df = hospital()
    if change == "nan":
        df.loc[7, "bmi"] = np.nan
    elif change == "one_class":
        df["y"] = 0
    elif change == "row_ids":
        df["id"] = np.arange(len(df))
    elif change == "split":
        df["part"] = ["train", "test", "val"] * 20
    df.to_csv(tmp_path / "h.csv", index=False)
    with pytest.raises(FedriskError, match=message) as info:
        load_dataset("table", path=str(tmp_path / "h.csv"), **options)
    assert "\n" not in str(info.value)


def test_table_missing_file_and_format(tmp_path: Path) -> None:
    with pytest.raises(DatasetMissingError, match=r"file '.*nope\.csv' does not exist; expected a table ending in"):
        load_dataset("table", path="nope.csv", data_root=tmp_path)
    (tmp_path / "h.xlsx").write_text("x")
    with pytest.raises(FedriskError, match=r"unknown format; allowed endings: \.csv"):
        load_dataset("table", path=str(tmp_path / "h.xlsx"))


# ----------------------------------------------------------------------------- arrays


def test_arrays_with_clients_and_official_test(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 2, 3)), np.arange(30) % 3
    client = np.repeat([7, 8, 9], 10)
    xt, yt = rng.normal(size=(9, 2, 3)), np.arange(9) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y, client=client, x_test=xt, y_test=yt, client_test=np.repeat([7, 8, 9], 3))
    tr, te, meta = load_dataset("arrays", path=str(tmp_path / "d.npz"))
    assert torch.equal(tr.x, torch.as_tensor(x, dtype=torch.float32)) and torch.equal(te.y, torch.as_tensor(yt))
    assert meta.attr_names["client"] == ["7", "8", "9"] and meta.notes["natural_attribute"] == "client"
    fed = build_federation("arrays", "by_attribute", 3, dataset_options={"path": str(tmp_path / "d.npz")})
    assert list(fed.client_sizes) == [10, 10, 10] and torch.equal(fed.clients[1].x, tr.x[10:20])


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 2))}, r"has no array 'y'; it holds x \(needed: x, y"),
        ({"x": np.array([[0.0], [np.nan], [1], [2]]), "y": np.array([0, 1, 0, 1])}, r"x\[1\] holds NaN or inf"),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4, dtype=int)}, r"array 'y' of .* holds a single class"),
        ({"x": np.zeros((4, 2)), "y": np.arange(4) % 2, "client": np.arange(4)}, r"4 of its 4 clients a single row"),
        ({"x": np.zeros((4, 2)), "y": np.arange(3) % 2}, r"x has shape \[4, 2\] and y \[3\]"),
    ],
)
def test_arrays_bad_input(tmp_path: Path, arrays, message) -> None:
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(FedriskError, match=message):
        load_dataset("arrays", path=str(tmp_path / "d.npz"))


# ----------------------------------------------------------------------------- image folder


def write_images(root: Path, clients: list[str] | None, per_class: int = 4) -> None:
    for k, client in enumerate(clients or [None]):
        for c, name in enumerate(["benign", "malignant"]):
            folder = root / client / name if client else root / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (6, 5), (10 * i + k, 100 * c, 30)).save(folder / f"{i}.png")


def test_image_folder_normalises_as_configured(tmp_path: Path) -> None:
    write_images(tmp_path, None)
    opts = {"path": str(tmp_path), "image_size": 3, "mean": [0.5, 0.25, 0.0], "std": [0.5], "test_fraction": 0.25}
    tr, te, meta = load_dataset("image_folder", **opts)
    assert tuple(tr.x.shape) == (6, 3, 3, 3) and len(te) == 2 and meta.class_names == ["benign", "malignant"]
    # a solid-colour image stays solid after resizing: channel value v -> (v / 255 - mean) / std
    m, sd = torch.tensor([0.5, 0.25, 0.0]).reshape(1, 3, 1, 1), 0.5
    raw = torch.round((tr.x * sd + m) * 255)
    assert torch.allclose(tr.x, (raw / 255 - m) / sd, atol=1e-5)
    assert set(raw[:, 0].unique().tolist()) == {0.0, 10.0, 20.0, 30.0}  # red = 10 i
    assert torch.equal(raw[:, 1], 100.0 * tr.y.float().reshape(-1, 1, 1).expand(-1, 3, 3))  # green = 100 c
    assert torch.equal(raw[:, 2], torch.full_like(raw[:, 2], 30.0))  # blue = 30
    grey = load_dataset("image_folder", path=str(tmp_path), image_size=2, grayscale=True, flatten=True)
    assert tuple(grey.train.x.shape[1:]) == (4,)


def test_image_folder_client_layout_is_the_natural_partition(tmp_path: Path) -> None:
    write_images(tmp_path, ["site1", "site2", "site3"])
    fed = build_federation(
        "image_folder",
        "by_attribute",
        3,
        dataset_options={"path": str(tmp_path), "image_size": 2, "test_fraction": 0.25},
    )
    assert list(fed.client_sizes) == [6, 6, 6] and len(fed.test) == 6
    # client k's red channel is 10 i + k: every pixel of client k is k (mod 10) in 0..255 units
    for k, client in enumerate(fed.clients):
        red = torch.round(client.x[:, 0] * 255).long()
        assert set((red % 10).unique().tolist()) == {k}


def test_image_folder_bad_input(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(FedriskError, match=r"no images under '.*'; expected .*<class>/\*\.png"):
        load_dataset("image_folder", path=str(tmp_path))
    write_images(tmp_path / "ok", None)
    (tmp_path / "ok" / "benign" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(FedriskError, match=r"cannot read image '.*benign/broken\.png'"):
        load_dataset("image_folder", path=str(tmp_path / "ok"))
    with pytest.raises(FedriskError, match=r"mean has 2 values; allowed: 1 or 3"):
        load_dataset("image_folder", path=str(tmp_path / "ok"), mean=[0.1, 0.2])


# ----------------------------------------------------------------------------- command line


def test_cli_runs_a_table_by_site_and_refuses_bad_input_before_writing(tmp_path: Path, csv: Path, capsys) -> None:
    import tomli_w

    from fedrisk.cli import main

    config = {
        "data": {
            "dataset": "table",
            "partition": "by_attribute",
            "num_clients": 3,
            "dataset_options": {"path": csv.name, "label": "y", "client": "site", "categorical": ["ward"]},
            "data_root": str(csv.parent),
        },
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 2, "batch_size": 8},
        "run": {"rounds": 1, "threads": 1},
        "output": {"plots": False},
    }
    (tmp_path / "c.toml").write_text(tomli_w.dumps(config))
    assert main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    assert "fedavg on table-by_attribute-K3" in capsys.readouterr().out
    for bad in ("label=outcome", "categorical=[]", "client=age"):
        code = main(
            ["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "r"), "--set", f"data.dataset_options.{bad}"]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "r").exists()


def test_your_data_page_shows_the_shipped_config_and_it_is_valid() -> None:
    from fedrisk.experiment.config import load_config

    root = Path(__file__).resolve().parents[2]
    shipped = (root / "docs" / "examples" / "hospital.toml").read_text()
    body = shipped[shipped.index("[data]") :]
    assert f"```toml\n{body}```" in (root / "docs" / "your-data.md").read_text()
    cfg = load_config(root / "docs" / "examples" / "hospital.toml")
    assert cfg["data.dataset"] == "table" and cfg["data.partition"] == "by_attribute"
    assert "(your-data.md)" in (root / "docs" / "getting-started.md").read_text()
