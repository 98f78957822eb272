"""Experiment tracking with the real libraries: TensorBoard event files read back with
TensorBoard's EventAccumulator, MLflow runs read back through MlflowClient."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config, run_experiment
from fedrisk.experiment.tracking import MLFLOW_RUN_ID, scalars

from .conftest import interrupt_at, records

pytest.importorskip("tensorboard", reason="the tracking extra (scripts/setup.sh installs it)")
pytest.importorskip("mlflow", reason="the tracking extra (scripts/setup.sh installs it)")


def event_scalars(log_dir) -> tuple[dict[str, list[tuple[int, float]]], list[str]]:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()
    values = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    return values, tags["tensors"]


def mlflow_run(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    return client, runs


def test_tensorboard_and_mlflow_hold_every_evaluation_and_the_config(tiny, tmp_path):
    tiny["output"].update({"tensorboard": True, "mlflow": True, "mlflow_experiment": "tiny"})
    tiny["run"]["eval_at_start"] = True
    out = tmp_path / "run"
    run_experiment(resolve_config(tiny), out, progress="none")
    recs = records(out)
    assert [r["round"] for r in recs] == [0, 1, 2, 3, 4]

    tb, tensors = event_scalars(out / "tensorboard")
    assert "config/text_summary" in tensors
    assert set(tb) == set(scalars(recs[-1]))  # every numeric value, train_loss included
    for name, points in tb.items():
        want = [(r["round"], float(r[name])) for r in recs if name in r]
        assert [s for s, _ in points] == [s for s, _ in want], name
        assert [v for _, v in points] == pytest.approx([v for _, v in want], rel=1e-6), name  # stored as float32

    client, runs = mlflow_run((out / "mlruns").resolve().as_uri(), "tiny")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_id == (out / MLFLOW_RUN_ID).read_text().strip()
    assert run.info.run_name == "run" and run.data.tags["fedrisk.seed"] == "0"
    assert run.data.params["algorithm.name"] == "fedavg" and run.data.params["algorithm.lr"] == "0.1"
    assert run.data.params["data.num_clients"] == "3"
    for name in scalars(recs[-1]):
        hist = client.get_metric_history(run.info.run_id, name)
        want = [(r["round"], float(r[name])) for r in recs if name in r]
        assert sorted((m.step, m.value) for m in hist) == want, name  # MLflow keeps doubles exactly
    config = (out / "mlruns").rglob("config.toml")
    assert [p.read_text() for p in config] == [(out / "config.toml").read_text()]


def test_tracking_uri_and_default_experiment_name(tiny, tmp_path):
    """A given tracking URI is used instead of DIR/mlruns; the experiment defaults to the config's name."""
    from fedrisk.experiment import load_config

    store = (tmp_path / "shared-store").as_uri()
    tiny["output"].update({"mlflow": True, "mlflow_tracking_uri": store})
    tiny["run"]["rounds"] = 2
    path = tmp_path / "my_exp.toml"
    import tomli_w

    path.write_text(tomli_w.dumps(tiny))
    for seed in (0, 1):
        run_experiment(load_config(path).with_overrides({"run.seed": seed}), tmp_path / f"s{seed}", progress="none")
    assert not (tmp_path / "s0" / "mlruns").exists()
    assert not (tmp_path / "s0" / "tensorboard").exists()  # tensorboard stays off
    _, runs = mlflow_run(store, "my_exp")
    assert sorted(r.data.tags["fedrisk.seed"] for r in runs) == ["0", "1"]


def test_resume_continues_the_same_mlflow_run_and_purges_tensorboard(tiny, tmp_path, monkeypatch):
    from fedrisk.experiment import RunInterrupted

    tiny["output"].update({"tensorboard": True, "mlflow": True, "mlflow_experiment": "e"})
    tiny["run"]["checkpoint_every"] = 1
    cfg = resolve_config(tiny)
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        interrupt_at(m, 2)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, out, progress="none")
    client, runs = mlflow_run((out / "mlruns").resolve().as_uri(), "e")
    assert [r.info.status for r in runs] == ["KILLED"]
    run_experiment(cfg, out, resume=True, progress="none")
    client, runs = mlflow_run((out / "mlruns").resolve().as_uri(), "e")
    assert [r.info.status for r in runs] == ["FINISHED"]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "test_accuracy")]
    assert sorted(steps) == [1, 2, 3, 4]
    tb, _ = event_scalars(out / "tensorboard")
    assert [s for s, _ in tb["test_accuracy"]] == [1, 2, 3, 4]
    # --overwrite: the old event files go, a second MLflow run starts
    run_experiment(cfg, out, overwrite=True, progress="none")
    tb, _ = event_scalars(out / "tensorboard")
    assert [s for s, _ in tb["test_accuracy"]] == [1, 2, 3, 4]
    assert len(mlflow_run((out / "mlruns").resolve().as_uri(), "e")[1]) == 2


def test_bad_tracking_options_are_clear(tiny):
    tiny["output"]["tensorboard"] = "yes"
    with pytest.raises(FedriskError, match=r"output\.tensorboard"):
        resolve_config(tiny)
    tiny["output"] = {"mlfow": True}
    with pytest.raises(FedriskError, match="mlflow"):
        resolve_config(tiny)


def test_a_missing_package_names_the_extra(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow -> ImportError
    tiny["output"]["mlflow"] = True
    with pytest.raises(FedriskError, match=r"output\.mlflow = true needs the package 'mlflow'.*fedrisk\[tracking\]"):
        run_experiment(resolve_config(tiny), tmp_path / "run", progress="none")
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    tiny["output"] = {"tensorboard": True, "plots": False}
    with pytest.raises(FedriskError, match=r"output\.tensorboard = true needs the package 'tensorboard'"):
        run_experiment(resolve_config(tiny), tmp_path / "run2", progress="none")


def test_the_runner_imports_no_tracking_library_unless_asked():
    code = (
        "import sys; from fedrisk.experiment import resolve_config, run_experiment; import tempfile;"
        "cfg = resolve_config({'data': {'dataset': 'digits', 'num_clients': 2}, 'run': {'rounds': 1},"
        " 'output': {'plots': False}});"
        "run_experiment(cfg, tempfile.mkdtemp(), progress='none');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'tensorboard')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
