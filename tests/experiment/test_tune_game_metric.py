"""Tuning and selecting on a game's exact metric (issue 25: tuned FESS-GDA rows of the claims table).

``grad_phi_norm`` (the NC-SC game's ||∇Φ(x)||) and ``generator_error`` (the WGAN's distance to
the true generator) are computed from the server iterate with no data split behind them, so a
study may tune on them and a run may select its round on them; a training metric may not."""

from __future__ import annotations

import json

import pytest

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.outputs import read_jsonl
from fedrisk.experiment.section_rules import check_select_by
from fedrisk.experiment.tune import run_tune, tune_spec

GAME = {
    "data": {"dataset": "nc_sc_quadratic", "partition": "by_attribute", "num_clients": 4, "seed": 0,
             "dataset_options": {"dim": 3, "samples_per_client": 20, "heterogeneity": 1.0, "noise_std": 0.01}},
    "model": {"name": "vector", "num_outputs": 3, "init": 0.5},
    "algorithm": {"name": "fessgda", "game": "quadratic", "dual_dim": 3, "quadratic_mu": 1.0, "lr": 0.05,
                  "lr_dual": 0.1, "local_steps": 3, "batch_size": 5},
    "run": {"rounds": 6, "eval_every": 2, "eval_at_start": True, "splits": [], "dtype": "float64",
            "checkpoint_every": 0, "select_by": "grad_phi_norm"},
}  # fmt: skip


def test_game_metrics_select_and_training_metrics_do_not():
    none = {"validation_fraction": 0.0, "client_validation_fraction": 0.0}
    assert check_select_by("grad_phi_norm", none) == "grad_phi_norm"
    assert check_select_by("generator_error", none) == "generator_error"
    with pytest.raises(FedriskError, match=r"validation metric.*game metric \(generator_error, grad_phi_norm\)"):
        check_select_by("train_loss", none)
    cfg = resolve_config(GAME)
    with pytest.raises(FedriskError, match="exact game metric"):
        tune_spec(cfg, space=["algorithm.lr=log:1e-3:0.1"], metric="train_loss")


def test_a_study_tunes_on_the_exact_metric_and_each_trial_reports_its_best_iterate(tmp_path):
    cfg = resolve_config(GAME)
    spec = tune_spec(cfg, space=["algorithm.lr=log:1e-3:0.1", "algorithm.beta=float:0.05:0.9"], trials=2,
                     metric="grad_phi_norm", pruner="none")  # fmt: skip
    assert spec.direction == "minimize"
    result = run_tune(cfg, tmp_path / "study", spec, plots=False)
    values = []
    for n in range(2):
        trial = tmp_path / "study" / "trials" / f"{n:03d}"
        records = read_jsonl(trial / "metrics.jsonl")
        best = min(records, key=lambda r: (r["grad_phi_norm"], r["round"]))  # a plain loop, not the Selector
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["selected"]["selected_by"] == "grad_phi_norm"
        assert summary["selected"]["round"] == best["round"]
        values.append(best["grad_phi_norm"])
    assert result.best_value == pytest.approx(min(values))
