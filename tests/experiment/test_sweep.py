"""Sweeps: expansion and labels, skip / resume on re-run, subprocess jobs, the report."""

from __future__ import annotations

import json
import os
import signal
from typing import ClassVar

import pytest

from fedrisk.errors import FedriskError
from fedrisk.experiment import RunInterrupted, resolve_config, run_experiment
from fedrisk.experiment.report import format_mean_std
from fedrisk.experiment.sweep import SweepInterrupted, expand_sweep, parse_grid, run_sweep, toml_literal

from .conftest import interrupt_at, records, without_time


def test_expand_labels_variants_grid_and_seeds(tiny, tmp_path):
    cfg = resolve_config(tiny)
    pts = expand_sweep(
        cfg,
        tmp_path,
        grid={"algorithm.lr": [0.05, 0.1], "model.output_activation": ["none"]},
        variants={"avg": {"algorithm": {"name": "fedavg"}}, "prox": {"algorithm.name": "fedprox"}},
        seeds=[3, 4],
    )
    assert [str(p.path.relative_to(tmp_path)) for p in pts[:3]] == [
        "avg,algorithm.lr=0.05,model.output_activation=none/seed=3",
        "avg,algorithm.lr=0.05,model.output_activation=none/seed=4",
        "avg,algorithm.lr=0.1,model.output_activation=none/seed=3",
    ]
    assert len(pts) == 8
    last = pts[-1]
    assert last.config["algorithm.name"] == "fedprox" and last.config["algorithm.lr"] == 0.1
    assert last.config["run.seed"] == 4 and last.config["run.seeds"] == []
    assert [str(p.path.relative_to(tmp_path)) for p in expand_sweep(cfg, tmp_path, seeds=[0])] == ["seed=0"]


def test_expand_errors(tiny, tmp_path):
    cfg = resolve_config(tiny)
    with pytest.raises(FedriskError, match=r"sweep: algorithm.lr set both by variant 'a' and by the grid"):
        expand_sweep(cfg, tmp_path, grid={"algorithm.lr": [0.1]}, variants={"a": {"algorithm.lr": 0.2}})
    with pytest.raises(FedriskError, match=r"two points share the directory name 'algorithm.lr=0.1'"):
        expand_sweep(cfg, tmp_path, grid={"algorithm.lr": [0.1, "0.1"]})
    with pytest.raises(FedriskError, match=r"sweep point algorithm.lr=-1 seed=0: \[algorithm\] fedavg: lr = -1"):
        expand_sweep(cfg, tmp_path, grid={"algorithm.lr": [0.1, -1]})


def test_parse_grid_and_literals():
    assert parse_grid(['algorithm.aggregator={name = "mean"},weighted_mean', "run.seed=1"]) == {
        "algorithm.aggregator": [{"name": "mean"}, "weighted_mean"],
        "run.seed": [1],
    }
    assert toml_literal(1.0) == "1.0" and toml_literal(True) == "true" and toml_literal('a"b') == '"a\\"b"'
    with pytest.raises(FedriskError, match=r"--grid expects key=v1,v2"):
        parse_grid(["algorithm.lr=0.1,"])


