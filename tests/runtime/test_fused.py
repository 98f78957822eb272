"""The fused stacked local SGD (``fedrisk.algorithms.fused``) equals the per-client loop."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from fedrisk.algorithms import fused, local
from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.fedavg import FedAvg, FedProx
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import binary_cross_entropy, cross_entropy
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import VectorizedExecutor

MODELS = [
    ("logreg", {}),
    ("logreg", {"bias": False}),
    ("mlp", {"hidden": [6]}),
    ("mlp", {"hidden": [7, 5]}),
]


def _block(dtype: torch.dtype, sizes: list[int], steps: int = 4, batch: int = 3):
    g = torch.Generator().manual_seed(1)
    n = max(sizes)
    x = torch.randn(len(sizes), n, 2, 3, generator=g, dtype=dtype)  # image-like rows: flattened by the model
    y = torch.randint(0, 4, (len(sizes), n), generator=g)
    for i, s in enumerate(sizes):  # zero padding past each client's size, as the executor's store
        x[i, s:], y[i, s:] = 0, 0
    idx = torch.stack([torch.randint(0, s, (steps, batch), generator=g) for s in sizes])
    return x, y, idx


@pytest.mark.parametrize(("name", "options"), MODELS)
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float64, 1e-11), (torch.float32, 1e-5)])
def test_fused_equals_each_clients_sgd_steps(name, options, dtype, rtol) -> None:
    model = FunctionalModel(build_model(name, (2, 3), 4, **options))
    params = model.init_params(0, dtype=dtype)
    sizes = [7, 3, 5]
    x, y, idx = _block(dtype, sizes)
    out = fused.fused_sgd_steps(model, cross_entropy, params, LocalData(x, y, torch.tensor(sizes)), idx, 0.3)
    assert out is not None
    stacked, losses = out
    assert list(stacked) == list(params) and losses.shape == (3,)
    objective = local.supervised_objective(model.apply, cross_entropy)
    for i, s in enumerate(sizes):
        one, one_loss = local.sgd_steps(objective, params, LocalData(x[i, :s], y[i, :s], torch.tensor(s)), idx[i], 0.3)
        for k in params:
            assert stacked[k][i].dtype == dtype
            torch.testing.assert_close(stacked[k][i], one[k], rtol=rtol, atol=rtol * 1e-2)
        torch.testing.assert_close(losses[i], one_loss, rtol=rtol, atol=rtol * 1e-2)
    # the shared parameters are never written
    fresh = model.init_params(0, dtype=dtype)
    assert all(torch.equal(params[k], fresh[k]) for k in params)


@pytest.mark.parametrize("name", ["logreg", "mlp"])
def test_fused_proximal_term_equals_fedprox_correction(name) -> None:
    model = FunctionalModel(build_model(name, (2, 3), 4, **({"hidden": [6]} if name == "mlp" else {})))
    params = model.init_params(0, dtype=torch.float64)
    sizes = [6, 4]
    x, y, idx = _block(torch.float64, sizes)
    out = fused.fused_sgd_steps(model, cross_entropy, params, LocalData(x, y, torch.tensor(sizes)), idx, 0.3, 0.7)
    assert out is not None
    correction = FedProx(model=model, loss=cross_entropy, mu=0.7).local_correction({"params": params}, {})
    objective = local.supervised_objective(model.apply, cross_entropy)
    for i, s in enumerate(sizes):
        data = LocalData(x[i, :s], y[i, :s], torch.tensor(s))
        one, _ = local.sgd_steps(objective, params, data, idx[i], 0.3, correction)
        plain, _ = local.sgd_steps(objective, params, data, idx[i], 0.3)
        for k in params:
            torch.testing.assert_close(out[0][k][i], one[k], rtol=1e-11, atol=1e-13)
        assert any(not torch.allclose(out[0][k][i], plain[k]) for k in params)  # the term matters


def test_one_step_and_unsupported_cases() -> None:
    model = FunctionalModel(build_model("mlp", (2, 3), 4, hidden=[6]))
    params = model.init_params(0, dtype=torch.float64)
    x, y, idx = _block(torch.float64, [4, 4], steps=1)
    data = LocalData(x, y, torch.tensor([4, 4]))
    stacked, _ = fused.fused_sgd_steps(model, cross_entropy, params, data, idx, 0.1)
    assert stacked["layers.0.weight"].shape == (2, 6, 6)
    assert fused.fused_sgd_steps(model, binary_cross_entropy, params, data, idx, 0.1) is None
    assert fused.fused_sgd_steps(model, cross_entropy, params, data, idx, torch.tensor(0.1)) is None
    assert fused.fused_sgd_steps(model, cross_entropy, params, LocalData(x.float(), y, data.size), idx, 0.1) is None
    sigmoid = FunctionalModel(build_model("mlp", (2, 3), 4, hidden=[6], output_activation="sigmoid"))
    assert fused.fused_layers(sigmoid, cross_entropy) is None
    assert fused.fused_layers(FunctionalModel(build_model("cnn", (1, 8, 8), 2)), cross_entropy) is None


def _federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    s = Samples(torch.randn(90, 5, generator=g), torch.randint(0, 3, (90,), generator=g))
    cuts = [0, 10, 16, 40, 41, 60, 90]  # unequal clients: the store gathers and pads
    return Federation("toy", [s.subset(range(a, b)) for a, b in itertools.pairwise(cuts)], num_classes=3)


@dataclass(frozen=True)
class _Damped(FedAvg):
    """FedAvg with a gradient correction the fused program does not know."""

    def local_correction(self, payload, state):
        return lambda params, g: {k: 0.5 * v for k, v in g.items()}


@pytest.mark.parametrize(("algorithm", "options"), [(FedAvg, {}), (FedProx, {"mu": 0.3}), (_Damped, {})])
def test_vectorized_executor_uses_the_fused_path_for_fedavg_and_fedprox(monkeypatch, algorithm, options) -> None:
    """FedAvg and FedProx on a zoo MLP run the fused program (another correction runs vmap); the
    results equal the sequential executor's and the vmap path's to float rounding."""
    calls = []
    original = fused.fused_sgd_steps
    monkeypatch.setattr("fedrisk.algorithms.fedavg.fused_sgd_steps", lambda *a: calls.append(1) or original(*a))
    model = FunctionalModel(build_model("mlp", (5,), 3, hidden=[8]))
    alg = algorithm(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4, sampling="shuffle", **options)
    fed = _federation()
    results = {}
    for name, executor, switches in [
        ("sequential", "sequential", {}),
        ("fused", VectorizedExecutor(block_size=4), {}),
        ("vmap", VectorizedExecutor(block_size=4), {"fused": False}),
    ]:
        sim = Simulation(alg, fed, seed=3, dtype=torch.float64, executor=executor)
        with local.fast_paths(**switches):
            for _ in range(3):
                sim.step()
        results[name] = sim.server_state["params"]
    assert len(calls) == (0 if algorithm is _Damped else 6)  # 3 rounds x 2 blocks
    for name in ("fused", "vmap"):
        for k, v in results["sequential"].items():
            torch.testing.assert_close(results[name][k], v, rtol=1e-10, atol=1e-12)


@dataclass(frozen=True)
class _PullToPayload(FedAvg):
    """A correction that reads the payload and the client state (neither FedAvg's nor FedProx's)."""

    def local_correction(self, payload, state):
        anchor, mu = payload["params"], state.get("mu", 0.1)
        return lambda params, g: {k: g[k] + mu * (params[k] - anchor[k]) for k in g}


@pytest.mark.parametrize(("algorithm", "options"), [(FedAvg, {}), (FedProx, {"mu": 0.7})])
def test_block_update_is_each_clients_client_update(algorithm, options) -> None:
    """Called directly (the executor falls back to vmap when it returns None or raises, so a
    broken fast path would otherwise only cost speed): the block's reply, state and metrics."""
    model = FunctionalModel(build_model("mlp", (2, 3), 4, hidden=[6]))
    params = model.init_params(0, dtype=torch.float64)
    sizes = [6, 4]
    x, y, idx = _block(torch.float64, sizes)
    alg = algorithm(model=model, loss=cross_entropy, lr=0.3, local_steps=4, batch_size=3, **options)
    payload, data = {"params": params}, LocalData(x, y, torch.tensor(sizes))
    out = alg.block_update(None, payload, data, {"batches": idx})
    assert out is not None and set(out.reply) == {"params"} and out.state == {} and set(out.metrics) == {"loss"}
    for i, s in enumerate(sizes):
        one = alg.client_update(None, payload, {}, LocalData(x[i, :s], y[i, :s], torch.tensor(s)), {"batches": idx[i]})
        for k in params:
            torch.testing.assert_close(out.reply["params"][k][i], one.reply["params"][k], rtol=1e-11, atol=1e-13)
        torch.testing.assert_close(out.metrics["loss"][i], one.metrics["loss"], rtol=1e-11, atol=1e-13)
    with local.fast_paths(fused=False):
        assert alg.block_update(None, payload, data, {"batches": idx}) is None
    other = _PullToPayload(model=model, loss=cross_entropy, lr=0.3, local_steps=4, batch_size=3)
    assert other.block_update(None, payload, data, {"batches": idx}) is None  # no fused program for it
