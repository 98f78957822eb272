"""``run_federation``'s options: initial parameters (a pretrained module's own weights), torch
threads, the executor and the progress bar; shape mismatches name the tensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.api import Callback, run_federation
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation


def federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    s = Samples(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))
    return Federation("toy", [s.subset(range(25)), s.subset(range(25, 50))], 2, test=s.subset(range(50, 60)))


def pretrained() -> nn.Module:
    torch.manual_seed(11)
    module = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        module[0].weight.mul_(3.0)  # "pretrained": not what any fresh init draws
        module[1].running_mean.fill_(0.5)
    return module


class Seen(Callback):
    def on_start(self, sim: Simulation) -> None:
        self.start = {k: v.clone() for k, v in sim.server_state["params"].items()}
        self.stats = {k: v.clone() for k, v in sim.server_state["norm_stats"].items()}
        self.threads = torch.get_num_threads()
        self.executor = sim.executor.name


def test_init_module_starts_from_the_modules_own_weights_and_statistics() -> None:
    module = pretrained()
    fm = FunctionalModel(module, init="module")
    assert all(torch.equal(fm.init_params()[k], v) for k, v in module.named_parameters())
    assert torch.equal(fm.init_stats()["1.running_mean"], torch.full((6,), 0.5))
    fresh = FunctionalModel(module)  # the default: a seeded fresh initialisation
    assert not torch.equal(fresh.init_params(0)["0.weight"], module[0].weight)
    assert torch.equal(fresh.init_stats()["1.running_mean"], torch.zeros(6))
    seen = Seen()
    alg = FedAvg(model=fm, loss=cross_entropy, lr=0.1, batch_size=8)
    run_federation(federation(), alg, rounds=1, callbacks=[seen], progress=False)
    assert torch.equal(seen.start["0.weight"], module[0].weight.detach())
    assert torch.equal(seen.stats["1.running_mean"], torch.full((6,), 0.5))


def test_init_params_threads_and_executor_are_used_and_threads_restored() -> None:
    fm = FunctionalModel(pretrained())
    start = {k: torch.full_like(v, 0.01) for k, v in fm.init_params().items()}
    seen, before = Seen(), torch.get_num_threads()
    alg = FedAvg(model=fm, loss=cross_entropy, lr=0.1, batch_size=8)
    run_federation(
        federation(),
        alg,
        rounds=1,
        init_params=start,
        threads=1,
        executor="vectorized",
        callbacks=[seen],
        progress=False,
    )
    assert all(torch.equal(seen.start[k], start[k]) for k in start)
    assert seen.threads == 1 and seen.executor == "vectorized" and torch.get_num_threads() == before
    assert torch.equal(seen.stats["1.running_var"], torch.ones(6))  # parameters only: fresh statistics


def test_init_params_with_a_wrong_shape_names_the_tensor() -> None:
    fm = FunctionalModel(pretrained())
    bad = {**fm.init_params(), "3.weight": torch.zeros(3, 6)}
    alg = FedAvg(model=fm, loss=cross_entropy)
    with pytest.raises(
        FedriskError, match=r"init_params: tensor '3.weight' has shape \[3, 6\]; the model's is \[2, 6\]"
    ):
        run_federation(federation(), alg, rounds=1, init_params=bad, progress=False)
    with pytest.raises(FedriskError, match=r"unknown tensors \['head.weight'\]"):
        run_federation(federation(), alg, rounds=1, init_params={**fm.init_params(), "head.weight": torch.zeros(1)})
    with pytest.raises(FedriskError, match="threads = 0"):
        run_federation(federation(), alg, rounds=1, threads=0)


def test_progress_bar_only_when_asked_or_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    alg = FedAvg(model=FunctionalModel(pretrained()), loss=cross_entropy, batch_size=8)
    run_federation(federation(), alg, rounds=3, metrics=["accuracy"], progress=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "round" in err and "test_accuracy" in err
    run_federation(federation(), alg, rounds=2)  # captured stderr is no terminal: no bar
    assert capsys.readouterr().err == ""
