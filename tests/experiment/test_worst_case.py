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
    assert head == "| method | worst test_accuracy over attacks | worst attack (mean) | stopped by | ipm | max_norm |"
    # frpg: the worst per seed is max_norm's (0.1, 0.3); krum: seed 0 ipm's 0.6, seed 1 max_norm's 0.4
    assert rows[0] == "| frpg | 0.200 ± 0.141 | max_norm | – | 0.750 ± 0.071 | 0.200 ± 0.141 |"
    assert rows[1] == "| krum | 0.500 ± 0.141 | max_norm | – | 0.550 ± 0.071 | 0.525 ± 0.177 |"
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
    stopped_run(tmp_path / "sgd,attack.name=ipm" / "seed=0", "sgd", "ipm", 0, "NaN let through")
    report = make_report([tmp_path], plots=False)  # one attack, but a run stopped: say so per method
    assert "| sgd | – | – | ipm | stopped (round 0) |" in report.table.splitlines()


def stopped_run(path: Path, algorithm: str, attack: str, seed: int, message: str) -> None:
    """A run that stopped with an error in round 0: config, empty metrics, failure.json."""
    fake_run(path, algorithm, attack, seed, 0.0)
    (path / "metrics.jsonl").write_text("")
    (path / "summary.json").unlink()
    (path / "failure.json").write_text(json.dumps({"round": 0, "error": message, "type": "ClientFailure"}))


def test_runs_stopped_by_an_error_are_shown_per_method_and_left_out_of_the_worst(tmp_path: Path) -> None:
    """sgd stops under nonfinite in both seeds, krum in seed 1 only: their cells say so, the worst
    case is over the attacks that left a model, and each error is listed under the table."""
    for method, by_attack in ACC.items():
        for attack, accs in by_attack.items():
            for seed, acc in enumerate(accs):
                fake_run(tmp_path / f"{method},attack.name={attack}" / f"seed={seed}", method, attack, seed, acc)
    for seed in (0, 1):
        stopped_run(
            tmp_path / "sgd,attack.name=nonfinite" / f"seed={seed}", "sgd", "nonfinite", seed, "NaN let through"
        )
    fake_run(tmp_path / "sgd,attack.name=ipm" / "seed=0", "sgd", "ipm", 0, 0.3)
    fake_run(tmp_path / "sgd,attack.name=ipm" / "seed=1", "sgd", "ipm", 1, 0.5)
    fake_run(tmp_path / "krum,attack.name=nonfinite" / "seed=0", "krum", "nonfinite", 0, 0.9)
    stopped_run(tmp_path / "krum,attack.name=nonfinite" / "seed=1", "krum", "nonfinite", 1, "krum: n >= 2f + 3")
    report = make_report([tmp_path], plots=True)
    lines = report.table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Worst case over attacks"))
    assert lines[start + 2].endswith("| stopped by | ipm | max_norm | nonfinite |")
    rows = {line.split(" | ")[0][2:]: line for line in lines[start + 4 : start + 7]}
    assert rows["sgd"] == "| sgd | 0.400 ± 0.141 | ipm | nonfinite | 0.400 ± 0.141 | – | stopped (round 0) |"
    assert rows["krum"] == (
        "| krum | 0.500 ± 0.141 | max_norm | nonfinite | 0.550 ± 0.071 | 0.525 ± 0.177 | "
        "0.900; 1 seed(s) stopped (round 0) |"
    )
    assert "- sgd under nonfinite (seeds 0, 1): round 0: NaN let through" in lines
    assert "- krum under nonfinite (seeds 1): round 0: krum: n >= 2f + 3" in lines
    assert (tmp_path / "worst_case_heatmap.png").stat().st_size > 1000


def test_a_run_stopped_by_nonfinite_replies_leaves_failure_json_and_a_rerun_removes_it(tmp_path: Path) -> None:
    """The mean lets NaN replies through: the run stops in round 0 with the error, which
    failure.json keeps for the report; excluding them (median) finishes, leaving no failure.json."""
    import pytest

    from fedrisk.errors import FedriskError
    from fedrisk.experiment.config import load_config
    from fedrisk.experiment.runner import run_experiment

    toml = tmp_path / "c.toml"
    toml.write_text(
        '[data]\ndataset = "digits"\nnum_clients = 6\n[model]\nname = "logreg"\n'
        '[algorithm]\nname = "robust_sgd"\nlr = 0.5\n[attack]\nname = "nonfinite"\nbyzantine = [5]\n'
        "[run]\nrounds = 2\n[output]\nplots = false\n"
    )
    out = tmp_path / "run"
    with pytest.raises(FedriskError, match=r"Byzantine clients \[5\] sent NaN/inf"):
        run_experiment(load_config(toml), out, progress="none")
    failure = json.loads((out / "failure.json").read_text())
    assert failure["round"] == 0 and "Byzantine clients [5]" in failure["error"]
    excluded = load_config(toml, ['algorithm.aggregator = { name = "median", nonfinite = "exclude" }'])
    run_experiment(excluded, out, progress="none", overwrite=True)
    assert not (out / "failure.json").exists() and (out / "summary.json").is_file()
