"""Reports over hand-written run directories: grouping, labels, exact table values, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tomli_w

from fedrisk.errors import FedriskError
from fedrisk.experiment.outputs import load_run
from fedrisk.experiment.report import format_mean_std, group_curve, group_runs, make_report, mean_std


def fake_run(
    path: Path, algorithm: str, seed: int, accs: list[float], lr: float = 0.1, finished: bool = True, **extra
) -> Path:
    """A run directory as the runner writes it (only the parts a report reads)."""
    path.mkdir(parents=True)
    config = {
        "data": {"dataset": "digits"},
        "algorithm": {"name": algorithm, "lr": lr},
        "run": {"seed": seed, "seeds": [], "checkpoint_every": seed},
        "output": {"dir": str(path)},
    }
    config["algorithm"].update(extra)
    (path / "config.toml").write_text(tomli_w.dumps(config))
    recs = [
        {
            "round": 2 * (i + 1),
            "test_accuracy": a,
            "test_log_loss": 1 - a,
            "bytes_down": 1000 * (i + 1),
            "bytes_up": 500 * (i + 1),
            "wall_time": 0.1 * i,
        }
        for i, a in enumerate(accs)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    if finished:
        (path / "summary.json").write_text(json.dumps({"status": "finished"}))
    return path


def test_mean_std():
    assert mean_std([2.0]) == (2.0, 0.0)
    m, s = mean_std([1.0, 2.0, 4.0])
    assert m == pytest.approx(7 / 3) and s == pytest.approx(
        math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    )
    assert format_mean_std([0.5, 0.7]) == "0.6000 ± 0.1414" and format_mean_std([]) == "–"


def test_table_groups_by_config_minus_seed(tmp_path):
    fake_run(tmp_path / "a0", "fedavg", 0, [0.5, 0.6])
    fake_run(tmp_path / "a1", "fedavg", 1, [0.55, 0.7])
    fake_run(tmp_path / "b0", "scaffold", 0, [0.6, 0.65])
    fake_run(tmp_path / "b1", "scaffold", 1, [0.7, 0.68], finished=False)
    report = make_report([tmp_path], metrics=["test_accuracy", "test_log_loss"])
    lines = report.table.splitlines()
    assert lines[0] == (
        "| configuration | seeds | rounds | final test_accuracy | best test_accuracy | final test_log_loss | "
        "best test_log_loss | MB communicated |"
    )
    # fedavg: finals 0.6, 0.7 (mean 0.65, std 0.0707); best = finals; log loss 0.4, 0.3
    assert lines[2] == (
        "| fedavg | 2 | 4 | 0.6500 ± 0.0707 | 0.6500 ± 0.0707 | 0.3500 ± 0.0707 | 0.3500 ± 0.0707 | 0.00 ± 0.00 |"
    )
    # scaffold: finals 0.65, 0.68; bests 0.65, 0.70 (max); best log loss = min: 0.35, 0.30
    assert lines[3] == (
        "| scaffold (1 unfinished) | 2 | 4 | 0.6650 ± 0.0212 | 0.6750 ± 0.0354 | 0.3350 ± 0.0212 | "
        "0.3250 ± 0.0354 | 0.00 ± 0.00 |"
    )
    assert (tmp_path / "report.md").read_text().startswith("# fedrisk report\n\n4 run(s) in 2 configuration(s)")
    assert {p.name for p in report.plots} == {"comparison_vs_round.png", "comparison_vs_bytes.png"}


def test_labels_name_the_differing_keys_and_curves_average_seeds(tmp_path):
    fake_run(tmp_path / "x" / "r0", "fedavg", 0, [0.5, 0.6], lr=0.1)
    fake_run(tmp_path / "x" / "r1", "fedavg", 1, [0.7, 0.8], lr=0.1)
    fake_run(tmp_path / "y" / "r0", "fedavg", 0, [0.1, 0.2], lr=0.3)
    groups = group_runs([load_run(p) for p in sorted((tmp_path).glob("*/r*"))])
    assert [g.label for g in groups] == ["lr=0.1", "lr=0.3"]
    curve = group_curve(groups[0], ["test_accuracy"])
    assert curve.rounds == [2, 4] and curve.megabytes == [0.0015, 0.003]
    assert curve.values["test_accuracy"][0] == pytest.approx([0.6, 0.7])


def test_labels_leave_out_keys_only_one_algorithm_has(tmp_path):
    fake_run(tmp_path / "a", "fedavg", 0, [0.5], weighting="samples")
    fake_run(tmp_path / "b", "scaffold", 0, [0.6], control_option="II", lr=0.2)
    report = make_report([tmp_path], plots=False)
    assert [g.label for g in report.groups] == ["fedavg, lr=0.1", "scaffold, lr=0.2"]


def test_sweep_layout_labels_use_the_directory_name(tmp_path):
    fake_run(tmp_path / "fast" / "seed=0", "fedavg", 0, [0.5], lr=0.3)
    fake_run(tmp_path / "slow" / "seed=0", "fedavg", 0, [0.4], lr=0.01)
    report = make_report([tmp_path / "fast", tmp_path / "slow"], plots=False)
    assert [g.label for g in report.groups] == ["fast", "slow"]
    assert report.path == tmp_path / "report.md"  # the common parent of several paths


def test_unknown_metric_is_refused(tmp_path):
    fake_run(tmp_path / "a", "fedavg", 0, [0.5])
    with pytest.raises(FedriskError, match=r"--metrics: 'auroc' not found in the runs; available: test_accuracy"):
        make_report([tmp_path], metrics=["auroc"])
