"""``server_adam``: plain ``torch.optim.Adam`` on a one-client federation (the paper's central
pre-training for CODASCA's two-stage recipe), its config key, bad input and a resume."""

from __future__ import annotations

import copy
import json
import signal

import pytest
import torch
from torch import nn

from fedrisk.algorithms.local import sample_batches
from fedrisk.algorithms.local_only import Centralized, centralized
from fedrisk.algorithms.server_opt import server_adam
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.experiment import RunInterrupted, resolve_config, run_experiment
from fedrisk.experiment.progress import Progress
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation

F64 = torch.float64


def pooled_toy() -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = [
        Samples(torch.randn(n, 4, generator=g, dtype=F64) + k, torch.randint(0, 3, (n,), generator=g))
        for k, n in enumerate((9, 14))
    ]
    return centralized(Federation("toy", clients, num_classes=3))


def test_centralized_with_server_adam_is_torch_adam() -> None:
    """One local step of lr 1 makes the pseudo-gradient -delta the minibatch gradient, so the
    server's Adam step is torch.optim.Adam's, step for step (bias correction included)."""
    model = FunctionalModel(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)))
    alg = Centralized(
        model=model,
        loss=cross_entropy,
        lr=1.0,
        local_steps=1,
        batch_size=4,
        server_opt=server_adam(0.05, b1=0.8, b2=0.99),
    )
    sim = Simulation(alg, pooled_toy(), seed=3, dtype=F64)
    net = copy.deepcopy(model.module).double()
    net.load_state_dict(sim.server_state["params"])
    opt = torch.optim.Adam(net.parameters(), lr=0.05, betas=(0.8, 0.99))
    x, y = sim.federation.clients[0].x, sim.federation.clients[0].y
    for r in range(6):
        idx = sample_batches(client_generator(3, r, 0), 23, 1, 4)[0]
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
        sim.step()
        for k, v in net.named_parameters():
            assert torch.allclose(sim.server_state["params"][k], v.detach(), rtol=0, atol=1e-12), (r, k)
    assert int(sim.server_state["opt"]["count"]) == 6


def test_first_adam_step_is_lr_times_the_sign() -> None:
    opt = server_adam(0.01, eps=1e-12)
    state = opt.init({"w": torch.zeros(3, dtype=F64)})
    step, state = opt.update({"w": torch.tensor([3.0, -1e-3, 0.0], dtype=F64)}, state, {})
    assert step["w"].tolist() == pytest.approx([0.01, -0.01, 0.0], abs=1e-9)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"lr": 0.0}, "Adam learning rate"),
        ({"lr": 0.1, "b1": 1.0}, "Adam beta1"),
        ({"lr": 0.1, "b2": -0.1}, "Adam beta2"),
        ({"lr": 0.1, "eps": 0.0}, "Adam eps"),
    ],
)
def test_bad_adam_settings_are_named(kwargs, needle) -> None:
    with pytest.raises(FedriskError, match=needle):
        server_adam(**kwargs)


RAW = {
    "data": {"dataset": "digits", "num_clients": 3},
    "model": {"name": "logreg"},
    "algorithm": {
        "name": "centralized",
        "lr": 1.0,
        "local_steps": 1,
        "batch_size": 16,
        "server_optimizer": "adam",
        "server_lr": 0.01,
    },
    "run": {"rounds": 4, "threads": 1, "checkpoint_every": 2},
    "output": {"plots": False},
}


def test_config_key_and_its_errors() -> None:
    assert resolve_config(copy.deepcopy(RAW))["algorithm.server_optimizer"] == "adam"
    sgd = copy.deepcopy(RAW)
    sgd["algorithm"]["server_optimizer"] = "sgd"
    assert "algorithm.server_optimizer" not in resolve_config(sgd).values["algorithm"]  # old checkpoints resume
    raw = copy.deepcopy(RAW)
    raw["algorithm"]["server_momentum"] = 0.9
    with pytest.raises(FedriskError, match='server_optimizer = "adam" takes only server_lr'):
        resolve_config(raw)
    raw["algorithm"].update(server_momentum=0.0, server_optimizer="adamw")
    with pytest.raises(FedriskError, match="server_optimizer"):
        resolve_config(raw)


def test_adam_run_resumes_exactly(tmp_path, monkeypatch) -> None:
    """The Adam moments and step count travel through the checkpoint."""
    cfg = resolve_config(copy.deepcopy(RAW))
    run_experiment(cfg, tmp_path / "full", progress="none")
    original = Progress.on_round_end

    def hook(self, sim, report):
        original(self, sim, report)
        if sim.round == 3:
            signal.raise_signal(signal.SIGTERM)

    with monkeypatch.context() as m:
        m.setattr(Progress, "on_round_end", hook)
        with pytest.raises(RunInterrupted):
            run_experiment(cfg, tmp_path / "r", progress="none")
    run_experiment(cfg, tmp_path / "r", resume=True, progress="none")

    def recs(d):
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]

    assert recs(tmp_path / "r") == recs(tmp_path / "full")
    assert recs(tmp_path / "full")[-1]["round"] == 4


def test_fedadam_runs_the_same_under_the_vectorized_executor() -> None:
    """FedAdam (several clients, several local steps): the server state, Adam's moments and step
    count included, is the sequential executor's."""
    from fedrisk.algorithms import FedAvg
    from fedrisk.tree import tree_flatten_vector

    g = torch.Generator().manual_seed(1)
    clients = [
        Samples(torch.randn(n, 4, generator=g, dtype=F64) + k, torch.randint(0, 3, (n,), generator=g))
        for k, n in enumerate((7, 12, 5))
    ]
    fed = Federation("toy", clients, num_classes=3)
    model = FunctionalModel(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.1, local_steps=3, batch_size=4, server_opt=server_adam(0.02))
    sims = [Simulation(alg, fed, seed=2, dtype=F64, executor=name) for name in ("sequential", "vectorized")]
    for sim in sims:
        for _ in range(4):
            sim.step()
    a, b = (sim.server_state for sim in sims)
    assert int(a["opt"]["count"]) == int(b["opt"]["count"]) == 4
    assert torch.allclose(tree_flatten_vector(a["params"]), tree_flatten_vector(b["params"]), rtol=0, atol=1e-12)
    assert torch.allclose(tree_flatten_vector(a["opt"]["v"]), tree_flatten_vector(b["opt"]["v"]), rtol=0, atol=1e-12)
