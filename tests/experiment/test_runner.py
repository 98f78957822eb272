"""The runner: outputs, checkpoints, exact resume after SIGTERM / SIGINT / a crash, and the
refusals around run directories."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment import RunDir, RunInterrupted, load_config, resolve_config, run_experiment
from fedrisk.experiment.progress import Progress
from fedrisk.experiment.runner import SignalGuard, build_simulation, load_checkpoint

from .conftest import crash_at, interrupt_at, records, without_time


def test_run_writes_every_output(tiny, tmp_path):
    tiny["output"]["plots"] = True
    cfg = resolve_config(tiny)
    result = run_experiment(cfg, tmp_path / "run", progress="none")
    rd = RunDir(result.path)
    recs = records(rd.path)
    assert [r["round"] for r in recs] == [1, 2, 3, 4]
    expected_keys = ["round", "test_accuracy", "test_log_loss", "bytes_down", "bytes_up", "wall_time", "train_loss"]
    assert list(recs[0]) == [*expected_keys, "steps_per_client", "samples_seen"]
    # every client takes 3 local steps of 16 rows per round
    assert [(r["steps_per_client"], r["samples_seen"]) for r in recs] == [(3 * t, 3 * 3 * 16 * t) for t in (1, 2, 3, 4)]
    # 3 clients x 650 float32 parameters of logreg(64 -> 10) down and up every round
    assert [r["bytes_down"] for r in recs] == [3 * 650 * 4 * k for k in (1, 2, 3, 4)]
    assert recs[-1]["bytes_up"] == recs[-1]["bytes_down"]
    summary = json.loads(rd.summary.read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 4
    assert summary["final"] == {k: recs[-1][k] for k in ("test_accuracy", "test_log_loss", "train_loss")}
    assert summary["budget"] == {
        "rounds": 4,
        "steps_per_client": 12.0,
        "samples_seen": 576,
        "bytes": 2 * recs[-1]["bytes_down"],
        "wall_time": recs[-1]["wall_time"],
    }
    best = max(recs, key=lambda r: r["test_accuracy"])
    assert summary["oracle"]["test_accuracy"]["value"] == best["test_accuracy"]
    assert summary["selected"] is None  # no validation split: nothing to select on
    assert summary["resolved"]["num_outputs"] == 10 and summary["resolved"]["objective"] == "cross_entropy"
    assert load_config(rd.config).semantic() == cfg.semantic()
    part = json.loads(rd.partition_json.read_text())
    fed = build_simulation(cfg).simulation.federation
    assert part["counts"] == fed.class_counts() and sum(part["sizes"]) == sum(fed.client_sizes)
    assert rd.partition_md.read_text().startswith("# Partition: digits-dirichlet-K3")
    ckpt = load_checkpoint(rd.checkpoint)
    assert ckpt["round"] == 4 and len(ckpt["history"]) == 4
    assert sorted(p.name for p in rd.plots.iterdir()) == ["metrics_vs_bytes.png", "metrics_vs_round.png"]
    assert not [p for p in rd.path.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave no temp files


def test_auto_metrics_and_one_output_scorer(tmp_path):
    raw = {
        "data": {"dataset": "breast_cancer", "num_clients": 2},
        "algorithm": {"name": "codaplus", "stage_iters": 4, "lr": 0.05},
        "run": {"rounds": 2, "threads": 1},
        "output": {"plots": False},
    }
    result = run_experiment(resolve_config(raw), tmp_path / "auc", progress="none")
    assert result.summary["resolved"]["num_outputs"] == 1  # AUC algorithms train a scorer
    assert sorted(result.summary["final"]) == ["test_auprc", "test_auroc", "train_loss"]


@pytest.mark.parametrize(
    ("overrides", "stop", "signum"),
    [
        ([], 2, signal.SIGTERM),  # an evaluation round
        (["run.eval_every=3", "run.rounds=7"], 4, signal.SIGINT),  # between evaluations
        (["run.eval_every=3", "run.rounds=7"], 3, signal.SIGTERM),  # an evaluation round
        (["algorithm.name=scaffold", "algorithm.clients_per_round=2", "run.rounds=5"], 3, signal.SIGTERM),
    ],
)
def test_interrupted_and_resumed_run_equals_uninterrupted(tiny, tmp_path, monkeypatch, overrides, stop, signum):
    cfg = resolve_config(tiny, overrides)
    full = run_experiment(cfg, tmp_path / "full", progress="none")

    with monkeypatch.context() as m:
        interrupt_at(m, stop, signum)
        with pytest.raises(RunInterrupted) as info:
            run_experiment(cfg, tmp_path / "part", progress="none")
    assert info.value.round == stop and info.value.exit_code == 128 + signum
    assert f"stopped after round {stop}; checkpoint written to {tmp_path / 'part' / 'checkpoint.pt'}" in str(info.value)
    assert RunDir(tmp_path / "part").status() == "checkpointed"
    assert load_checkpoint(tmp_path / "part" / "checkpoint.pt")["round"] == stop
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored

    resumed = run_experiment(cfg, tmp_path / "part", resume=True, progress="none")
    assert without_time(records(tmp_path / "part")) == without_time(records(tmp_path / "full"))
    assert without_time(resumed.history.records) == without_time(full.history.records)
    a = load_checkpoint(tmp_path / "full" / "checkpoint.pt")["simulation"]
    b = load_checkpoint(tmp_path / "part" / "checkpoint.pt")["simulation"]
    for key in a["server_state"]["params"]:
        assert torch.equal(a["server_state"]["params"][key], b["server_state"]["params"][key])
    assert a["ledger"] == b["ledger"]


def test_resume_after_a_crash_uses_the_last_periodic_checkpoint(tiny, tmp_path, monkeypatch):
    cfg = resolve_config(tiny, ["run.rounds=6", "run.checkpoint_every=2"])
    run_experiment(cfg, tmp_path / "full", progress="none")
    with monkeypatch.context() as m:
        crash_at(m, 5)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_experiment(cfg, tmp_path / "part", progress="none")
    assert len(records(tmp_path / "part")) == 4  # evaluations 1-4 were written before the crash
    assert load_checkpoint(tmp_path / "part" / "checkpoint.pt")["round"] == 4
    run_experiment(cfg, tmp_path / "part", resume=True, progress="none")
    assert without_time(records(tmp_path / "part")) == without_time(records(tmp_path / "full"))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["run.checkpoint_seconds=0"], [6]),  # only at the end
        (["run.checkpoint_seconds=1e-9"], [1, 2, 3, 4, 5, 6]),  # every round takes longer than 1 ns
        (["run.checkpoint_seconds=3600", "run.checkpoint_every=2"], [2, 4, 6]),  # the round interval
        ([], [6]),  # the default: at most every 30 s (a tiny run takes less) and at the end
    ],
)
def test_checkpoints_by_wall_clock_and_round_intervals(tiny, tmp_path, monkeypatch, options, expected):
    from fedrisk.experiment import callbacks

    written: list[int] = []
    save = callbacks.save_checkpoint

    def recording_save(path, sim, *args):
        written.append(sim.round)
        save(path, sim, *args)

    monkeypatch.setattr(callbacks, "save_checkpoint", recording_save)
    tiny["run"].pop("checkpoint_every")
    cfg = resolve_config(tiny, ["run.rounds=6", *options])
    run_experiment(cfg, tmp_path / "r", progress="none")
    assert written == expected


def test_resume_refuses_a_different_config_naming_the_keys(tiny, tmp_path, monkeypatch):
    cfg = resolve_config(tiny)
    with monkeypatch.context() as m:
        interrupt_at(m, 1)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "r", progress="none")
    other = resolve_config(tiny, ["algorithm.lr=0.2", "data.num_clients=4", "run.checkpoint_every=1"])
    with pytest.raises(FedriskError) as info:
        run_experiment(other, tmp_path / "r", resume=True, progress="none")
    msg = str(info.value)
    assert msg.startswith(f"the config differs from the checkpoint's in {tmp_path / 'r'}: ")
    assert "algorithm.lr (checkpoint: 0.1, now: 0.2)" in msg and "data.num_clients (checkpoint: 3, now: 4)" in msg
    assert "checkpoint_every" not in msg  # keys that do not change the numbers may differ
    # the run directory was left as it was
    assert RunDir(tmp_path / "r").status() == "checkpointed"


def test_run_directory_refusals(tiny, tmp_path, monkeypatch):
    cfg = resolve_config(tiny, ["run.rounds=2"])
    d = tmp_path / "d"
    with pytest.raises(FedriskError, match=r"holds no checkpoint \(checkpoint.pt\); nothing to resume"):
        run_experiment(cfg, d, resume=True, progress="none")
    run_experiment(cfg, d, progress="none")
    with pytest.raises(FedriskError, match=r"already holds a finished run; choose another --out or pass --overwrite"):
        run_experiment(cfg, d, progress="none")
    with pytest.raises(FedriskError, match=r"holds a finished run; nothing to resume \(use --overwrite"):
        run_experiment(cfg, d, resume=True, progress="none")
    with pytest.raises(FedriskError, match=r"--resume and --overwrite exclude each other"):
        run_experiment(cfg, d, resume=True, overwrite=True, progress="none")
    (d / "notes.txt").write_text("mine")
    again = run_experiment(cfg, d, overwrite=True, progress="none")
    assert (d / "notes.txt").read_text() == "mine"  # --overwrite removes only the run's own files
    assert len(again.history.records) == 2

    with monkeypatch.context() as m:
        interrupt_at(m, 1)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "i", progress="none")
    with pytest.raises(FedriskError, match=r"holds an interrupted run with a checkpoint; continue it with --resume"):
        run_experiment(cfg, tmp_path / "i", progress="none")
    with monkeypatch.context() as m:
        crash_at(m, 1)
        with pytest.raises(RuntimeError):
            run_experiment(cfg, tmp_path / "c", progress="none")
    with pytest.raises(FedriskError, match=r"holds an unfinished run without a checkpoint; pass --overwrite"):
        run_experiment(cfg, tmp_path / "c", progress="none")


def test_damaged_checkpoint_is_a_user_error(tiny, tmp_path, monkeypatch):
    cfg = resolve_config(tiny)
    with monkeypatch.context() as m:
        interrupt_at(m, 1)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "r", progress="none")
    (tmp_path / "r" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(FedriskError, match=r"no usable checkpoint: .*checkpoint.pt is not a fedrisk checkpoint"):
        run_experiment(cfg, tmp_path / "r", resume=True, progress="none")


def test_second_sigint_stops_at_once():
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job
    with SignalGuard() as guard:
        signal.raise_signal(signal.SIGINT)
        assert guard.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_threads_setting_is_restored(tiny, tmp_path, monkeypatch):
    """The run uses ``run.threads`` and puts back the caller's setting (the conftest sets one
    thread, so the caller here uses two and the run one)."""
    seen = []
    original = Progress.on_round_end

    def hook(self, sim, report):
        seen.append(torch.get_num_threads())
        original(self, sim, report)

    monkeypatch.setattr(Progress, "on_round_end", hook)
    torch.set_num_threads(2)
    run_experiment(resolve_config(tiny, ["run.rounds=1", "run.threads=1"]), tmp_path / "t", progress="none")
    assert seen == [1]
    assert torch.get_num_threads() == 2
