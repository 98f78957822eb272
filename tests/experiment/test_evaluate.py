"""``fedrisk evaluate RUN`` (the saved selected / final model on a split or other data) and
``fedrisk run --variant`` (issue 24)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from fedrisk.cli import main
from fedrisk.experiment.scoring import evaluate_run

from .conftest import TINY, records, write_config


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


@pytest.fixture
def selecting(tmp_path):
    """A finished 4-round run selecting on validation_accuracy, with per-client test splits."""
    raw = copy.deepcopy(TINY)
    raw["data"].update({"validation_fraction": 0.3, "client_test_fraction": 0.2})
    raw["algorithm"]["lr"] = 0.5
    raw["run"].update({"metrics": ["accuracy"], "select_by": "validation_accuracy"})
    config = write_config(tmp_path / "sel.toml", raw)
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    return tmp_path / "run", raw


def test_evaluate_scores_the_selected_model_as_the_run_did_at_that_round(selecting, capsys) -> None:
    run, _ = selecting
    summary = json.loads((run / "summary.json").read_text())
    at = next(r for r in records(run) if r["round"] == summary["selected"]["round"])
    assert at["round"] < records(run)[-1]["round"]  # the selected model is not the final one
    scored = evaluate_run(run)  # the test split of the run's own data
    assert scored.round == at["round"] and scored.selected_by == "validation_accuracy"
    assert scored.metrics["test_accuracy"] == at["test_accuracy"]
    assert scored.metrics["personal_accuracy_mean"] == at["personal_accuracy_mean"]
    val = evaluate_run(run, split="validation")
    assert val.metrics == {"validation_accuracy": at["validation_accuracy"]}
    final = evaluate_run(run, model="final")
    assert final.round is None and final.metrics["test_accuracy"] == records(run)[-1]["test_accuracy"]
    code, out, _ = run_cli(capsys, "evaluate", run, "--split", "validation")
    assert code == 0 and out.startswith(
        f"selected model of {run} (round {at['round']}, selected by validation_accuracy)"
    )
    assert "| validation_accuracy |" in out


def test_evaluate_on_the_data_of_another_config(selecting, tmp_path) -> None:
    run, raw = selecting
    other = copy.deepcopy(raw)
    other["data"] = {"dataset": "digits", "num_clients": 5, "partition": "iid", "client_test_fraction": 0.5}
    other["run"]["select_by"] = "none"
    scored = evaluate_run(run, config=write_config(tmp_path / "other.toml", other))
    assert scored.data == "digits-iid-K5"
    # an independent check: the saved parameters' accuracy on that test split, computed here
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.runner import build_simulation

    sim = build_simulation(resolve_config(other)).simulation
    params = torch.load(run / "selected.pt", weights_only=True)["global"]
    logits = sim.federation.test.x @ params["linear.weight"].T + params["linear.bias"]
    expected = (logits.argmax(1) == sim.federation.test.y).double().mean().item()
    assert scored.metrics["test_accuracy"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"dataset": "wine", "num_clients": 2}}, "does not fit the model built for these data"),
        ({"data": {"dataset": "digits", "num_clients": 2}, "split": "validation"}, "--split validation: the data"),
        ({"model": "final", "split": "nonsense"}, "--split 'nonsense' is not allowed; allowed: test, validation"),
    ],
)
def test_evaluate_bad_input_is_one_line(selecting, tmp_path, capsys, change, message) -> None:
    run, _ = selecting
    argv = ["evaluate", str(run)]
    if "data" in change:
        argv += ["--config", str(write_config(tmp_path / "o.toml", {"data": change["data"]}))]
    if "split" in change and change["split"] != "nonsense":
        argv += ["--split", change["split"]]
    if change.get("split") == "nonsense":
        with pytest.raises(Exception, match=message):
            evaluate_run(run, split="nonsense")
        return
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1


def test_evaluate_without_a_selected_model_says_to_use_the_final_one(tmp_path, capsys) -> None:
    config = write_config(tmp_path / "t.toml", copy.deepcopy(TINY))  # no validation split: nothing selected
    assert main(["run", str(config), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    capsys.readouterr()
    code, _, err = run_cli(capsys, "evaluate", tmp_path / "r")
    assert code == 2 and "selected.pt does not exist: the run selected no round" in err and "--model final" in err
    code, out, _ = run_cli(capsys, "evaluate", tmp_path / "r", "--model", "final")
    assert code == 0 and "final model of" in out


def test_run_variant_picks_one_and_without_it_says_it_runs_the_base(tmp_path, capsys) -> None:
    raw = copy.deepcopy(TINY)
    raw["run"]["rounds"] = 1
    raw["sweep"] = {"variants": {"prox": {"algorithm.name": "fedprox", "algorithm.mu": 0.1}}}
    config = write_config(tmp_path / "v.toml", raw)
    code, _, err = run_cli(capsys, "run", config, "--out", tmp_path / "base", "--quiet")
    assert code == 0 and "defines sweep variants prox; running the base config" in err
    assert json.loads((tmp_path / "base" / "summary.json").read_text())["algorithm"] == "fedavg"
    code, _, err = run_cli(capsys, "run", config, "--variant", "prox", "--out", tmp_path / "prox", "--quiet")
    assert code == 0 and "running the base" not in err
    assert json.loads((tmp_path / "prox" / "summary.json").read_text())["algorithm"] == "fedprox"
    code, _, err = run_cli(capsys, "run", config, "--variant", "scaffold", "--out", tmp_path / "x", "--quiet")
    assert code == 2 and "--variant 'scaffold' is not a variant of the config; allowed: prox" in err


def test_evaluate_scores_a_gpu_run_on_a_machine_without_one(selecting, monkeypatch) -> None:
    run, _ = selecting
    expected = evaluate_run(run).metrics
    config = run / "config.toml"
    text = config.read_text()
    assert 'device = "cpu"' in text
    config.write_text(text.replace('device = "cpu"', 'device = "cuda"'))  # as a run on a GPU machine wrote it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluate_run(run).metrics == expected
