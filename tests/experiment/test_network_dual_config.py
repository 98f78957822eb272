"""Config side of the network dual player (issue 30 item 4): ``[dual_model]``, ``game = "gan"``,
the dual-set keys, a game registered by a module in ``imports``, and the samples-over-rounds
plot of a run folder."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tomllib
import torch

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.runner import build_simulation, run_experiment
from fedrisk.objectives.adversarial import GAME_REGISTRY

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def gan_config(**over: Any) -> dict[str, Any]:
    raw = tomllib.loads((CONFIGS / "minimax" / "gan_mog.toml").read_text())
    raw.pop("sweep")
    raw["data"]["dataset_options"] = {"num_samples": 200, "test_samples": 40}
    raw["run"].update({"rounds": 2, "eval_every": 1, "executor": "sequential"})
    raw["algorithm"].update({"local_steps": 2, "batch_size": 8})
    for table, values in over.items():
        raw[table] = values if values is None else {**raw.get(table, {}), **values}
    return {k: v for k, v in raw.items() if v is not None}


def test_the_shipped_gan_config_runs_and_plots_its_samples_over_rounds(tmp_path: Path) -> None:
    cfg = resolve_config(gan_config())
    result = run_experiment(cfg, tmp_path / "run", progress="none")
    assert {"modes_covered", "high_quality_fraction"} <= set(result.summary["final"])
    saved = sorted(p.name for p in (tmp_path / "run" / "samples").iterdir())
    assert saved == ["round_000000.pt", "round_000001.pt", "round_000002.pt"]
    assert torch.load(tmp_path / "run" / "samples" / saved[-1], weights_only=True).shape == (500, 2)
    assert (tmp_path / "run" / "plots" / "samples_over_rounds.png").stat().st_size > 0
    sim = build_simulation(cfg).simulation
    first = next(iter(sim.server_state["x"].values()))
    assert first.shape == (64, 2)  # the generator's first layer takes the noise (noise_dim = 2)
    assert sorted(sim.server_state["y"]) == sorted(sim.algorithm.dual_model.names)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"dual_model": None}, r'algorithm.game = "gan" is played by a network dual: add a \[dual_model\] table'),
        ({"algorithm": {"game": "fair_class"}}, r"\[dual_model\] is for network games"),
        ({"algorithm": {"name": "fedavg", "game": None}}, r"\[dual_model\] is not allowed for algorithm 'fedavg'"),
        ({"algorithm": {"dual_set": "sphere"}}, r"\[algorithm\] fessgda: unknown dual_set 'sphere'"),
        ({"algorithm": {"dual_set": "ball", "dual_radius": 0.0}}, r"fessgda: dual_radius = 0.0 is out of range"),
        ({"dual_model": {"name": "mlpp"}}, r"dual_model.name = \"mlpp\""),
    ],
)
def test_bad_dual_configs_are_refused_in_one_line_naming_the_key(over: dict[str, Any], message: str) -> None:
    raw = gan_config(**over)
    if raw["algorithm"].get("name") == "fedavg":
        raw["algorithm"] = {"name": "fedavg"}
    with pytest.raises(FedriskError, match=message):
        resolve_config(raw)


def test_a_dual_model_whose_output_does_not_fit_is_refused_when_the_run_is_built() -> None:
    cfg = resolve_config(gan_config(dual_model={"num_outputs": 4}))
    with pytest.raises(FedriskError, match=r"the discriminator \(\[dual_model\]\) must give one logit per row"):
        build_simulation(cfg)


def test_a_game_registered_by_a_module_in_imports_runs_from_a_config(tmp_path: Path) -> None:
    (tmp_path / "my_game_plugin.py").write_text(
        textwrap.dedent(
            """
            from fedrisk.objectives.adversarial import register_game
            from fedrisk.objectives.minimax import per_sample_cross_entropy

            @register_game("reweighted_ce", "an adversary reweights the rows (DRO with a network)")
            def reweighted_ce(x, y, batch):
                loss = per_sample_cross_entropy(batch.model(x, batch.inputs), batch.labels)
                weights = batch.dual_model(y, batch.inputs).reshape(-1).softmax(0)
                return (weights * loss).sum()
            """
        )
    )
    raw = {
        "imports": ["my_game_plugin"],
        "data": {"dataset": "wine", "num_clients": 2},
        "model": {"name": "logreg"},
        "dual_model": {"name": "mlp", "hidden": [4]},
        "algorithm": {"name": "fsgda", "game": "reweighted_ce", "lr": 0.05, "local_steps": 2, "batch_size": 8},
        "run": {"rounds": 2, "metrics": ["accuracy"]},
        "output": {"plots": False},
    }
    path = tmp_path / "plugin.toml"
    try:
        cfg = resolve_config(raw, source=path)
        result = run_experiment(cfg, tmp_path / "run", progress="none")
        assert result.summary["rounds"] == 2 and "test_accuracy" in result.summary["final"]
    finally:
        GAME_REGISTRY._entries.pop("reweighted_ce", None)
        sys.modules.pop("my_game_plugin", None)


def test_the_python_example_with_a_custom_objective_runs() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "network_adversary.py"
    spec = importlib.util.spec_from_file_location("network_adversary_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    last = module.main(rounds=2)
    assert last["round"] == 2 and 0.0 <= last["test_accuracy"] <= 1.0
