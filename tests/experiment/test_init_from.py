"""``run.init_from``: a run starts from a finished run's model (the paper's two-stage recipe:
cross-entropy pre-training, then CODASCA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import MODEL_FILE, build_simulation, run_experiment

DATA = {"dataset": "breast_cancer", "num_clients": 2, "binarize": {}}


def config(algorithm: dict[str, Any], model: dict[str, Any], **run: Any) -> Any:
    return resolve_config(
        {
            "data": DATA,
            "model": {"name": "mlp", "hidden": [4], "num_outputs": 1, **model},
            "algorithm": algorithm,
            "run": {"rounds": 2, "threads": 1, **run},
            "output": {"plots": False},
        }
    )


def test_two_stage_recipe_starts_codasca_from_the_pretrained_model(tmp_path: Path) -> None:
    pre = config({"name": "fedavg", "lr": 0.1, "local_steps": 2, "batch_size": 8}, {})
    run_experiment(pre, tmp_path / "pre", progress="none")
    saved = torch.load(tmp_path / "pre" / MODEL_FILE, weights_only=True)
    auc = {"name": "codasca", "lr": 0.05, "window": 2, "stage_iters": 4, "batch_size": 8}
    sim = build_simulation(config(auc, {"output_activation": "sigmoid"}, init_from=str(tmp_path / "pre"))).simulation
    start = sim.server_state["v"]["model"]
    assert sorted(start) == sorted(saved) and all(torch.equal(start[k], saved[k].to(start[k].dtype)) for k in saved)
    assert all(torch.equal(sim.client_states[0]["ref"]["model"][k], start[k]) for k in start)
    # a finished AUC run's model.pt holds {"model", "a", "b", "alpha"}: its "model" is taken
    run_experiment(config(auc, {"output_activation": "sigmoid"}), tmp_path / "auc", progress="none")
    sim = build_simulation(config(auc, {}, init_from=str(tmp_path / "auc" / MODEL_FILE))).simulation
    saved = torch.load(tmp_path / "auc" / MODEL_FILE, weights_only=True)["model"]
    assert all(torch.equal(sim.server_state["v"]["model"][k], saved[k]) for k in saved)
    fresh = build_simulation(config(auc, {})).simulation.server_state["v"]["model"]
    assert not all(torch.equal(fresh[k], saved[k]) for k in saved)


def test_bad_init_from_is_named(tmp_path: Path) -> None:
    auc = {"name": "codasca", "lr": 0.05, "window": 2, "stage_iters": 4, "batch_size": 8}
    with pytest.raises(FedriskError, match=r"run\.init_from = .*does not exist; allowed: a finished run's directory"):
        build_simulation(config(auc, {}, init_from=str(tmp_path / "nothing")))
    torch.save({"weight": torch.zeros(3, 3)}, tmp_path / "w.pt")
    with pytest.raises(FedriskError, match="do not fit this model"):
        build_simulation(config(auc, {}, init_from=str(tmp_path / "w.pt")))
    (tmp_path / "junk.pt").write_text("not a checkpoint")
    with pytest.raises(FedriskError, match="cannot read"):
        build_simulation(config(auc, {}, init_from=str(tmp_path / "junk.pt")))
