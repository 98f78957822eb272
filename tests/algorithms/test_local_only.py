"""LocalOnly (no communication) and centralised training on pooled data.

That every executor handles empty payloads / replies the same way is checked by the
conformance suite (``tests/conformance``, toy ``Silent``)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from fedrisk import run_federation
from fedrisk.algorithms import ALGORITHMS, Centralized, FedAvg, LocalOnly, centralized
from fedrisk.algorithms.local import sample_batches
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation

D, C = 3, 2
F64 = torch.float64


def logreg() -> FunctionalModel:
    return FunctionalModel(nn.Linear(D, C))


def samples(n: int, shift: float, g: torch.Generator) -> Samples:
    x = torch.randn(n, D, generator=g, dtype=F64) + shift
    y = (x[:, 0] + 0.3 * torch.randn(n, generator=g, dtype=F64) > shift).long()
    return Samples(x, y, {"group": torch.full((n,), int(shift))})


def federation(sizes: tuple[int, ...] = (6, 9, 12), tests: bool = True) -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = [samples(n, float(k), g) for k, n in enumerate(sizes)]
    client_tests = [samples(5, float(k), g) for k in range(len(sizes))] if tests else None
    return Federation(
        "toy", clients, C, client_tests=client_tests, validation=samples(4, 0.0, g), test=samples(7, 1.0, g)
    )


def local_sgd(model, w, s, idx, lr):
    for t in range(idx.shape[0]):
        leaves = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        loss = cross_entropy(model.apply(leaves, s.x[idx[t]]), s.y[idx[t]])
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        w = {k: w[k] - lr * grads[k] for k in w}
    return w


def mean_step_loss(model, w, s, idx, lr):
    """The mean over the steps of each step's batch loss at the iterate before the step."""
    total = 0.0
    for t in range(idx.shape[0]):
        total += float(cross_entropy(model.apply(w, s.x[idx[t]]), s.y[idx[t]]))
        w = local_sgd(model, w, s, idx[t : t + 1], lr)
    return total / idx.shape[0]


@pytest.mark.parametrize("sampling", ["with_replacement", "shuffle"])
def test_each_client_trains_alone_and_sends_nothing(sampling: str) -> None:
    model, fed = logreg(), federation()
    alg = LocalOnly(model=model, loss=cross_entropy, lr=0.3, local_steps=2, batch_size=4, sampling=sampling)
    sim = Simulation(alg, fed, seed=3, dtype=F64)
    w0 = sim.client_states[0]["params"]
    expected = {k: dict(w0) for k in range(3)}
    for r in range(3):
        report = sim.step()
        assert report.clients == [0, 1, 2]
        assert report.bytes_down == report.bytes_up == 0
        losses = []
        for k in range(3):
            idx = sample_batches(client_generator(3, r, k), fed.client_sizes[k], 2, 4, sampling)
            losses.append(mean_step_loss(model, expected[k], sim.federation.clients[k], idx, 0.3))
            expected[k] = local_sgd(model, expected[k], sim.federation.clients[k], idx, 0.3)
        # the logged training loss: the clients' mean over their steps, at the iterates before each step
        assert report.train_metrics["loss"] == pytest.approx(sum(losses) / 3, rel=1e-12)
    assert sim.server_state == {}
    assert sim.ledger.total == 0
    for k in range(3):
        got = alg.personal_params(sim.server_state, sim.client_states[k], k)
        for name in w0:
            assert torch.allclose(got[name], expected[k][name], rtol=0, atol=1e-12)
    assert not torch.allclose(sim.client_states[0]["params"]["weight"], sim.client_states[1]["params"]["weight"])


def test_evaluation_is_personal_only() -> None:
    alg = LocalOnly(model=logreg(), loss=cross_entropy, lr=0.3, local_steps=2, batch_size=4)
    assert alg.personalized and alg.global_params({}) is None
    history = run_federation(federation(), alg, rounds=2, metrics=["accuracy"], dtype=F64)
    last = history.last()
    assert "test_accuracy" not in last
    assert {"personal_accuracy_mean", "personal_accuracy_worst"} <= set(last)
    assert last["personal_accuracy_worst"] <= last["personal_accuracy_mean"]
    assert last["bytes_down"] == last["bytes_up"] == 0