def test_sequential_sweep_report_skip_and_resume(tiny, tmp_path, monkeypatch, capsys):
    tiny["run"]["rounds"] = 2
    tiny["data"]["validation_fraction"] = 0.2  # each run selects a round on validation_accuracy
    cfg = resolve_config(tiny)
    variants = {"fedavg": {"algorithm.name": "fedavg"}, "fedprox": {"algorithm.name": "fedprox"}}
    out = tmp_path / "sweep"
    # one point was interrupted earlier: the sweep must resume it, not start it again
    point = expand_sweep(cfg, out, variants=variants, seeds=[0, 1])[1]
    with monkeypatch.context() as m:
        interrupt_at(m, 1)
        with pytest.raises(RunInterrupted):
            run_experiment(point.config, point.path, progress="none", seed=point.seed)

    result = run_sweep(cfg, out, variants=variants, seeds=[0, 1], progress="plain")
    assert not result.failed and not result.skipped
    err = capsys.readouterr().err
    assert "[2/4] resuming fedavg seed=1" in err
    assert "[fedavg seed=1] round 2/2 | " in err  # the resumed run's plain progress, labelled
    summaries = {
        name: [json.loads((out / name / f"seed={s}" / "summary.json").read_text()) for s in (0, 1)] for name in variants
    }
    table = result.report.table
    assert table.splitlines()[0] == (
        "| configuration | seeds | rounds | selected test_accuracy | final test_accuracy | selected test_log_loss"
        " | final test_log_loss | selected validation_accuracy | final validation_accuracy"
        " | selected validation_log_loss | final validation_log_loss | selected round | steps/client | samples seen"
        " | MB communicated | wall time (s) |"
    )
    for name in variants:
        selected = [s["selected"]["metrics"]["test_accuracy"] for s in summaries[name]]
        finals = [s["final"]["test_accuracy"] for s in summaries[name]]
        assert f"| {name} | 2 | 2 | {format_mean_std(selected)} | {format_mean_std(finals)} |" in table
    assert (out / "report.md").read_text().count(table) == 1
    assert sorted(p.name for p in result.report.plots) == ["comparison_vs_bytes.png", "comparison_vs_round.png"]
    assert (out / "sweep.toml").is_file()

    # the resumed point equals a fresh run of the same point
    fresh = run_experiment(point.config, tmp_path / "fresh", progress="none", seed=point.seed)
    assert without_time(records(point.path)) == without_time(fresh.history.records)

    # running the sweep again skips everything and reports the same table
    again = run_sweep(cfg, out, variants=variants, seeds=[0, 1], progress="none")
    assert len(again.skipped) == 4 and again.report.table == table


def test_a_signal_as_a_run_finishes_stops_the_sequential_sweep(tiny, tmp_path, monkeypatch):
    """SIGTERM after a point's last round (while its summary is written): that point finishes,
    no further point starts, and the next sweep command runs the rest."""
    import fedrisk.experiment.runner as runner

    tiny["run"]["rounds"] = 2
    cfg = resolve_config(tiny)
    out = tmp_path / "sweep"
    original = runner.make_summary

    def summary_then_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(runner, "make_summary", summary_then_sigterm)
        with pytest.raises(SweepInterrupted, match="SIGTERM received: sweep stopped"):
            run_sweep(cfg, out, seeds=[0, 1, 2], progress="none")
    assert (out / "seed=0" / "summary.json").is_file()
    assert not (out / "seed=1").exists()
    again = run_sweep(cfg, out, seeds=[0, 1, 2], progress="none")
    assert [p.name for p in again.skipped] == ["seed=0"] and not again.failed


def test_parallel_jobs_give_the_same_numbers(tiny, tmp_path):
    tiny["run"]["rounds"] = 2
    cfg = resolve_config(tiny)
    grid = {"algorithm.lr": [0.05, 0.2]}
    par = run_sweep(cfg, tmp_path / "par", grid=grid, seeds=[0], jobs=2, progress="none")
    assert not par.failed, par.failed
    for p in par.points:
        assert (p.path / "sweep.log").is_file()
        seq = run_experiment(p.config, tmp_path / "seq" / p.path.name / p.label, progress="none", seed=p.seed)
        assert without_time(records(p.path)) == without_time(seq.history.records)
    assert "| algorithm.lr=0.05 | 1 | 2 |" in par.report.table  # labelled by the sweep directory


