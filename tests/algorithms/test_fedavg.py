"""FedAvg / FedProx against independent reference computations (float64).

The reference below re-implements one round with plain ``torch.autograd`` (not the library's
``sgd_steps``), on the minibatch indices that the client draws from its own generator.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from fedrisk.algorithms import FedAvg, FedProx
from fedrisk.algorithms.base import sample_clients
from fedrisk.algorithms.local import sample_batches
from fedrisk.algorithms.server_opt import chain, server_lr, server_momentum
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator, server_generator
from fedrisk.runtime.simulation import Simulation

D, H, C = 4, 5, 3
F64 = torch.float64


def mlp() -> FunctionalModel:
    return FunctionalModel(nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, C)))


def federation(sizes: tuple[int, ...], seed: int = 0) -> Federation:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k, n in enumerate(sizes):  # heterogeneous: shifted features, skewed labels
        x = torch.randn(n, D, generator=g, dtype=F64) + k
        y = torch.randint(0, C, (n,), generator=g) if k % 2 == 0 else torch.full((n,), k % C)
        clients.append(Samples(x, y))
    return Federation("toy", clients, num_classes=C)


def local_sgd(model, anchor, samples, idx, lr, mu=0.0):
    """E steps of (proximal) SGD with plain autograd; returns the params and the mean loss."""
    w = {k: v.clone() for k, v in anchor.items()}
    losses = []
    for t in range(idx.shape[0]):
        leaves = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        loss = cross_entropy(model.apply(leaves, samples.x[idx[t]]), samples.y[idx[t]])
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        w = {k: w[k] - lr * (grads[k] + mu * (w[k] - anchor[k])) for k in w}
        losses.append(float(loss.detach()))
    return w, sum(losses) / len(losses)


def reference_round(
    model, params, fed, seed, r, clients, *, lr, steps, bs, weighting, mu=0.0, sampling="with_replacement"
):
    """The averaged client model of round ``r`` (before the server step)."""
    locals_, sizes = {}, {}
    for k in clients:
        idx = sample_batches(client_generator(seed, r, k), fed.client_sizes[k], steps, bs, sampling)
        locals_[k], _ = local_sgd(model, params, fed.clients[k], idx, lr, mu)
        sizes[k] = fed.client_sizes[k] if weighting == "samples" else 1.0
    total = sum(sizes.values())
    return {name: sum(sizes[k] * locals_[k][name] for k in clients) / total for name in params}


def assert_close(a: dict, b: dict, tol: float = 1e-12) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=tol), (k, (a[k] - b[k]).abs().max())


def test_one_client_fedavg_is_plain_torch_sgd() -> None:
    model = mlp()
    fed = federation((23,))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.3, local_steps=3, batch_size=4)
    sim = Simulation(alg, fed, seed=5, dtype=F64)
    net = copy.deepcopy(model.module).double()
    net.load_state_dict(sim.server_state["params"])
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    x, y = sim.federation.clients[0].x, sim.federation.clients[0].y
    for r in range(4):
        idx = sample_batches(client_generator(5, r, 0), 23, 3, 4)
        losses = []
        for t in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x[idx[t]]), y[idx[t]])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        report = sim.step()
        assert_close(sim.server_state["params"], {k: v.detach() for k, v in net.named_parameters()})
        assert report.train_metrics["loss"] == pytest.approx(sum(losses) / 3, abs=1e-12)


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_weighting_matches_reference(weighting: str) -> None:
    model, fed = mlp(), federation((5, 15, 40))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, weighting=weighting)
    sim = Simulation(alg, fed, seed=1, dtype=F64)
    w0 = sim.server_state["params"]
    sim.step()
    expected = reference_round(model, w0, sim.federation, 1, 0, [0, 1, 2], lr=0.2, steps=2, bs=3, weighting=weighting)
    assert_close(sim.server_state["params"], expected)


def test_uniform_and_sample_weighting_differ_by_the_weights() -> None:
    model, fed = mlp(), federation((5, 15, 40))
    out = {}
    for weighting in ("samples", "uniform"):
        alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, weighting=weighting)
        sim = Simulation(alg, fed, seed=1, dtype=F64)
        sim.step()
        out[weighting] = sim.server_state["params"]
    # the two averages are p-weighted means of the same three client models: their difference
    # is sum_k (n_k/n - 1/3) w_k, which is non-zero for unequal sizes
    diff = max(float((out["samples"][k] - out["uniform"][k]).abs().max()) for k in out["samples"])
    assert diff > 1e-3
    # equal client sizes: the two weightings coincide
    fed_eq = federation((10, 10, 10))
    same = {}
    for weighting in ("samples", "uniform"):
        alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, weighting=weighting)
        sim = Simulation(alg, fed_eq, seed=1, dtype=F64)
        sim.step()
        same[weighting] = sim.server_state["params"]
    assert_close(same["samples"], same["uniform"], 1e-14)


def test_fedprox_with_mu_zero_is_fedavg_exactly() -> None:
    model, fed = mlp(), federation((7, 9, 12))
    states = []
    for alg in (
        FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4),
        FedProx(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4, mu=0.0),
    ):
        sim = Simulation(alg, fed, seed=3, dtype=F64)
        for _ in range(3):
            sim.step()
        states.append(sim.server_state["params"])
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k])


def test_fedprox_with_mu_matches_reference_and_differs_from_fedavg() -> None:
    model, fed = mlp(), federation((7, 9, 12))
    prox = Simulation(
        FedProx(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4, mu=0.5),
        fed,
        seed=3,
        dtype=F64,
    )
    avg = Simulation(
        FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4), fed, seed=3, dtype=F64
    )
    w0 = prox.server_state["params"]
    prox.step()
    avg.step()
    expected = reference_round(
        model, w0, prox.federation, 3, 0, [0, 1, 2], lr=0.2, steps=3, bs=4, weighting="samples", mu=0.5
    )
    assert_close(prox.server_state["params"], expected)
    diff = max(float((prox.server_state["params"][k] - avg.server_state["params"][k]).abs().max()) for k in w0)
    assert diff > 1e-4


def selections(seed: int, rounds: int = 8) -> list[list[int]]:
    model, fed = mlp(), federation((4,) * 7)
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.1, batch_size=2, clients_per_round=3)
    sim = Simulation(alg, fed, seed=seed, dtype=F64)
    return [sim.step().clients for _ in range(rounds)]


def test_partial_participation_is_deterministic_per_seed() -> None:
    a, b, c = selections(0), selections(0), selections(1)
    assert a == b
    assert a != c
    for r, chosen in enumerate(a):
        assert len(chosen) == 3 and len(set(chosen)) == 3 and chosen == sorted(chosen)
        assert chosen == sample_clients(server_generator(0, r, "configure"), 7, 3)
    assert len({k for chosen in a for k in chosen}) > 3  # the selection changes over rounds


def test_partial_participation_averages_only_the_selected_clients() -> None:
    model, fed = mlp(), federation((4, 6, 8, 10, 12))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, clients_per_round=2)
    sim = Simulation(alg, fed, seed=2, dtype=F64)
    for r in range(3):
        w = sim.server_state["params"]
        report = sim.step()
        expected = reference_round(
            model, w, sim.federation, 2, r, report.clients, lr=0.2, steps=2, bs=3, weighting="samples"
        )
        assert_close(sim.server_state["params"], expected)


@pytest.mark.parametrize("kind", ["lr", "momentum", "nesterov_lr"])
def test_server_optimisers(kind: str) -> None:
    model, fed = mlp(), federation((6, 8, 10))
    opts = {
        "lr": server_lr(1.7),
        "momentum": server_momentum(0.6),
        "nesterov_lr": chain(server_momentum(0.6, nesterov=True), server_lr(0.5)),
    }
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, server_opt=opts[kind])
    sim = Simulation(alg, fed, seed=4, dtype=F64)
    w = sim.server_state["params"]
    m = {k: torch.zeros_like(v) for k, v in w.items()}
    for r in range(3):
        sim.step()
        avg = reference_round(model, w, sim.federation, 4, r, [0, 1, 2], lr=0.2, steps=2, bs=3, weighting="samples")
        delta = {k: avg[k] - w[k] for k in w}
        if kind == "lr":
            step = {k: 1.7 * delta[k] for k in w}
        else:
            m = {k: 0.6 * m[k] + delta[k] for k in w}
            step = m if kind == "momentum" else {k: 0.5 * (0.6 * m[k] + delta[k]) for k in w}
        w = {k: w[k] + step[k] for k in w}
        assert_close(sim.server_state["params"], w)


@pytest.mark.parametrize("dtype,itemsize", [(torch.float32, 4), (F64, 8)])
def test_ledger_counts_the_model_both_ways(dtype: torch.dtype, itemsize: int) -> None:
    model, fed = mlp(), federation((4, 5, 6, 7))
    num_params = D * H + H + H * C + C
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.1, batch_size=2, clients_per_round=3)
    sim = Simulation(alg, fed, seed=0, dtype=dtype)
    for _ in range(4):
        report = sim.step()
        assert report.bytes_down == report.bytes_up == 3 * itemsize * num_params
    assert sim.ledger.total_down == sim.ledger.total_up == 4 * 3 * itemsize * num_params
    for row in sim.ledger.rounds:
        assert set(row["up"].values()) == {itemsize * num_params}
        assert set(row["down"].values()) == {itemsize * num_params}
    assert sum(sim.ledger.per_client_up.values()) == sim.ledger.total_up


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"lr": 0.0}, "lr"),
        ({"local_steps": 0}, "local_steps"),
        ({"weighting": "size"}, "weighting"),
        ({"sampling": "bootstrap"}, "sampling"),
        ({"clients_per_round": 0}, "clients_per_round"),
    ],
)
def test_bad_hyper_parameters(kwargs: dict, needle: str) -> None:
    with pytest.raises(FedriskError, match=needle):
        FedAvg(model=mlp(), loss=cross_entropy, **kwargs)


def test_more_clients_per_round_than_clients_is_rejected() -> None:
    alg = FedAvg(model=mlp(), loss=cross_entropy, clients_per_round=4)
    with pytest.raises(FedriskError, match=r"clients_per_round = 4 .*\[1, 3\]"):
        Simulation(alg, federation((3, 3, 3)))


def test_default_metrics_include_log_loss_on_logits() -> None:
    """Evaluation scores log-loss from logits (softmax heads) and from probabilities alike."""
    import torch

    from fedrisk.data.federation import Federation, Samples
    from fedrisk.metrics import log_loss
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.runtime.evaluation import score_split

    g = torch.Generator().manual_seed(0)
    s = Samples(torch.randn(50, 4, generator=g), torch.randint(0, 3, (50,), generator=g))
    fed = Federation("toy", [s], 3, test=s)
    model = FunctionalModel(build_model("logreg", (4,), 3))
    alg = FedAvg(model=model, loss=cross_entropy)
    params = model.init_params(0)
    logits = model.apply(params, s.x)
    assert logits.min() < 0  # really logits
    got = score_split(alg, params, fed.test, ["log_loss", "accuracy"])
    assert got["log_loss"] == pytest.approx(log_loss(logits, s.y, from_logits=True))
    assert got["log_loss"] == pytest.approx(float(cross_entropy(logits, s.y)), rel=1e-5)


def test_bucketing_under_fedavg_draws_new_buckets_every_round() -> None:
    """FedAvg hands the round's server generator to its aggregator: bucketing (a randomised
    pre-aggregation) must not reuse one permutation in every round."""
    from fedrisk.aggregators.robust import CoordinateMedian

    seen: list[int] = []

    class Spy(CoordinateMedian):
        def __call__(self, replies, key, weights=None, gen=None):  # type: ignore[no-untyped-def]
            assert gen is not None, "FedAvg did not pass the round's generator"
            seen.append(gen.initial_seed())
            return super().__call__(replies, key, weights, gen=gen)

    spy = Spy(pre="bucketing", bucket_size=2)
    alg = FedAvg(model=mlp(), loss=cross_entropy, lr=0.1, local_steps=1, batch_size=4, aggregator=spy)
    sim = Simulation(alg, federation((8, 8, 8, 8)), seed=0, dtype=torch.float64)
    for _ in range(3):
        sim.step()
    assert len(seen) == 3 and len(set(seen)) == 3  # one generator per round


# ----------------------------------------------------------------------------- pinned by mutation testing
# Each test below failed on a mutant of `scripts/mutation.py algorithms` that the tests above
# let survive (docs/reliability.md, "The algorithms scope").
def test_shuffle_sampling_reaches_the_local_steps() -> None:
    model, fed = mlp(), federation((6, 9))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=3, batch_size=4, sampling="shuffle")
    sim = Simulation(alg, fed, seed=3, dtype=F64)
    w = sim.server_state["params"]
    sim.step()
    kw = {"lr": 0.2, "steps": 3, "bs": 4, "weighting": "samples"}
    assert_close(sim.server_state["params"], reference_round(model, w, fed, 3, 0, [0, 1], sampling="shuffle", **kw))
    plain = reference_round(model, w, fed, 3, 0, [0, 1], **kw)
    assert max(float((plain[k] - sim.server_state["params"][k]).abs().max()) for k in w) > 1e-3


def test_a_custom_server_optimiser_sees_the_current_params() -> None:
    """Decoupled weight decay on the server: the step reads the params it is applied to."""
    from fedrisk.algorithms.server_opt import ServerOpt

    def update(delta, state, params):  # type: ignore[no-untyped-def]
        return {k: delta[k] - 0.1 * params[k] for k in delta}, state

    decay = ServerOpt(lambda params: {}, update)
    model, fed = mlp(), federation((5, 7))
    alg = FedAvg(model=model, loss=cross_entropy, lr=0.2, local_steps=2, batch_size=3, server_opt=decay)
    sim = Simulation(alg, fed, seed=1, dtype=F64)
    w = sim.server_state["params"]
    sim.step()
    avg = reference_round(model, w, fed, 1, 0, [0, 1], lr=0.2, steps=2, bs=3, weighting="samples")
    assert_close(sim.server_state["params"], {k: avg[k] - 0.1 * w[k] for k in w})


def test_fedavg_hands_the_client_state_to_its_correction_and_keeps_it() -> None:
    """A subclass with a per-client correction: its state reaches ``local_correction`` and comes
    back unchanged (FedAvg's own update does not touch it)."""
    from fedrisk.tree import tree_map

    class AnchoredToStart(FedAvg):  # FedProx's pull, towards the client's first model
        def init_client(self, ctx, client, params):  # type: ignore[no-untyped-def]
            return {"anchor": params}

        def local_correction(self, payload, state):  # type: ignore[no-untyped-def]
            return lambda params, g: tree_map(lambda gi, p, a: gi + 0.5 * (p - a), g, params, state["anchor"])

    model, fed = mlp(), federation((5, 7))
    kw = {"model": model, "loss": cross_entropy, "lr": 0.2, "local_steps": 2, "batch_size": 3}
    sim = Simulation(AnchoredToStart(**kw), fed, seed=2, dtype=F64)
    prox = Simulation(FedProx(mu=0.5, **kw), fed, seed=2, dtype=F64)
    start = sim.server_state["params"]
    sim.step()
    prox.step()
    assert_close(sim.server_state["params"], prox.server_state["params"])  # round 0: anchor = broadcast
    sim.step()
    for k in range(2):
        assert_close(sim.client_states[k]["anchor"], start, tol=0.0)


def test_fedprox_mu_is_checked() -> None:
    for bad in (-0.5, math.nan):
        with pytest.raises(FedriskError, match=r"^mu = "):
            FedProx(model=mlp(), loss=cross_entropy, mu=bad)
    with pytest.raises(FedriskError, match=r"^unknown weighting 'size'. Valid choices: samples, uniform$"):
        FedAvg(model=mlp(), loss=cross_entropy, weighting="size")


@pytest.mark.parametrize("cls", [FedAvg, FedProx])
def test_evaluation_scores_the_server_model(cls) -> None:
    from fedrisk.runtime.evaluation import evaluate, score_split

    base = federation((6, 8))
    fed = Federation("toy", base.clients, num_classes=C, test=base.clients[1])
    sim = Simulation(cls(model=mlp(), loss=cross_entropy, lr=0.2, batch_size=3), fed, seed=0, dtype=F64)
    sim.step()
    got = evaluate(sim.algorithm, sim.server_state, sim.client_states, fed, ["accuracy"], personal=False)
    expected = score_split(sim.algorithm, sim.server_state["params"], fed.test, ["accuracy"])
    assert got == {"test_accuracy": expected["accuracy"]}
