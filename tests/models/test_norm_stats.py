"""BatchNorm running statistics as federated state (``fedrisk.runtime.norm_stats``).

Checked against PyTorch's own ``nn.BatchNorm`` (train-mode outputs and running statistics,
eval-mode outputs) and against a plain FedAvg loop over ``nn.Module`` copies in ``train()``
mode (the averaged policy, one round, several local steps); the sequential and vectorised
executors give the same numbers under all three policies; bad input is one-line errors.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime.evaluation import evaluate
from fedrisk.runtime.simulation import Simulation, fed_info

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 5),
        nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2),
    )  # fmt: skip


def federation(num_clients: int = 4) -> Federation:
    g = torch.Generator().manual_seed(3)
    clients = []
    for k in range(num_clients):
        n = 10 + 3 * k
        clients.append(Samples(torch.randn(n, 1, 4, 4, generator=g) * (1 + k) + k, torch.arange(n) % 2))
    tests = [Samples(torch.randn(6, 1, 4, 4, generator=g) + k, torch.arange(6) % 2) for k in range(num_clients)]
    return Federation(
        "bn", clients, 2, client_tests=tests, test=Samples(torch.randn(8, 1, 4, 4, generator=g), torch.arange(8) % 2)
    )


def fedavg(policy: str | None = None, **kw) -> FedAvg:
    model = FunctionalModel(net(), init="module", norm_stats=policy)
    return FedAvg(model=model, loss=cross_entropy, **{"lr": 0.2, "local_steps": 3, "batch_size": 5, **kw})


def test_train_and_eval_forward_match_pytorch_batchnorm() -> None:
    module = net()
    fm = FunctionalModel(copy.deepcopy(module), init="module")
    params, x1, x2 = fm.init_params(), torch.randn(7, 1, 4, 4), torch.randn(7, 1, 4, 4)
    module.train()
    with fm.norm_scope(fm.init_stats(), train=True) as scope:
        got = [fm.apply(params, x1), fm.apply(params, x2)]  # two forward passes: two updates
    want = [module(x1), module(x2)]
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))
    stats = scope.result()
    for name in fm.stat_names:
        assert torch.allclose(stats[name], module.state_dict()[name], atol=1e-6), name
    module.eval()
    with fm.norm_scope(stats, train=False) as scope:
        assert torch.allclose(fm.apply(params, x1), module(x1), atol=1e-5)
    assert all(torch.equal(scope.result()[k], stats[k]) for k in stats)  # eval leaves them alone
    module.train()  # the module itself still runs as a plain nn.Module outside apply
    before = module[1].running_mean.clone()
    module(x1)
    assert not torch.equal(module[1].running_mean, before)


def test_averaged_round_equals_a_plain_pytorch_fedavg_loop() -> None:
    fed, alg = federation(), fedavg()
    sim = Simulation(alg, fed, seed=5, dtype=F64)
    sim.step()
    info, ctx = fed_info(sim.federation), RoundContext(0, fed_info(sim.federation))
    start = net().double()
    models, sizes = [], []
    for k, client in enumerate(sim.federation.clients):
        idx = alg.draw(ctx, k, len(client), client_generator(5, 0, k))["batches"]
        m = copy.deepcopy(start).train()
        for t in range(idx.shape[0]):
            loss = nn.functional.cross_entropy(m(client.x[idx[t]]), client.y[idx[t]])
            grads = torch.autograd.grad(loss, list(m.parameters()))
            with torch.no_grad():
                for p, g in zip(m.parameters(), grads):
                    p -= 0.2 * g
        models.append(m.state_dict())
        sizes.append(len(client))
    weights = [s / sum(sizes) for s in sizes]
    assert info.client_sizes == tuple(sizes)
    state = {**sim.server_state["params"], **sim.server_state["norm_stats"]}
    for name, value in state.items():
        want = sum(w * m[name] for w, m in zip(weights, models))
        assert torch.allclose(value, want, atol=1e-12, rtol=1e-10), name
    assert set(sim.server_state["norm_stats"]) == {"1.running_mean", "1.running_var", "5.running_mean", "5.running_var"}


@pytest.mark.parametrize("policy", ["averaged", "local", "frozen"])
def test_vectorized_equals_sequential_under_every_policy(policy: str) -> None:
    fed, out = federation(), {}
    for executor in ("sequential", "vectorized"):
        sim = Simulation(fedavg(policy, clients_per_round=3), fed, seed=2, executor=executor, dtype=F64)
        for _ in range(3):
            sim.step()
        scores = evaluate(sim.algorithm, sim.server_state, sim.client_states, sim.federation, ["accuracy", "log_loss"])
        out[executor] = (sim.server_state, dict(sim.client_states), scores)
    (s1, c1, m1), (s2, c2, m2) = out["sequential"], out["vectorized"]
    leaves = lambda tree: torch.utils._pytree.tree_leaves(tree)  # noqa: E731
    assert all(torch.allclose(a, b, atol=1e-12, rtol=1e-10) for a, b in zip(leaves((s1, c1)), leaves((s2, c2))))
    assert m1.keys() == m2.keys() and all(abs(m1[k] - m2[k]) < 1e-9 for k in m1)
    initial = FunctionalModel(net(), init="module").init_stats(F64)
    moved = not torch.equal(s1["norm_stats"]["1.running_var"], initial["1.running_var"])
    assert moved == (policy == "averaged")  # local: the server's copy stays; frozen: nothing moves
    if policy == "local":
        own = [c1[k]["norm_stats"]["1.running_mean"] for k in range(4)]
        assert not torch.equal(own[0], own[1])  # every client its own statistics (FedBN)
        assert "test_accuracy" not in m1 and "personal_accuracy_mean" in m1  # no global model
    if policy == "frozen":
        assert all(torch.equal(c1[k]["norm_stats"]["1.running_var"], initial["1.running_var"]) for k in c1)


def test_frozen_trains_with_the_running_statistics() -> None:
    """Frozen: the training forward normalises with the running statistics (eval-mode BatchNorm),
    so its gradients are those of the module in eval() mode."""
    fed = federation(1)
    sim = Simulation(fedavg("frozen", local_steps=1, batch_size=4, lr=1.0), fed, seed=0, dtype=F64)
    sim.step()
    ctx = RoundContext(0, fed_info(sim.federation))
    idx = sim.algorithm.draw(ctx, 0, len(fed.clients[0]), client_generator(0, 0, 0))["batches"]
    m = net().double().eval()
    x, y = sim.federation.clients[0].x[idx[0]], sim.federation.clients[0].y[idx[0]]
    grads = torch.autograd.grad(nn.functional.cross_entropy(m(x), y), list(m.parameters()))
    for (name, p), g in zip(m.named_parameters(), grads):
        assert torch.allclose(sim.server_state["params"][name], p - g, atol=1e-12), name


def test_global_params_carry_the_statistics_and_predict_splits_them() -> None:
    sim = Simulation(fedavg(), federation(), seed=0)
    sim.step()
    params = sim.algorithm.global_params(sim.server_state)
    assert "1.running_mean" in params and "0.weight" in params  # state_dict-like
    module = net()
    module.load_state_dict(params, strict=False)
    module.eval()
    x = torch.randn(5, 1, 4, 4)
    assert torch.allclose(sim.algorithm.predict(params, x), module(x), atol=1e-5)


def test_bad_input_is_one_line_errors() -> None:
    plain = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(FedriskError, match=r"norm_stats = 'local' but Sequential has no BatchNorm layer"):
        FunctionalModel(plain, norm_stats="local")
    with pytest.raises(
        FedriskError, match=r"norm_stats = 'mean' is not allowed; allowed: 'averaged', 'local', 'frozen'"
    ):
        FunctionalModel(net(), norm_stats="mean")
    cases = [
        (
            nn.InstanceNorm2d(3, track_running_stats=True),
            r"layer '1' \(InstanceNorm2d\) keeps running statistics.*GroupNorm",
        ),
        (nn.Dropout(0.5), r"layer '1' \(Dropout\) draws from torch's global random generator.*module.eval\(\)"),
        (nn.BatchNorm2d(3, momentum=None), r"layer '1' \(BatchNorm2d\) has momentum=None"),
        (nn.LazyLinear(3), r"layer '1' \(LazyLinear\) has uninitialised \(lazy\) parameters"),
    ]
    for layer, message in cases:
        with pytest.raises(FedriskError, match=message) as info:
            FunctionalModel(nn.Sequential(nn.Conv2d(1, 3, 1), layer))
        assert "\n" not in str(info.value)
    FunctionalModel(nn.Sequential(nn.Dropout(0.5).eval(), nn.BatchNorm1d(3, track_running_stats=False)))


def test_a_deep_copy_of_a_wrapped_module_runs_as_its_own_plain_module() -> None:
    module = net()
    FunctionalModel(module)
    twin = copy.deepcopy(module).train()
    with torch.no_grad():
        twin[1].weight.fill_(2.0)
    x = torch.randn(6, 1, 4, 4)
    fresh = net().train()
    with torch.no_grad():
        fresh[1].weight.fill_(2.0)
    assert torch.allclose(twin(x), fresh(x), atol=1e-6)
    assert not torch.equal(twin[1].running_mean, module[1].running_mean)
