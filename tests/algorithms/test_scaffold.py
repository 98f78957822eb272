"""SCAFFOLD: exact convergence on heterogeneous least squares, control-variate invariants and
a step-by-step comparison with an independent implementation of Algorithm 1 (float64)."""

from __future__ import annotations

import pytest
import torch

from fedrisk.algorithms import ALGORITHMS, FedAvg, Scaffold
from fedrisk.algorithms.local import sample_batches
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation

D = 3
F64 = torch.float64


class Linear:
    """``f(x) = x @ w`` as a functional model (no bias, so the optimum has a closed form)."""

    def init_params(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"w": torch.randn(D, generator=gen, dtype=F64)}

    def apply(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return x @ params["w"]


def least_squares(sizes: tuple[int, ...], seed: int = 0) -> Federation:
    """Client k: rows shifted by k/2 and targets from its own ground truth w_k (heterogeneous)."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k, n in enumerate(sizes):
        a = torch.randn(n, D, generator=g, dtype=F64) + 0.5 * k
        w_k = 2.0 * torch.randn(D, generator=g, dtype=F64)
        clients.append(Samples(a, a @ w_k + 0.1 * torch.randn(n, generator=g, dtype=F64)))
    return Federation("least-squares", clients, num_classes=1)


def optimum(fed: Federation, weighting: str) -> torch.Tensor:
    """argmin sum_k p_k f_k(w), f_k(w) = ||A_k w - b_k||^2 / (2 n_k); p_k = 1/N or n_k/n."""
    hess, rhs = torch.zeros(D, D, dtype=F64), torch.zeros(D, dtype=F64)
    for s in fed.clients:
        p = 1.0 / fed.num_clients if weighting == "uniform" else len(s) / sum(fed.client_sizes)
        hess += p * s.x.T @ s.x / len(s)
        rhs += p * s.x.T @ s.y / len(s)
    return torch.linalg.solve(hess, rhs)


def full_batch(alg_cls, batch_size: int, **kw):
    """Full-batch local steps: with ``shuffle`` and batch = a multiple of every client size,
    each batch holds every row equally often, so each step uses the exact local gradient."""
    return alg_cls(
        model=Linear(),
        loss=mean_squared_error,
        lr=0.05,
        local_steps=10,
        batch_size=batch_size,
        sampling="shuffle",
        **kw,
    )


def error_after(alg, fed: Federation, rounds: int, target: torch.Tensor) -> float:
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    for _ in range(rounds):
        sim.step()
    return float((sim.server_state["params"]["w"] - target).norm())


@pytest.mark.parametrize("option", ["I", "II"])
def test_scaffold_reaches_the_global_optimum_where_fedavg_drifts(option: str) -> None:
    fed = least_squares((10, 10, 10, 10))
    target = optimum(fed, "uniform")
    assert error_after(full_batch(Scaffold, 10, control_option=option), fed, 60, target) < 1e-6
    assert error_after(full_batch(FedAvg, 10, weighting="uniform"), fed, 60, target) > 1e-2


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_weighting_picks_the_matching_optimum(weighting: str) -> None:
    fed = least_squares((5, 10, 20))  # batch 20: every row of every client equally often
    uniform, pooled = optimum(fed, "uniform"), optimum(fed, "samples")
    assert float((uniform - pooled).norm()) > 1e-2  # the two targets are distinguishable
    err = error_after(full_batch(Scaffold, 20, weighting=weighting), fed, 60, optimum(fed, weighting))
    assert err < 1e-6


def mean_client_control(sim: Simulation) -> torch.Tensor:
    n = sim.federation.num_clients
    return sum(sim.client_states[k]["control"]["w"] for k in range(n)) / n


@pytest.mark.parametrize("option", ["I", "II"])
@pytest.mark.parametrize("per_round", [None, 2])
def test_server_control_is_the_mean_of_client_controls(option: str, per_round: int | None) -> None:
    fed = least_squares((6, 8, 10, 12))
    alg = Scaffold(
        model=Linear(),
        loss=mean_squared_error,
        lr=0.05,
        local_steps=4,
        batch_size=3,
        control_option=option,
        clients_per_round=per_round,
    )
    sim = Simulation(alg, fed, seed=1, dtype=F64)
    for _ in range(5):
        sim.step()
        c = sim.server_state["control"]["w"]
        assert torch.allclose(c, mean_client_control(sim), rtol=0, atol=1e-12)
        assert float(c.norm()) > 1e-3  # non-trivial


def test_option_one_stores_the_local_gradient_at_the_server_model() -> None:
    fed = least_squares((10, 10, 10))
    sim = Simulation(full_batch(Scaffold, 10, control_option="I"), fed, seed=0, dtype=F64)
    for _ in range(2):
        x = sim.server_state["params"]["w"]
        sim.step()
        for k, s in enumerate(sim.federation.clients):
            grad = s.x.T @ (s.x @ x - s.y) / len(s)
            assert torch.allclose(sim.client_states[k]["control"]["w"], grad, rtol=0, atol=1e-12)


def reference_scaffold(fed, seed, rounds_clients, *, lr, steps, bs, option, eta_g, x0):
    """Algorithm 1 of Karimireddy et al. written out with explicit least-squares gradients."""
    n_clients = fed.num_clients
    x, c = x0.clone(), torch.zeros(D, dtype=F64)
    cs = [torch.zeros(D, dtype=F64) for _ in range(n_clients)]

    def grad(k: int, w: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        a, b = fed.clients[k].x[rows], fed.clients[k].y[rows]
        return a.T @ (a @ w - b) / len(rows)

    for r, clients in enumerate(rounds_clients):
        dys, dcs = [], []
        for k in clients:
            gen = client_generator(seed, r, k)
            idx = sample_batches(gen, fed.client_sizes[k], steps, bs)
            y = x.clone()
            for t in range(steps):
                y = y - lr * (grad(k, y, idx[t]) - cs[k] + c)
            if option == "I":
                c_plus = grad(k, x, sample_batches(gen, fed.client_sizes[k], 1, bs)[0])
            else:
                c_plus = cs[k] - c + (x - y) / (steps * lr)
            dys.append(y - x)
            dcs.append(c_plus - cs[k])
            cs[k] = c_plus
        x = x + eta_g * sum(dys) / len(clients)
        c = c + (len(clients) / n_clients) * (sum(dcs) / len(clients))
    return x, c, cs


@pytest.mark.parametrize("option", ["I", "II"])
def test_matches_algorithm_one_step_by_step(option: str) -> None:
    fed = least_squares((5, 7, 9, 11, 13))
    alg = Scaffold(
        model=Linear(),
        loss=mean_squared_error,
        lr=0.04,
        local_steps=3,
        batch_size=4,
        control_option=option,
        global_lr=1.5,
        clients_per_round=3,
    )
    sim = Simulation(alg, fed, seed=7, dtype=F64)
    x0 = sim.server_state["params"]["w"]
    chosen = [sim.step().clients for _ in range(4)]
    x, c, cs = reference_scaffold(sim.federation, 7, chosen, lr=0.04, steps=3, bs=4, option=option, eta_g=1.5, x0=x0)
    assert torch.allclose(sim.server_state["params"]["w"], x, rtol=0, atol=1e-12)
    assert torch.allclose(sim.server_state["control"]["w"], c, rtol=0, atol=1e-12)
    for k in range(5):
        assert torch.allclose(sim.client_states[k]["control"]["w"], cs[k], rtol=0, atol=1e-12)
    assert float((x - x0).norm()) > 1e-2


def test_first_round_with_zero_controls_is_uniform_fedavg() -> None:
    fed = least_squares((5, 7, 9))
    kw = {"model": Linear(), "loss": mean_squared_error, "lr": 0.05, "local_steps": 3, "batch_size": 4}
    a = Simulation(Scaffold(**kw), fed, seed=2, dtype=F64)
    b = Simulation(FedAvg(weighting="uniform", **kw), fed, seed=2, dtype=F64)
    a.step()
    b.step()
    assert torch.allclose(a.server_state["params"]["w"], b.server_state["params"]["w"], rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype,itemsize", [(torch.float32, 4), (F64, 8)])
def test_ledger_counts_model_and_control_both_ways(dtype: torch.dtype, itemsize: int) -> None:
    fed = least_squares((4, 5, 6))
    alg = Scaffold(model=Linear(), loss=mean_squared_error, lr=0.05, batch_size=2, clients_per_round=2)
    sim = Simulation(alg, fed, seed=0, dtype=dtype)
    report = sim.step()
    assert report.bytes_down == report.bytes_up == 2 * 2 * D * itemsize


def test_registered() -> None:
    assert ALGORITHMS.get("scaffold") is Scaffold


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"control_option": "III"}, r"control_option 'III'.*I, II"),
        ({"weighting": "size"}, r"weighting 'size'.*samples, uniform"),
        ({"global_lr": 0.0}, r"global_lr = 0.0"),
        ({"lr": -1.0}, r"lr = -1.0"),
        ({"sampling": "bootstrap"}, r"sampling 'bootstrap'"),
    ],
)
def test_bad_hyper_parameters(kwargs: dict, needle: str) -> None:
    with pytest.raises(FedriskError, match=needle):
        Scaffold(model=Linear(), loss=mean_squared_error, **kwargs)


def test_too_many_clients_per_round() -> None:
    alg = Scaffold(model=Linear(), loss=mean_squared_error, clients_per_round=5)
    with pytest.raises(FedriskError, match=r"^clients_per_round = 5 is out of range"):
        Simulation(alg, least_squares((3, 3)))


# ----------------------------------------------------------------------------- pinned by mutation testing
# Each test below failed on a mutant of `scripts/mutation.py algorithms` that the tests above
# let survive (docs/reliability.md, "The algorithms scope").
def test_first_round_with_samples_weighting_is_sample_weighted_fedavg() -> None:
    fed = least_squares((3, 7, 12))  # unequal sizes, so the two weightings differ
    kw = {"model": Linear(), "loss": mean_squared_error, "lr": 0.05, "local_steps": 3, "batch_size": 4}
    a = Simulation(Scaffold(weighting="samples", **kw), fed, seed=2, dtype=F64)
    b = Simulation(FedAvg(weighting="samples", **kw), fed, seed=2, dtype=F64)
    u = Simulation(FedAvg(weighting="uniform", **kw), fed, seed=2, dtype=F64)
    for sim in (a, b, u):
        sim.step()
    assert torch.allclose(a.server_state["params"]["w"], b.server_state["params"]["w"], rtol=0, atol=1e-14)
    assert float((a.server_state["params"]["w"] - u.server_state["params"]["w"]).norm()) > 1e-3


def test_client_sampling_follows_the_seed_not_the_global_rng() -> None:
    fed = least_squares((4, 4, 4, 4, 4))
    chosen = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        alg = Scaffold(model=Linear(), loss=mean_squared_error, lr=0.05, batch_size=2, clients_per_round=2)
        sim = Simulation(alg, fed, seed=0, dtype=F64)
        chosen.append([sim.step().clients for _ in range(6)])
    assert chosen[0] == chosen[1]
    assert len({tuple(c) for c in chosen[0]}) > 1


def test_one_client_per_round_and_the_loss_metric() -> None:
    alg = Scaffold(model=Linear(), loss=mean_squared_error, lr=0.05, batch_size=2, clients_per_round=1)
    report = Simulation(alg, least_squares((4, 4, 4)), seed=0, dtype=F64).step()
    assert len(report.clients) == 1 and set(report.train_metrics) == {"loss"}
    with pytest.raises(FedriskError, match=r"^clients_per_round = 0 is out of range"):
        Scaffold(model=Linear(), loss=mean_squared_error, clients_per_round=0)  # at construction, before any data


def test_the_global_model_is_the_server_model() -> None:
    sim = Simulation(Scaffold(model=Linear(), loss=mean_squared_error, lr=0.05, batch_size=2), least_squares((6, 8)))
    sim.step()
    assert sim.algorithm.global_params(sim.server_state) is sim.server_state["params"]  # what evaluation scores