def test_failed_points_are_reported_and_the_rest_runs(tiny, tmp_path):
    tiny["run"]["rounds"] = 2
    tiny["data"]["partition_options"]["max_tries"] = 1
    cfg = resolve_config(tiny)
    # a partition that cannot be made fails when the run is built (a FedriskError at run time)
    grid = {"data.partition_options.min_size": [1, 100000]}
    result = run_sweep(cfg, tmp_path / "s", grid=grid, seeds=[0], progress="none")
    assert [p.label for p, _ in result.failed] == ["data.partition_options.min_size=100000"]
    assert "min_size" in result.failed[0][1]
    assert len(result.report.groups) == 1


class FakeProcess:
    """Stands in for a `python -m fedrisk run` child: runs until it gets a signal."""

    started: ClassVar[list[list[str]]] = []

    def __init__(self, cmd, **kwargs):
        FakeProcess.started.append(cmd)
        self.pid = 1000 + len(FakeProcess.started)
        self.returncode = None
        self.polls = 0

    def poll(self):
        self.polls += 1
        if self.polls == 3 and len(FakeProcess.started) == 2:
            signal.raise_signal(signal.SIGTERM)  # the sweep itself is told to stop
        return self.returncode

    def send_signal(self, signum):
        self.returncode = 128 + signum  # the child checkpoints and exits


def test_parallel_sweep_stops_on_sigterm_and_forwards_it(tiny, tmp_path, monkeypatch):
    import fedrisk.experiment.sweep as sweep_module

    FakeProcess.started = []
    monkeypatch.setattr(sweep_module.subprocess, "Popen", FakeProcess)
    cfg = resolve_config(tiny)
    with pytest.raises(SweepInterrupted) as info:
        run_sweep(cfg, tmp_path / "s", grid={"algorithm.lr": [0.1, 0.2, 0.3]}, seeds=[0], jobs=2, progress="none")
    assert info.value.exit_code == 143
    assert len(FakeProcess.started) == 2  # the third point was not started
    cmd = FakeProcess.started[0]
    assert cmd[1:5] == ["-m", "fedrisk", "run", str(tmp_path / "s" / "sweep.toml")]
    assert cmd[cmd.index("--set") + 1] == "algorithm.lr=0.1"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_real_children_get_sigterm_checkpoint_and_resume_exactly(tiny, tmp_path):
    """Two real ``python -m fedrisk run`` children: SIGTERM to the sweep reaches both, each
    writes its checkpoint and exits 143; running the sweep again resumes them and every point
    ends equal to an uninterrupted run of it."""
    import os
    import threading
    import time

    from fedrisk.experiment import RunDir
    from fedrisk.experiment.outputs import read_jsonl

    tiny["run"].update(rounds=300, eval_every=30)  # long enough that SIGTERM lands mid-run on a fast machine
    cfg = resolve_config(tiny)
    grid = {"algorithm.lr": [0.05, 0.2]}
    out = tmp_path / "s"
    points = expand_sweep(cfg, out, grid=grid, seeds=[0])
    sent: list[float] = []

    def stop_when_both_have_started() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(read_jsonl(p.path / "metrics.jsonl") for p in points):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=stop_when_both_have_started, daemon=True)
    watcher.start()
    with pytest.raises(SweepInterrupted) as info:
        run_sweep(cfg, out, grid=grid, seeds=[0], jobs=2, progress="none")
    watcher.join()
    assert sent and info.value.exit_code == 143
    for p in points:
        assert RunDir(p.path).status() == "checkpointed", (p.path / "sweep.log").read_text()
        assert "SIGTERM received" in (p.path / "sweep.log").read_text()
        assert 0 < len(records(p.path)) < 10  # stopped part-way

    again = run_sweep(cfg, out, grid=grid, seeds=[0], jobs=2, progress="none")
    assert not again.failed, again.failed
    for p in points:
        assert RunDir(p.path).status() == "finished"
        fresh = run_experiment(p.config, tmp_path / "fresh" / p.label, progress="none", seed=p.seed)
        assert without_time(records(p.path)) == without_time(fresh.history.records)
