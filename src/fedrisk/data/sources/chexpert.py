"""Users' own chest X-rays in the CheXpert layout (registered as dataset ``chexpert``).

The CheXpert release (Irvin et al. 2019; ``CheXpert-v1.0`` or ``CheXpert-v1.0-small``) is a
folder holding ``train.csv`` and ``valid.csv`` and the images they point to::

    <data_root>/CheXpert-v1.0-small/train.csv
    <data_root>/CheXpert-v1.0-small/valid.csv
    <data_root>/CheXpert-v1.0-small/train/patient00001/study1/view1_frontal.jpg
    ...

Each CSV has a ``Path`` column (relative to ``<data_root>``, i.e. starting with the release's
folder name; paths relative to the CSV's own folder are accepted too), the columns ``Sex``,
``Age``, ``Frontal/Lateral``, ``AP/PA`` and one column per finding (``No Finding``,
``Cardiomegaly``, ``Edema``, ``Consolidation``, ``Pleural Effusion``, ...) with values ``1.0``
(positive), ``0.0`` (negative), ``-1.0`` (uncertain) or blank (not mentioned).  Nothing is
downloaded: point ``data.data_root`` at your copy (any folder in this layout works, e.g. your
own images with a CSV written in the same format).

Label policy for the chosen ``finding`` (the paper's task: Consolidation):

* ``uncertain`` — what ``-1`` becomes: ``"ones"`` (U-Ones), ``"zeros"`` (U-Zeros, default) or
  ``"ignore"`` (the row is dropped);
* ``blank`` — what an empty cell becomes: ``"zeros"`` (default: not mentioned = negative, the
  usual reading) or ``"ignore"``.

The split follows the paper (§4.2): ``train.csv`` is the training set and ``valid.csv`` the test
set.  Images are read with Pillow, converted to grey scale, resized to ``image_size`` pixels
square (bilinear) and scaled to ``[0, 1]``: ``x`` is ``[N, 1, S, S]`` (``[N, S²]`` with
``flatten``).  The decoded tensors are cached in ``<data_root>/.fedrisk_cache/`` (``cache =
false`` to skip), keyed by the CSV's size and modification time, the finding, the policy and
the size, so the second load does not open a single image.  ``attrs`` carry ``sex`` (0 female,
1 male, 2 unknown), ``age`` and ``frontal`` (1 frontal, 0 lateral).

Example (a two-image folder written in the real format):
    >>> import tempfile, pathlib
    >>> from PIL import Image
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> rel = write_example(root)
    >>> train, test, meta = load_chexpert(data_root=root, finding="Edema", image_size=8)
    >>> tuple(train.x.shape), train.y.tolist(), meta.class_names
    ((2, 1, 8, 8), [1, 0], ['no Edema', 'Edema'])
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedrisk.data.federation import Samples
from fedrisk.data.loaders import DATASETS, DatasetMeta, LoadedDataset, _choice, _need_root
from fedrisk.errors import DatasetMissingError, FedriskError, check_range

__all__ = ["FINDINGS", "UNCERTAIN_POLICIES", "load_chexpert", "read_labels", "write_example"]

FINDINGS = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)
"""The 14 finding columns of the CheXpert CSVs."""

HEADER = ("Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", *FINDINGS)
UNCERTAIN_POLICIES = ("zeros", "ones", "ignore")
BLANK_POLICIES = ("zeros", "ignore")
RELEASES = ("CheXpert-v1.0-small", "CheXpert-v1.0")
CACHE_DIR = ".fedrisk_cache"


def _find_csvs(root: Path) -> tuple[Path, Path]:
    for folder in (*(root / r for r in RELEASES), root):
        if (folder / "train.csv").is_file() and (folder / "valid.csv").is_file():
            return folder / "train.csv", folder / "valid.csv"
    raise DatasetMissingError(
        f"CheXpert not found under {str(root)!r}: expected train.csv and valid.csv in "
        f"{' or '.join(f'<data_root>/{r}/' for r in RELEASES)} or <data_root>/ itself. fedrisk never downloads"
    )


def read_labels(
    csv_path: str | Path, finding: str, uncertain: str = "zeros", blank: str = "zeros"
) -> list[tuple[str, int, dict[str, float]]]:
    """``(relative image path, label, attrs)`` of every kept row of a CheXpert CSV.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "train.csv"
        >>> rows = ["Path,Sex,Age,Frontal/Lateral,AP/PA,Edema", "a.jpg,Male,60,Frontal,AP,1.0",
        ...         "b.jpg,Female,70,Lateral,,-1.0", "c.jpg,Male,50,Frontal,PA,"]
        >>> _ = p.write_text("\\n".join(rows) + "\\n")
        >>> [(r, y) for r, y, _ in read_labels(p, "Edema", uncertain="ones")]
        [('a.jpg', 1), ('b.jpg', 1), ('c.jpg', 0)]
        >>> [(r, y) for r, y, _ in read_labels(p, "Edema", uncertain="ignore", blank="ignore")]
        [('a.jpg', 1)]
    """
    _choice("uncertain", uncertain, UNCERTAIN_POLICIES)
    _choice("blank", blank, BLANK_POLICIES)
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "Path" not in columns:
            raise FedriskError(f"{csv_path}: no 'Path' column; a CheXpert CSV starts with {', '.join(HEADER[:5])}")
        if finding not in columns:
            known = [c for c in columns if c not in HEADER[:5]]
            raise FedriskError(f"finding {finding!r} is not a column of {csv_path}; allowed: {', '.join(known)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            cell = (row.get(finding) or "").strip()
            if cell == "":
                if blank == "ignore":
                    continue
                label = 0
            else:
                try:
                    value = float(cell)
                except ValueError:
                    raise FedriskError(
                        f"{csv_path}, line {line}: {finding} = {cell!r}; allowed: 1.0, 0.0, -1.0 or blank"
                    ) from None
                if value == -1.0:
                    if uncertain == "ignore":
                        continue
                    label = 1 if uncertain == "ones" else 0
                elif value in (0.0, 1.0):
                    label = int(value)
                else:
                    raise FedriskError(
                        f"{csv_path}, line {line}: {finding} = {cell!r}; allowed: 1.0, 0.0, -1.0 or blank"
                    )
            sex = {"Female": 0.0, "Male": 1.0}.get((row.get("Sex") or "").strip(), 2.0)
            try:
                age = float(row.get("Age") or "nan")
            except ValueError:
                age = float("nan")
            frontal = 1.0 if (row.get("Frontal/Lateral") or "Frontal").strip() == "Frontal" else 0.0
            rows.append((row["Path"].strip(), label, {"sex": sex, "age": age, "frontal": frontal}))
    return rows


def _resolve(root: Path, csv_dir: Path, rel: str) -> Path:
    for candidate in (
        root / rel,
        csv_dir / rel,
        csv_dir / Path(*Path(rel).parts[1:]) if len(Path(rel).parts) > 1 else None,
    ):
        if candidate is not None and candidate.is_file():
            return candidate
    raise DatasetMissingError(
        f"image {rel!r} listed in {csv_dir} not found under {str(root)!r} (nor under the CSV's folder)"
    )


def _read_images(root: Path, csv_path: Path, rels: Sequence[str], size: int) -> torch.Tensor:
    from PIL import Image

    out = np.empty((len(rels), 1, size, size), dtype=np.float32)
    for i, rel in enumerate(rels):
        with Image.open(_resolve(root, csv_path.parent, rel)) as img:
            grey = img.convert("L").resize((size, size), Image.BILINEAR)
            out[i, 0] = np.asarray(grey, dtype=np.float32) / 255.0
    return torch.from_numpy(out)


def _split(
    root: Path, csv_path: Path, finding: str, uncertain: str, blank: str, size: int, frontal_only: bool, cache: bool
) -> Samples:
    stat = csv_path.stat()
    key = json.dumps(
        [str(csv_path.resolve()), stat.st_size, stat.st_mtime_ns, finding, uncertain, blank, size, frontal_only]
    )
    cache_file = root / CACHE_DIR / f"chexpert-{hashlib.sha1(key.encode()).hexdigest()[:16]}.pt"
    if cache and cache_file.is_file():
        blob = torch.load(cache_file, weights_only=True)
        return Samples(blob["x"], blob["y"], {k: blob[k] for k in ("sex", "age", "frontal")})
    rows = read_labels(csv_path, finding, uncertain, blank)
    if frontal_only:
        rows = [r for r in rows if r[2]["frontal"] == 1.0]
    if not rows:
        raise FedriskError(
            f"{csv_path}: no rows left for {finding!r} with uncertain = {uncertain!r}, blank = {blank!r}"
        )
    x = _read_images(root, csv_path, [r[0] for r in rows], size)
    y = torch.tensor([r[1] for r in rows], dtype=torch.int64)
    attrs = {k: torch.tensor([r[2][k] for r in rows], dtype=torch.float32) for k in ("sex", "age", "frontal")}
    if cache:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        torch.save({"x": x, "y": y, **attrs}, tmp)
        tmp.replace(cache_file)
    return Samples(x, y, attrs)


@DATASETS.register("chexpert", "CheXpert-layout chest X-rays (CSV + images) under --data-root; one finding, binary")
def load_chexpert(
    *,
    data_root: str | Path | None = None,
    finding: str = "Consolidation",
    uncertain: str = "zeros",
    blank: str = "zeros",
    image_size: int = 32,
    frontal_only: bool = False,
    flatten: bool = False,
    cache: bool = True,
) -> LoadedDataset:
    """CheXpert's ``train.csv`` (training) and ``valid.csv`` (test) for one ``finding`` (module docstring).

    Raises:
        DatasetMissingError: no ``data_root``, no CSVs, or a listed image missing.
        FedriskError: an unknown finding (the CSV's finding columns are listed), a bad policy, a
            cell other than 1 / 0 / -1 / blank, an image size < 1.
    """
    root = _need_root(data_root, "CheXpert", "CheXpert-v1.0-small/{train,valid}.csv and the images")
    check_range("image_size", image_size, 1)
    _choice("uncertain", uncertain, UNCERTAIN_POLICIES)
    _choice("blank", blank, BLANK_POLICIES)
    train_csv, valid_csv = _find_csvs(root)
    parts = [
        _split(root, p, finding, uncertain, blank, image_size, frontal_only, cache) for p in (train_csv, valid_csv)
    ]
    if flatten:
        parts = [Samples(s.x.reshape(len(s.y), -1), s.y, s.attrs) for s in parts]
    meta = DatasetMeta(
        "chexpert",
        2,
        [f"no {finding}", finding],
        attr_names={"sex": ["Female", "Male", "Unknown"], "frontal": ["Lateral", "Frontal"]},
        source=str(train_csv.parent),
        notes={"finding": finding, "uncertain": uncertain, "blank": blank, "image_size": image_size},
    )
    return LoadedDataset(parts[0], parts[1], meta)


def write_example(root: str | Path, release: str = "CheXpert-v1.0-small") -> list[str]:
    """Write a tiny CheXpert-format folder (2 training and 1 validation JPEG, real header) under
    ``root``; returns the relative image paths.  For tests and the documentation."""
    from PIL import Image

    root = Path(root)
    rows = [
        ("train", "patient00001/study1/view1_frontal.jpg", "Male", "68", "Frontal", "AP", {"Edema": "1.0"}),
        ("train", "patient00002/study1/view1_lateral.jpg", "Female", "87", "Lateral", "", {"Edema": "0.0"}),
        ("valid", "patient64541/study1/view1_frontal.jpg", "Male", "73", "Frontal", "AP", {"Edema": "-1.0"}),
    ]
    paths = []
    for split in ("train", "valid"):
        lines = [",".join(HEADER)]
        for s, rel, sex, age, view, appa, labels in rows:
            if s != split:
                continue
            path = f"{release}/{split}/{rel}"
            file = root / path
            file.parent.mkdir(parents=True, exist_ok=True)
            shade = 40 + 60 * len(paths)
            Image.fromarray(np.full((20, 16), shade, dtype=np.uint8)).save(file, format="JPEG")
            cells = [labels.get(f, "") for f in FINDINGS]
            lines.append(",".join([path, sex, age, view, appa, *cells]))
            paths.append(path)
        (root / release).mkdir(parents=True, exist_ok=True)
        (root / release / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return paths
