"""The CheXpert-layout loader on a small fixture written in the real format (no data downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedrisk.data import build_federation
from fedrisk.data.sources.chexpert import FINDINGS, HEADER, load_chexpert
from fedrisk.errors import DatasetMissingError, FedriskError
from fedrisk.experiment.config import resolve_config

RELEASE = "CheXpert-v1.0-small"
# (split, patient/study/view, sex, age, view, AP/PA, Consolidation, Edema)
ROWS = [
    ("train", "patient00001/study1/view1_frontal.jpg", "Female", "68", "Frontal", "AP", "1.0", ""),
    ("train", "patient00001/study1/view2_lateral.jpg", "Female", "68", "Lateral", "", "1.0", "0.0"),
    ("train", "patient00002/study2/view1_frontal.jpg", "Male", "87", "Frontal", "PA", "-1.0", "1.0"),
    ("train", "patient00003/study1/view1_frontal.jpg", "Male", "41", "Frontal", "AP", "0.0", "-1.0"),
    ("train", "patient00004/study1/view1_frontal.jpg", "Female", "55", "Frontal", "AP", "", "0.0"),
    ("train", "patient00005/study1/view1_frontal.jpg", "Male", "33", "Frontal", "PA", "-1.0", ""),
    ("valid", "patient64541/study1/view1_frontal.jpg", "Male", "73", "Frontal", "AP", "1.0", "0.0"),
    ("valid", "patient64542/study1/view1_frontal.jpg", "Female", "70", "Frontal", "PA", "0.0", "1.0"),
]


def write_fixture(root: Path) -> None:
    """The release's layout and header; JPEGs of different sizes and modes, each one grey level."""
    for split in ("train", "valid"):
        lines = [",".join(HEADER)]
        for i, (s, rel, sex, age, view, appa, cons, edema) in enumerate(ROWS):
            if s != split:
                continue
            path = f"{RELEASE}/{split}/{rel}"
            file = root / path
            file.parent.mkdir(parents=True, exist_ok=True)
            level = 20 * (i + 1)
            if i % 2:
                Image.fromarray(np.full((40, 30, 3), level, dtype=np.uint8), "RGB").save(
                    file, format="JPEG", quality=100
                )
            else:
                Image.fromarray(np.full((24, 36), level, dtype=np.uint8), "L").save(file, format="JPEG", quality=100)
            cells = {f: "" for f in FINDINGS} | {"Consolidation": cons, "Edema": edema}
            lines.append(",".join([path, sex, age, view, appa, *(cells[f] for f in FINDINGS)]))
        (root / RELEASE / f"{split}.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_fixture(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("uncertain", "blank", "labels", "kept"),
    [
        ("zeros", "zeros", [1, 1, 0, 0, 0, 0], [0, 1, 2, 3, 4, 5]),
        ("ones", "zeros", [1, 1, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5]),
        ("ignore", "zeros", [1, 1, 0, 0], [0, 1, 3, 4]),
        ("ones", "ignore", [1, 1, 1, 0, 1], [0, 1, 2, 3, 5]),
    ],
)
def test_uncertain_and_blank_policies(
    root: Path, uncertain: str, blank: str, labels: list[int], kept: list[int]
) -> None:
    train, test, meta = load_chexpert(data_root=root, uncertain=uncertain, blank=blank, image_size=8, cache=False)
    assert train.y.tolist() == labels
    assert test.y.tolist() == [1, 0]  # valid.csv is the test set (paper §4.2)
    assert train.x.shape == (len(kept), 1, 8, 8) and train.x.dtype == torch.float32
    # one grey level per image (JPEG of a constant image, any mode / size), scaled to [0, 1]
    levels = [20 * (i + 1) / 255 for i in kept]
    assert train.x.mean(dim=(1, 2, 3)).tolist() == pytest.approx(levels, abs=2 / 255)
    assert train.attrs["sex"].tolist() == [{"Female": 0.0, "Male": 1.0}[ROWS[i][2]] for i in kept]
    assert train.attrs["frontal"].tolist() == [1.0 if ROWS[i][4] == "Frontal" else 0.0 for i in kept]
    assert meta.class_names == ["no Consolidation", "Consolidation"] and meta.notes["uncertain"] == uncertain


def test_other_finding_flatten_and_frontal_only(root: Path) -> None:
    train, _, _ = load_chexpert(
        data_root=root, finding="Edema", uncertain="ones", image_size=4, flatten=True, cache=False
    )
    assert train.y.tolist() == [0, 0, 1, 1, 0, 0] and train.x.shape == (6, 16)
    frontal, _, _ = load_chexpert(data_root=root, frontal_only=True, image_size=4, cache=False)
    assert len(frontal.y) == 5


def test_cache_makes_the_second_load_read_no_image(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_chexpert(data_root=root, image_size=6)
    assert list((root / ".fedrisk_cache").glob("chexpert-*.pt"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was opened despite the cache")

    monkeypatch.setattr(Image, "open", refuse)
    second = load_chexpert(data_root=root, image_size=6)
    assert torch.equal(first.train.x, second.train.x) and torch.equal(first.test.y, second.test.y)
    with pytest.raises(AssertionError, match="despite the cache"):  # another size is another cache entry
        load_chexpert(data_root=root, image_size=7)


def test_bad_input_is_named(root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(FedriskError, match=r"finding 'Pneumonitis' is not a column .* allowed: No Finding, "):
        load_chexpert(data_root=root, finding="Pneumonitis", cache=False)
    with pytest.raises(FedriskError, match=r"uncertain = 'maybe' is not allowed; allowed: 'zeros', 'ones', 'ignore'"):
        load_chexpert(data_root=root, uncertain="maybe")
    with pytest.raises(DatasetMissingError, match=r"needs|not set"):
        load_chexpert(data_root=None)
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(DatasetMissingError, match=r"CheXpert not found .* never downloads"):
        load_chexpert(data_root=empty)
    csv = root / RELEASE / "train.csv"
    csv.write_text(csv.read_text().replace(",1.0,", ",2.0,", 1))
    with pytest.raises(FedriskError, match=r"line 2: Consolidation = '2.0'; allowed: 1.0, 0.0, -1.0 or blank"):
        load_chexpert(data_root=root, cache=False)
    (root / RELEASE / "train" / ROWS[0][1]).unlink()
    csv.write_text(csv.read_text().replace(",2.0,", ",1.0,", 1))
    with pytest.raises(DatasetMissingError, match=r"image .*view1_frontal.jpg.* not found"):
        load_chexpert(data_root=root, cache=False)


def test_selectable_from_a_config(root: Path) -> None:
    cfg = resolve_config(
        {
            "data": {
                "dataset": "chexpert",
                "data_root": str(root),
                "num_clients": 2,
                "dataset_options": {"finding": "Consolidation", "uncertain": "ones", "image_size": 8},
            },
            "model": {"name": "mlp", "hidden": [4]},
            "algorithm": {"name": "fedxl1", "local_steps": 2, "batch_pos": 2, "batch_neg": 2},
        }
    )
    assert cfg["data.dataset"] == "chexpert"
    fed = build_federation(
        "chexpert", num_clients=2, data_root=str(root), dataset_options={"uncertain": "ones", "image_size": 8}, seed=0
    )
    assert sum(len(c.y) for c in fed.clients) == 6 and fed.test is not None and fed.num_classes == 2
