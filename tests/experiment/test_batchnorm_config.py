"""Config keys of issue 30: ``model.norm_stats``, ``model.reset_head`` with ``run.init_from``
(the two-stage recipe on a BatchNorm network) and ``state_dict`` files as ``run.init_from``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import MODEL_FILE, build_simulation, run_experiment
from fedrisk.models import build_model

TINY = {"name": "resnet18", "widths": [2, 2, 4, 4]}
FEDAVG = {"name": "fedavg", "lr": 0.05, "local_steps": 1, "batch_size": 8}
CODASCA = {"name": "codasca", "lr": 0.05, "window": 1, "batch_size": 8}


def config(algorithm: dict[str, Any], model: dict[str, Any], binary: bool = False, **run: Any) -> Any:
    data: dict[str, Any] = {"dataset": "digits", "num_clients": 2, "dataset_options": {"flatten": False}}
    if binary:
        data["binarize"] = {}
    return resolve_config(
        {
            "data": data,
            "model": model,
            "algorithm": algorithm,
            "run": {"rounds": 1, "threads": 1, **run},
            "output": {"plots": False},
        }
    )


def test_norm_stats_policy_from_the_config_and_refused_without_batchnorm() -> None:
    sim = build_simulation(config(FEDAVG, TINY)).simulation
    assert sim.algorithm.policy == "averaged" and "norm_stats" in sim.server_state
    sim = build_simulation(config(FEDAVG, {**TINY, "norm_stats": "local"})).simulation
    assert sim.algorithm.policy == "local" and "norm_stats" in sim.client_states[1]
    plain = build_simulation(config(FEDAVG, {"name": "mlp", "hidden": [4]})).simulation
    assert "norm_stats" not in plain.server_state  # a model without BatchNorm is not wrapped
    with pytest.raises(FedriskError, match=r"norm_stats = 'frozen' but MLP has no BatchNorm layer") as info:
        build_simulation(config(FEDAVG, {"name": "mlp", "hidden": [4], "norm_stats": "frozen"}))
    assert "\n" not in str(info.value)
    with pytest.raises(FedriskError, match=r"norm_stats"):
        config(FEDAVG, {**TINY, "norm_stats": "global"})


def test_two_stage_recipe_with_a_new_head(tmp_path: Path) -> None:
    run_experiment(config(FEDAVG, TINY), tmp_path / "pre", progress="none")  # 10 classes
    saved = torch.load(tmp_path / "pre" / MODEL_FILE, weights_only=True)
    assert saved["fc.weight"].shape == (10, 4) and "bn1.running_var" in saved
    stage2 = {**TINY, "output_activation": "sigmoid", "reset_head": True}
    sim = build_simulation(config(CODASCA, stage2, binary=True, init_from=str(tmp_path / "pre"))).simulation
    start = sim.server_state["v"]["model"]
    assert start["fc.weight"].shape == (1, 4)  # the new head: the run's own fresh initialisation
    fresh = build_simulation(config(CODASCA, {**TINY, "output_activation": "sigmoid"}, binary=True)).simulation
    assert torch.equal(start["fc.weight"], fresh.server_state["v"]["model"]["fc.weight"])
    body = [k for k in saved if not k.startswith("fc.") and not k.endswith("running_mean") and "running" not in k]
    assert all(torch.equal(start[k], saved[k]) for k in body)
    assert torch.equal(sim.server_state["norm_stats"]["bn1.running_var"], saved["bn1.running_var"])
    with pytest.raises(FedriskError, match=r"tensor 'fc.weight' has shape \[10, 4\].*\[1, 4\].*model.reset_head"):
        build_simulation(config(CODASCA, {**stage2, "reset_head": False}, binary=True, init_from=str(tmp_path / "pre")))
    with pytest.raises(FedriskError, match=r"model.reset_head = true needs run.init_from"):
        build_simulation(config(CODASCA, stage2, binary=True))


def test_init_from_a_state_dict_file_and_a_mismatched_architecture(tmp_path: Path) -> None:
    torch.manual_seed(5)
    module = build_model("resnet18", (1, 8, 8), 10, widths=[2, 2, 4, 4])
    with torch.no_grad():
        module.bn1.running_mean.fill_(0.25)
    torch.save(module.state_dict(), tmp_path / "weights.pt")  # with num_batches_tracked counters
    sim = build_simulation(config(FEDAVG, TINY, init_from=str(tmp_path / "weights.pt"))).simulation
    assert torch.equal(sim.server_state["params"]["layer3.0.conv1.weight"], module.layer3[0].conv1.weight.detach())
    assert torch.equal(sim.server_state["norm_stats"]["bn1.running_mean"], torch.full((2,), 0.25))
    other = {"name": "densenet121", "growth_rate": 2, "block_config": [1], "num_init_features": 2, "bn_size": 1}
    with pytest.raises(FedriskError, match=r"run.init_from: the parameters in .*weights.pt do not fit") as info:
        build_simulation(config(FEDAVG, other, init_from=str(tmp_path / "weights.pt")))
    assert "\n" not in str(info.value)
