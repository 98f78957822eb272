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
from fedrisk.experiment.selection import parse_budget, parse_target


def fake_run(
    path: Path,
    algorithm: str,
    seed: int,
    accs: list[float],
    lr: float = 0.1,
    finished: bool = True,
    vals: list[float] | None = None,
    **extra,
) -> Path:
    """A run directory as the runner writes it (only the parts a report reads); with ``vals``,
    a validation accuracy per evaluation that the run selects on (``run.select_by``)."""
    path.mkdir(parents=True)
    config = {
        "data": {"dataset": "digits", "validation_fraction": 0.2 if vals else 0.0},
        "algorithm": {"name": algorithm, "lr": lr},
        "run": {"seed": seed, "seeds": [], "checkpoint_every": seed, "select_by": "auto"},
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
            "steps_per_client": 10 * (i + 1),
            "samples_seen": 100 * (i + 1),
        }
        for i, a in enumerate(accs)
    ]
    for r, v in zip(recs, vals or []):
        r["validation_accuracy"] = v
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
        "| configuration | seeds | rounds | final test_accuracy | final test_log_loss | steps/client | samples seen | "
        "MB communicated | wall time (s) |"
    )
    # fedavg: finals 0.6, 0.7 (mean 0.65, std 0.0707); log loss 0.4, 0.3; 2 evaluations: 20 steps, 200 samples,
    # 3000 bytes, 0.1 s; no validation split: nothing selected, and no "best" (it would be read off the test split)
    assert lines[2] == (
        "| fedavg | 2 | 4 | 0.6500 ± 0.0707 | 0.3500 ± 0.0707 | 20.0 ± 0.0 | 200 ± 0 | 0.00 ± 0.00 | 0.1 ± 0.0 |"
    )
    assert lines[3] == (
        "| scaffold (1 unfinished) | 2 | 4 | 0.6650 ± 0.0212 | 0.3350 ± 0.0212 | 20.0 ± 0.0 | 200 ± 0 | 0.00 ± 0.00 | "
        "0.1 ± 0.0 |"
    )
    assert "No run selects a round on validation" in report.markdown
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


def test_tables_give_test_metrics_at_the_validation_selected_round(tmp_path):
    # validation peaks at the 2nd evaluation (round 4), test at the 3rd (round 6): the table must
    # show the test value of round 4, never 0.9
    fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6, 0.9], vals=[0.5, 0.8, 0.7])
    fake_run(tmp_path / "b", "fedavg", 1, [0.4, 0.7, 0.8], vals=[0.6, 0.6, 0.5])  # tie: the earlier round
    report = make_report([tmp_path], metrics=["test_accuracy"], plots=False)
    head, _, row = report.table.splitlines()
    assert head == (
        "| configuration | seeds | rounds | selected test_accuracy | final test_accuracy | selected round | "
        "steps/client | samples seen | MB communicated | wall time (s) |"
    )
    assert row.startswith(f"| fedavg | 2 | 6 | {format_mean_std([0.6, 0.4])} | {format_mean_std([0.9, 0.8])} | 4/2 |")
    assert "0.9000 ±" not in row.split(" | ")[3]
    assert '"selected" = the round chosen on validation (validation_accuracy' in report.markdown


def test_equal_budget_cuts_take_the_last_evaluation_within_the_budget(tmp_path):
    # evaluations at rounds 2, 4, 6 having used 1500, 3000, 4500 bytes and 10, 20, 30 steps per client
    fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6, 0.7])
    fake_run(tmp_path / "b", "scaffold", 0, [0.2, 0.3, 0.9])
    at = [parse_budget("bytes=3000"), parse_budget("steps=29.9"), parse_budget("bytes=1000")]
    report = make_report([tmp_path], metrics=["test_accuracy"], plots=False, at=at)
    bytes_3000, steps_29, bytes_1000 = (t.split("\n\n", 1)[1].splitlines() for t in report.extra_tables)
    assert bytes_3000[0] == "| configuration | test_accuracy at bytes ≤ 3000 | round | bytes used |"
    assert bytes_3000[2:] == ["| fedavg | 0.6000 | 4 | 3000 |", "| scaffold | 0.3000 | 4 | 3000 |"]  # at = within
    assert steps_29[2:] == ["| fedavg | 0.6000 | 4 | 20.00 |", "| scaffold | 0.3000 | 4 | 20.00 |"]
    assert bytes_1000[2:] == ["| fedavg | – | – | – |", "| scaffold | – | – | – |"]  # not even the first


def test_targets_give_rounds_and_bytes_to_reach_a_value(tmp_path):
    fake_run(tmp_path / "a" / "seed=0", "fedavg", 0, [0.5, 0.6, 0.7])
    fake_run(tmp_path / "a" / "seed=1", "fedavg", 1, [0.65, 0.6, 0.7])
    fake_run(tmp_path / "b" / "seed=0", "scaffold", 0, [0.2, 0.3, 0.4])
    report = make_report([tmp_path], plots=False, targets=[parse_target("test_accuracy=0.6")])
    lines = report.extra_tables[0].split("\n\n", 1)[1].splitlines()
    assert lines[0] == "| configuration | rounds to test_accuracy ≥ 0.6 | MB to test_accuracy ≥ 0.6 | reached |"
    assert lines[2] == "| a | 3.0 ± 1.4 | 0.00 ± 0.00 | 2/2 |"  # rounds 4 and 2
    assert lines[3] == "| b | – | – | 0/1 |"
    loss = make_report([tmp_path], plots=False, targets=[parse_target("test_log_loss=0.36")]).extra_tables[0]
    assert "| a | 4.0 ± 2.8 |" in loss  # losses: the first evaluation at or below (rounds 6 and 2)
    with pytest.raises(FedriskError, match=r"--target: 'validation_auroc' not found in the runs"):
        make_report([tmp_path], plots=False, targets=[parse_target("validation_auroc=0.9")])


@pytest.mark.parametrize("text", ["bytes", "flops=3", "bytes=-1", "steps=many"])
def test_bad_budgets_are_one_line_errors(text):
    with pytest.raises(
        FedriskError, match=r"--at .* is not allowed; allowed: NAME=LIMIT with NAME one of bytes, steps"
    ):
        parse_budget(text)


def test_report_command_prints_the_budget_and_target_tables(tmp_path, capsys):
    from fedrisk.cli import main

    fake_run(tmp_path / "a", "fedavg", 0, [0.5, 0.6, 0.7])
    code = main(["report", str(tmp_path), "--no-plots", "--at", "rounds=4", "--target", "test_accuracy=0.7"])
    out = capsys.readouterr().out
    assert code == 0
    assert "At an equal budget, rounds ≤ 4" in out and "| fedavg | 0.6000 | 0.4000 | 4 | 4 |" in out
    assert "| fedavg | 6.0 | 0.00 | 1/1 |" in out
    assert main(["report", str(tmp_path), "--at", "bytes=lots"]) == 2
    assert "error: --at 'bytes=lots' is not allowed" in capsys.readouterr().err
