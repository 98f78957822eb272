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


def test_recorded_values_fill_in_and_runs_on_disk_replace_them(tmp_path, capsys):
    pytest.importorskip("scipy")
    csv = tmp_path / "recorded.csv"
    csv.write_text(
        "model,setup,window,seed,algorithm,final_test_auroc\n"
        "cnn,k16,128,0,codaplus,0.9400\n"
        "cnn,k16,128,0,codasca,0.9410\n"
        "cnn,base,32,0,codaplus,0.9405\n"
        "cnn,base,32,0,codasca,0.9397\n"
    )
    _run(tmp_path / "cnn_runs", 0, "k16_codasca_I128", [0.5, 0.9430])  # replaces the recorded 0.9410
    _run(tmp_path / "cnn_runs", 0, "imratio30_codaplus_I128", [0.95])  # unpaired: left out
    module = _script()
    data = module.gather([f"cnn={tmp_path / 'cnn_runs'}"], str(csv))
    assert data[("cnn k16", 128)][0] == {"codaplus": 0.94, "codasca": 0.943}
    assert data[("cnn base", 32)][0] == {"codaplus": 0.9405, "codasca": 0.9397}

    module.cli([f"cnn={tmp_path / 'cnn_runs'}", "--recorded", str(csv), "--plot", str(tmp_path / "p.png")])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| cnn")]
    cells = {r.split("|")[1].strip() + " " + r.split("|")[2].strip(): r.split("|")[6].strip() for r in rows}
    assert cells == {"cnn base 32": "-0.0008", "cnn k16 128": "+0.0030"}
    assert (tmp_path / "p.png").stat().st_size > 0


def test_recorded_csv_names_a_bad_algorithm(tmp_path):
    csv = tmp_path / "recorded.csv"
    csv.write_text("model,setup,window,seed,algorithm,final_test_auroc\nmlp,hard,256,0,coda,0.9\n")
    with pytest.raises(SystemExit, match="algorithm 'coda' is not one of"):
        _script().recorded(csv)


def test_window_table_compares_each_seed_with_its_own_i1_run(tmp_path, capsys):
    _run(tmp_path, 0, "base_codasca_I1", [0.90])  # I = 1: either method's run is the baseline of both
    _run(tmp_path, 1, "base_codaplus_I1", [0.92])
    for seed, (a, b) in enumerate([(0.91, 0.93), (0.90, 0.95)]):
        _run(tmp_path, seed, "base_codaplus_I8", [a])
        _run(tmp_path, seed, "base_codasca_I8", [b])
    _run(tmp_path, 0, "other_codaplus_I8", [0.5])  # another set-up: not in the table
    module = _script()
    module.cli([str(tmp_path), "--windows", "base", "--windows-plot", str(tmp_path / "w.png")])
    rows = [
        [c.strip() for c in r.strip("|").split("|")]
        for r in capsys.readouterr().out.splitlines()
        if r[:3] == "| 1" or r[:3] == "| 8"
    ]
    assert rows[0] == ["1", "0,1", "0.9100 ± 0.0141", "0.9100 ± 0.0141", "–", "–"]
    # changes per seed: CODA+ +0.01, -0.02; CODASCA +0.03, +0.03
    assert rows[1] == ["8", "0,1", "0.9050 ± 0.0071", "0.9400 ± 0.0141", "-0.0050 ± 0.0212", "+0.0300 ± 0.0000"]
    assert (tmp_path / "w.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no I = 1 run of set-up 'other'"):
        module.cli([str(tmp_path), "--windows", "other"])
