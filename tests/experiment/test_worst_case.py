"""The worst case over attacks in ``fedrisk report``: per-seed worst, exact table cells, heat map."""

from __future__ import annotations

import json
from pathlib import Path

import tomli_w

from fedrisk.experiment.report import make_report
from fedrisk.experiment.worst_case import heatmap


def fake_run(path: Path, algorithm: str, attack: str, seed: int, acc: float) -> None:
    path.mkdir(parents=True)
    config = {
        "data": {"dataset": "digits"},
        "algorithm": {"name": algorithm},
        "attack": {"name": attack, "byzantine": [3]},
        "run": {"seed": seed, "seeds": []},
        "output": {"dir": str(path)},
    }
    (path / "config.toml").write_text(tomli_w.dumps(config))
    rec = {"round": 5, "test_accuracy": acc, "bytes_down": 1, "bytes_up": 1, "wall_time": 0.1}
    (path / "metrics.jsonl").write_text(json.dumps({**rec, "round": 1, "test_accuracy": 0.0}) + "\n" + json.dumps(rec))
    (path / "summary.json").write_text(json.dumps({"status": "finished"}))


# method -> attack -> accuracy of seed 0, seed 1
ACC = {
    "frpg": {"ipm": (0.8, 0.7), "max_norm": (0.1, 0.3)},
    "krum": {"ipm": (0.6, 0.5), "max_norm": (0.65, 0.40)},
}


def test_worst_over_attacks_per_seed_and_heat_map(tmp_path: Path) -> None:
    for method, by_attack in ACC.items():
        for attack, accs in by_attack.items():
            for seed, acc in enumerate(accs):
                fake_run(tmp_path / f"{method},attack.name={attack}" / f"seed={seed}", method, attack, seed, acc)
    report = make_report([tmp_path], plots=False)
    lines = report.table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Worst case over attacks"))
    head, rows = lines[start + 2], lines[start + 4 : start + 6]
    assert head == "| method | worst test_accuracy over attacks | worst attack (mean) | ipm | max_norm |"
    # frpg: the worst per seed is max_norm's (0.1, 0.3); krum: seed 0 ipm's 0.6, seed 1 max_norm's 0.4
    assert rows[0] == "| frpg | 0.200 ± 0.141 | max_norm | 0.750 ± 0.071 | 0.200 ± 0.141 |"
    assert rows[1] == "| krum | 0.500 ± 0.141 | max_norm | 0.550 ± 0.071 | 0.525 ± 0.177 |"
    assert not (tmp_path / "worst_case_heatmap.png").exists()


def test_heat_map_is_drawn(tmp_path: Path) -> None:
    values = {(m, a): dict(enumerate(v)) for m, by in ACC.items() for a, v in by.items()}
    path = heatmap(values, "test_accuracy", tmp_path / "h.png")
    assert path.stat().st_size > 1000


def test_one_attack_adds_no_worst_case_section(tmp_path: Path) -> None:
    fake_run(tmp_path / "frpg,attack.name=ipm" / "seed=0", "frpg", "ipm", 0, 0.5)
    fake_run(tmp_path / "krum,attack.name=ipm" / "seed=0", "krum", "ipm", 0, 0.4)
    report = make_report([tmp_path], plots=False)
    assert "Worst case" not in report.table and not (tmp_path / "worst_case_heatmap.png").exists()