def test_centralized_pools_training_data_and_keeps_evaluation_sets() -> None:
    fed = federation()
    pooled = centralized(fed)
    assert pooled.num_clients == 1 and pooled.client_sizes == (27,)
    assert torch.equal(pooled.clients[0].x, torch.cat([c.x for c in fed.clients]))
    assert torch.equal(pooled.clients[0].attrs["group"], torch.cat([c.attrs["group"] for c in fed.clients]))
    assert pooled.test is fed.test and pooled.validation is fed.validation
    assert pooled.client_tests is not None and len(pooled.client_tests) == 1 and len(pooled.client_tests[0]) == 15
    assert pooled.info["pooled_clients"] == 3
    assert pooled.name == "toy (pooled)" and pooled.client_validations is None
    assert centralized(federation(tests=False)).client_tests is None


def test_centralized_pools_the_client_validation_splits_and_keeps_the_class_names() -> None:
    import dataclasses

    base = federation()
    fed = dataclasses.replace(
        base,
        clients=[c.subset(range(2, len(c))) for c in base.clients],
        client_validations=[c.subset(range(2)) for c in base.clients],
        class_names=("no", "yes"),
    )
    pooled = centralized(fed)
    assert pooled.client_sizes == (21,) and pooled.class_names == ("no", "yes")
    (valid,) = pooled.client_validations
    assert torch.equal(valid.x, torch.cat([c.x[:2] for c in base.clients]))


def test_centralized_is_minibatch_sgd_on_pooled_data() -> None:
    model = logreg()
    pooled = centralized(federation())
    alg = Centralized(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=5)
    sim = Simulation(alg, pooled, seed=0, dtype=F64)
    same = Simulation(
        FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=5), pooled, seed=0, dtype=F64
    )
    w = sim.server_state["params"]
    for r in range(3):
        sim.step()
        same.step()
        w = local_sgd(model, w, sim.federation.clients[0], sample_batches(client_generator(0, r, 0), 27, 3, 5), 0.2)
    for name in w:
        assert torch.allclose(sim.server_state["params"][name], w[name], rtol=0, atol=1e-12)
        assert torch.equal(sim.server_state["params"][name], same.server_state["params"][name])
    assert ALGORITHMS.get("centralized") is Centralized and ALGORITHMS.get("local_only") is LocalOnly


def test_centralized_rejects_a_multi_client_federation() -> None:
    alg = Centralized(model=logreg(), loss=cross_entropy)
    pool = "fedrisk.algorithms.local_only.centralized(federation)"
    with pytest.raises(FedriskError, match=r"num_clients = 3.*" + re.escape(pool) + "$"):
        Simulation(alg, federation())
    # FedAvg's own checks still apply to the one client
    with pytest.raises(FedriskError, match=re.escape("clients_per_round = 2 is out of range; allowed: [1, 1]")):
        Simulation(Centralized(model=logreg(), loss=cross_entropy, clients_per_round=2), centralized(federation()))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"lr": 0.0}, "lr = 0.0 is not allowed; it must be a number > 0"),
        ({"lr": float("inf")}, "lr = inf is not allowed; it must be a finite number > 0"),
        ({"local_steps": 0}, "local_steps = 0 is out of range; allowed: [1, inf)"),
        ({"local_steps": 1.5}, "local_steps must be an integer >= 1; got 1.5"),
        ({"batch_size": 0}, "batch_size = 0 is out of range; allowed: [1, inf)"),
        ({"sampling": "x"}, "unknown sampling 'x'"),
    ],
)
def test_local_only_bad_hyper_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(FedriskError, match=re.escape(message)):
        LocalOnly(model=logreg(), loss=cross_entropy, **kwargs)
    LocalOnly(model=logreg(), loss=cross_entropy, lr=1e-9, local_steps=1, batch_size=1)  # the bounds are allowed
