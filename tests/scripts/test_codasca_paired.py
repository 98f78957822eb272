"""scripts/codasca_paired.py: pairing by seed and the paired statistics of the CODASCA docs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "codasca_paired.py"


def _script():
    spec = importlib.util.spec_from_file_location("codasca_paired", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, seed: int, name: str, aurocs: list[float], finished: bool = True) -> None:
    run = folder / f"s{seed}" / name
    run.mkdir(parents=True)
    rows = [{"round": r + 1, "test_auroc": a} for r, a in enumerate(aurocs)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "summary.json").write_text("{}")


def test_pairs_by_seed_and_reports_the_paired_statistics(tmp_path, capsys):
    pytest.importorskip("scipy")
    base = [0.90, 0.91, 0.92]
    gaps = [0.004, 0.002, -0.001]
    for seed, (b, g) in enumerate(zip(base, gaps)):
        _run(tmp_path, seed, "hard_codaplus_I256", [0.5, b])  # the final evaluation counts
        _run(tmp_path, seed, "hard_codasca_I256", [0.6, b + g])
    _run(tmp_path, 3, "hard_codaplus_I256", [0.93])  # unpaired: left out
    _run(tmp_path, 4, "hard_codasca_I256", [0.99], finished=False)  # unfinished: left out
    _run(tmp_path, 4, "hard_codaplus_I256", [0.93])
    module = _script()
    data = module.collect(tmp_path)
    assert sorted(data[("hard", 256)]) == [0, 1, 2, 3, 4]
    assert data[("hard", 256)][4] == {"codaplus": 0.93}

    module.main(str(tmp_path))
    row = capsys.readouterr().out.strip().splitlines()[-1]
    cells = [c.strip() for c in row.strip("|").split("|")]
    # mean gap 0.001667, sample std 0.002517; paired t = 1.147 with 2 degrees of freedom, p = 0.370
    assert cells[:3] == ["hard", "256", "0,1,2"]
    assert cells[5] == "+0.0017 ± 0.0025"
    assert cells[6] == "2/3"
    assert float(cells[7]) == pytest.approx(0.370, abs=2e-3)
