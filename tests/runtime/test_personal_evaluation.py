"""Personalised evaluation: each client's own model on its own test split, summarised over clients
(weighted / unweighted mean, std, bottom-10%, worst), the best round named apart from the last in
the summary, and the personalised table of ``fedrisk report``."""

from __future__ import annotations

import json

import pytest
import torch

from fedrisk.algorithms import LocalOnly
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.evaluation import client_summary, evaluate
from fedrisk.runtime.simulation import Simulation

F64 = torch.float64


def constant_model(label: int) -> dict[str, torch.Tensor]:
    """A logistic regression that always predicts ``label``."""
    bias = torch.tensor([4.0, -4.0] if label == 0 else [-4.0, 4.0], dtype=F64)
    return {"linear.weight": torch.zeros(2, 2, dtype=F64), "linear.bias": bias}


def test_every_client_is_scored_with_its_own_model_on_its_own_test_split() -> None:
    """Client k's test labels are all k % 2 and its model predicts k % 2: every client scores 1.
    Evaluating every client with client 0's model (or on client 0's split) gives 0 on odd clients."""
    sizes = [3, 5, 2, 7, 4]
    g = torch.Generator().manual_seed(0)

    def split(k: int, n: int) -> Samples:
        return Samples(torch.randn(n, 2, generator=g, dtype=F64), torch.full((n,), k % 2))

    fed = Federation("own", [split(k, 4) for k in range(5)], 2, client_tests=[split(k, n) for k, n in enumerate(sizes)])
    alg = LocalOnly(model=FunctionalModel(build_model("logreg", (2,), 2)), loss=cross_entropy)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    states = {k: {"params": constant_model(k % 2)} for k in range(5)}
    got = evaluate(alg, sim.server_state, states, sim.federation, ["accuracy"])
    for stat in ("mean", "wmean", "bottom10", "worst"):
        assert got[f"personal_accuracy_{stat}"] == 1.0
    assert got["personal_accuracy_std"] == 0.0
    # now clients 1 and 3 hold the wrong model: the per-client scores drop exactly there
    states[1] = states[3] = {"params": constant_model(0)}
    got = evaluate(alg, sim.server_state, states, sim.federation, ["accuracy"])
    assert got["personal_accuracy_mean"] == pytest.approx(3 / 5)
    assert got["personal_accuracy_wmean"] == pytest.approx((3 + 2 + 4) / sum(sizes))
    assert got["personal_accuracy_std"] == pytest.approx(float(torch.tensor([1.0, 0, 1, 0, 1]).std(unbiased=False)))
    assert got["personal_accuracy_bottom10"] == 0.0 and got["personal_accuracy_worst"] == 0.0


def test_client_summary_statistics_and_loss_direction() -> None:
    vals = [float(v) for v in range(20)]  # 20 clients: bottom-10% = the 2 worst
    s = client_summary(vals, [1] * 19 + [20])
    assert s["mean"] == pytest.approx(9.5) and s["wmean"] == pytest.approx((sum(range(19)) + 19 * 20) / 39)
    assert s["bottom10"] == pytest.approx(0.5) and s["worst"] == 0.0
    loss = client_summary(vals, [1] * 20, lower_is_better=True)  # for a loss the worst clients are the largest
    assert loss["bottom10"] == pytest.approx(18.5) and loss["worst"] == 19.0


def test_summary_names_the_best_round_apart_and_report_shows_the_personal_table(tmp_path) -> None:
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.report import make_report
    from fedrisk.experiment.runner import run_experiment

    cfg = resolve_config(
        {
            "data": {
                "dataset": "digits",
                "num_clients": 4,
                "partition": "k_classes",
                "client_test_fraction": 0.3,
                "client_validation_fraction": 0.3,
            },
            "model": {"name": "logreg"},
            "algorithm": {"name": "ditto", "lr": 0.1, "local_steps": 2, "personal_lr": 0.1},
            "run": {"rounds": 4, "metrics": ["accuracy"]},
            "output": {"plots": False},
        }
    )
    result = run_experiment(cfg, tmp_path / "run", progress="none")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))
    best = summary["oracle_round"]
    assert best["selected_by"] == "personal_accuracy_mean"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    top = max(r["personal_accuracy_mean"] for r in records)
    assert best["metrics"]["personal_accuracy_mean"] == top
    assert {f"personal_accuracy_{s}" for s in ("mean", "wmean", "std", "bottom10", "worst")} <= set(summary["final"])
    report = make_report([tmp_path / "run"], plots=False)
    assert "selected bottom10" in report.markdown and "last wmean" in report.markdown
    # selection reads each client's own validation split ("auto": personal_accuracy_mean on validation)
    top = max(records, key=lambda r: r["validation_personal_accuracy_mean"])
    assert summary["selected"]["selected_by"] == "validation_personal_accuracy_mean"
    assert summary["selected"]["round"] == top["round"]
    assert "personal_accuracy_std" not in report.table  # details live in the personalised table
