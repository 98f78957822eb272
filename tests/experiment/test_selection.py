"""Per-client validation splits, model selection on validation (``run.select_by``) and the
budgets every record carries (issue 24)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from fedrisk.data import build_federation
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import RunInterrupted, run_experiment

from .conftest import TINY, interrupt_at, records

# binarised digits scored by AUROC, with a global validation split; at lr 0.3 and seed 1 the
# validation optimum (round 5) and the test optimum (round 6) differ (checked below)
SELECT = copy.deepcopy(TINY)
SELECT["data"].update({"validation_fraction": 0.3, "binarize": {"positive_classes": [5, 6, 7, 8, 9]}})
SELECT["model"]["num_outputs"] = 1
SELECT["algorithm"]["lr"] = 0.3
SELECT["run"].update({"rounds": 6, "metrics": ["auroc"], "seed": 1, "select_by": "validation_auroc"})


def _rows(x: torch.Tensor) -> list[tuple[float, ...]]:
    return sorted(tuple(r) for r in x.reshape(len(x), -1).tolist())


def test_client_validation_splits_are_disjoint_stratified_and_leave_the_test_rows_alone() -> None:
    opts = dict(partition_options={"alpha": 0.5, "min_size": 20}, seed=3, client_test_fraction=0.2)
    base = build_federation("digits", "dirichlet", 4, **opts)
    fed = build_federation("digits", "dirichlet", 4, client_validation_fraction=0.25, **opts)
    assert fed.client_validations is not None and len(fed.client_validations) == 4
    for k in range(4):
        train, val, test = fed.clients[k], fed.client_validations[k], fed.client_tests[k]
        # the client's training rows without validation are exactly its rows without it: a partition
        assert _rows(torch.cat([train.x, val.x])) == _rows(base.clients[k].x)
        assert torch.equal(test.x, base.client_tests[k].x) and torch.equal(test.y, base.client_tests[k].y)
        # stratified: class c with n_c rows gives round(0.25 n_c) validation rows, one left to train
        counts = torch.bincount(base.clients[k].y, minlength=10).tolist()
        expected = [min(round(0.25 * n), n - 1) if n else 0 for n in counts]
        assert torch.bincount(val.y, minlength=10).tolist() == expected
    assert fed.info["client_validation_sizes"] == [len(v) for v in fed.client_validations]
    # seeded by the run's seed: another seed draws other rows
    other = build_federation("digits", "dirichlet", 4, client_validation_fraction=0.25, **{**opts, "seed": 4})
    assert _rows(other.client_validations[0].x) != _rows(fed.client_validations[0].x)


def test_a_client_validation_fraction_that_leaves_a_client_empty_names_it() -> None:
    with pytest.raises(FedriskError, match=r"client_validation_fraction = 0.005 leaves client \d+ .* 0 validation"):
        build_federation("digits", "iid", 3, seed=0, client_validation_fraction=0.005)


def test_per_client_validation_metrics_are_recorded_and_selectable(tmp_path) -> None:
    raw = copy.deepcopy(TINY)
    raw["data"].update({"client_validation_fraction": 0.3, "client_test_fraction": 0.2})
    raw["run"].update({"rounds": 3, "metrics": ["accuracy"], "select_by": "personal_accuracy_mean"})
    result = run_experiment(resolve_config(raw), tmp_path / "run", progress="none")
    recs = records(tmp_path / "run")
    for stat in ("mean", "wmean", "std", "bottom10", "worst"):
        assert f"validation_personal_accuracy_{stat}" in recs[0] and f"personal_accuracy_{stat}" in recs[0]
    top = max(range(3), key=lambda i: (recs[i]["validation_personal_accuracy_mean"], -i))
    assert result.summary["selected"]["round"] == recs[top]["round"]
    assert result.summary["selected"]["selected_by"] == "validation_personal_accuracy_mean"


def test_selection_picks_the_validation_best_round_not_the_test_best(tmp_path) -> None:
    cfg = resolve_config(SELECT)
    result = run_experiment(cfg, tmp_path / "run", progress="none")
    recs = records(tmp_path / "run")
    best_val, best_test = None, None  # a plain transcription: first strict maximum of each
    for r in recs:
        if best_val is None or r["validation_auroc"] > best_val["validation_auroc"]:
            best_val = r
        if best_test is None or r["test_auroc"] > best_test["test_auroc"]:
            best_test = r
    assert best_val["round"] != best_test["round"]  # the case this test is about
    sel = result.summary["selected"]
    assert sel["round"] == best_val["round"] and sel["value"] == best_val["validation_auroc"]
    assert sel["metrics"]["test_auroc"] == best_val["test_auroc"] != best_test["test_auroc"]
    assert sel["budget"]["rounds"] == best_val["round"]
    assert result.summary["oracle"]["test_auroc"]["round"] == best_test["round"]  # kept, apart
    # the saved model is the model of the selected round: a run stopped there ends with it
    saved = torch.load(tmp_path / "run" / "selected.pt", weights_only=True)
    assert saved["round"] == best_val["round"] and saved["selected_by"] == "validation_auroc"
    short = run_experiment(cfg.with_overrides({"run.rounds": best_val["round"]}), tmp_path / "short", progress="none")
    model = torch.load(tmp_path / "short" / "model.pt", weights_only=True)
    assert short.history.records[-1]["validation_auroc"] == sel["value"]
    assert set(model) == set(saved["global"])
    for k in model:
        assert torch.equal(model[k], saved["global"][k])


def test_selection_survives_an_interruption(tmp_path, monkeypatch) -> None:
    cfg = resolve_config(SELECT, ["run.checkpoint_every=1"])
    full = run_experiment(cfg, tmp_path / "full", progress="none")
    with monkeypatch.context() as m:
        interrupt_at(m, 6)  # after the selected round 5: the checkpoint must carry its model
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "part", progress="none")
    (tmp_path / "part" / "selected.pt").unlink()  # even a lost file is rebuilt from the checkpoint
    resumed = run_experiment(cfg, tmp_path / "part", resume=True, progress="none")
    a_sel, b_sel = (
        dict(s["selected"], budget={**s["selected"]["budget"], "wall_time": 0}) for s in (resumed.summary, full.summary)
    )
    assert a_sel == b_sel
    a = torch.load(tmp_path / "full" / "selected.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "selected.pt", weights_only=True)
    assert a["round"] == b["round"] and all(torch.equal(a["global"][k], b["global"][k]) for k in a["global"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["run.select_by=test_auroc"], r"'test_auroc' is not a validation metric; allowed: \"validation_<metric>\""),
        (["data.validation_fraction=0.0"], r"needs a validation split but data.validation_fraction = 0.0"),
        (["run.select_by=validation_auprc"], r"metric 'auprc' is not evaluated on validation; evaluated: auroc"),
        (["run.select_by=personal_auroc_mean"], r"needs per-client validation splits but data.client_validation"),
        (["run.select_by=personal_auroc_median"], r"stat: mean, wmean, std, bottom10, worst"),
        (["data.client_validation_fraction=1.0"], r"client_validation_fraction"),
    ],
)
def test_bad_selection_settings_are_one_line_errors(overrides, message) -> None:
    with pytest.raises(FedriskError, match=message) as info:
        resolve_config(SELECT, overrides)
    assert "\n" not in str(info.value)


def test_a_client_split_without_a_class_its_metric_needs_names_the_client(tmp_path) -> None:
    raw = copy.deepcopy(SELECT)
    raw["data"].update(
        {
            "partition": "class_disjoint",
            "num_clients": 2,
            "partition_options": {"on": "label"},
            "client_validation_fraction": 0.2,
        }
    )
    raw["run"]["select_by"] = "personal_auroc_mean"
    with pytest.raises(
        FedriskError, match=r"client 0's validation split \(\d+ rows\) has no label [01], which metric 'auroc'"
    ):
        run_experiment(resolve_config(raw), tmp_path / "run", progress="none")


def test_auto_selects_on_the_first_validation_metric_and_none_without_validation(tmp_path) -> None:
    raw = copy.deepcopy(SELECT)
    raw["run"].update({"rounds": 2, "select_by": "auto", "splits": ["test"]})
    result = run_experiment(resolve_config(raw), tmp_path / "a", progress="none")
    assert result.summary["selected"]["selected_by"] == "validation_auroc"
    assert "validation_auroc" in records(tmp_path / "a")[0]  # evaluated because selection needs it
    raw["data"]["validation_fraction"] = 0.0
    result = run_experiment(resolve_config(raw), tmp_path / "b", progress="none")
    assert result.summary["selected"] is None and not (tmp_path / "b" / "selected.pt").exists()
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["selected"] is None


def test_a_global_split_without_a_class_is_refused_only_when_evaluated() -> None:
    from fedrisk.data.federation import Federation, Samples
    from fedrisk.runtime.evaluation import check_client_splits

    both = Samples(torch.zeros(4, 1), torch.tensor([0, 1, 0, 1]))
    ones = Samples(torch.zeros(3, 1), torch.tensor([1, 1, 1]))
    fed = Federation("toy", [both, both], 2, validation=ones, test=both)
    check_client_splits(fed, ["auroc"], ["test"])  # the validation set is not evaluated
    check_client_splits(fed, ["auprc", "accuracy"], ["test", "validation"])  # AUPRC needs positives only
    with pytest.raises(FedriskError, match=r"^the validation set \(3 rows\) has no label 0, which metric 'auroc'"):
        check_client_splits(fed, ["auroc"], ["test", "validation"])
