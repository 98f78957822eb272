"""Personalised baselines: localised FedAvg (fine-tuning), Per-FedAvg (FO / HF), pFedMe, Ditto, APFL.

Each update is checked against a hand-written step on least squares (exact Hessians), the
reductions to FedAvg / local training, bad input, and a short run on PERM's two clusters.
Executor equivalence is covered for every registered algorithm by ``tests/runtime``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms import APFL, Ditto, FedAvg, LocalizedFedAvg, PerFedAvg, PFedMe
from fedrisk.algorithms.base import RoundContext
from fedrisk.algorithms.local import sample_batch, sample_batches
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.sources.synthetic import perm_two_cluster_federation
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy, mean_squared_error
from fedrisk.rng import client_generator
from fedrisk.runtime.evaluation import evaluate
from fedrisk.runtime.simulation import Simulation, fed_info

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64, Linear


def least_squares(sizes: tuple[int, ...] = (8, 10, 12)) -> Federation:
    return _ls.least_squares(sizes, seed=0)


def grad(w: torch.Tensor, s: Samples, idx: torch.Tensor) -> torch.Tensor:
    x, y = s.x[idx], s.y[idx]
    return x.T @ (x @ w - y) / len(idx)


def hessian(s: Samples, idx: torch.Tensor) -> torch.Tensor:
    x = s.x[idx]
    return x.T @ x / len(idx)


COMMON = {"model": Linear(), "loss": mean_squared_error, "lr": 0.05, "local_steps": 3, "batch_size": 4}


def one_round(alg, fed: Federation) -> tuple[Simulation, torch.Tensor]:
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    w0 = sim.server_state["params"]["w"].clone()
    sim.step()
    return sim, w0


def draws(alg, fed: Federation, k: int) -> dict:
    from fedrisk.algorithms.base import RoundContext
    from fedrisk.runtime.simulation import fed_info

    ctx = RoundContext(0, fed_info(fed))
    return alg.draw(ctx, k, fed.client_sizes[k], client_generator(0, round=0, client=k))


def test_localized_fedavg_trains_like_fedavg_and_fine_tunes_the_received_model() -> None:
    fed = least_squares()
    alg = LocalizedFedAvg(**COMMON, finetune_steps=4, finetune_lr=0.2)
    sim, w0 = one_round(alg, fed)
    ref, _ = one_round(FedAvg(**COMMON), fed)
    assert torch.equal(sim.server_state["params"]["w"], ref.server_state["params"]["w"])
    for k, s in enumerate(fed.clients):
        idx = draws(alg, fed, k)["finetune"]
        w = w0.clone()
        for t in range(4):
            w = w - 0.2 * grad(w, s, idx[t])
        torch.testing.assert_close(alg.personal_params(sim.server_state, sim.client_states[k], k)["w"], w)
    no_ft, w0 = one_round(LocalizedFedAvg(**COMMON, finetune_steps=0), fed)
    assert all(torch.equal(no_ft.client_states[k]["personal"]["w"], w0) for k in range(3))


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_step_matches_the_maml_update(variant: str) -> None:
    """On least squares the finite-difference Hessian-vector product is exact: HF = second-order MAML."""
    fed = least_squares()
    a, b = 0.1, 0.05
    alg = PerFedAvg(**{**COMMON, "lr": b}, inner_lr=a, variant=variant)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    w0 = sim.server_state["params"]["w"].clone()
    report = sim.step()
    expected, losses = [], []
    for k, s in enumerate(fed.clients):
        d = draws(alg, fed, k)
        w = w0.clone()
        for t in range(3):
            i1, i2, i3 = d["batches"][3 * t], d["batches"][3 * t + 1], d["batches"][3 * t + 2]
            losses.append(0.5 * float(((s.x[i1] @ w - s.y[i1]) ** 2).mean()))  # f(w; D) before the step
            g = grad(w - a * grad(w, s, i1), s, i2)
            if variant == "hf":
                g = g - a * hessian(s, i3) @ g
            w = w - b * g
        expected.append(w)
        personal = w0 - a * grad(w0, s, d["personal"])
        torch.testing.assert_close(sim.client_states[k]["personal"]["w"], personal)
    sizes = torch.tensor(fed.client_sizes, dtype=F64)
    mean = sum(n * w for n, w in zip(sizes, expected)) / sizes.sum()
    torch.testing.assert_close(sim.server_state["params"]["w"], mean, rtol=1e-9, atol=1e-9)
    assert report.train_metrics["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_pfedme_step_and_server_mixing(beta: float) -> None:
    fed = least_squares()
    lam, plr, K = 2.0, 0.1, 4
    alg = PFedMe(**COMMON, lam=lam, personal_lr=plr, inner_steps=K, beta=beta)
    sim, w0 = one_round(alg, fed)
    ws = []
    for k, s in enumerate(fed.clients):
        idx = draws(alg, fed, k)["batches"]
        w = theta = w0.clone()
        for t in range(3):
            for _ in range(K):
                theta = theta - plr * (grad(theta, s, idx[t]) + lam * (theta - w))
            w = w - 0.05 * lam * (w - theta)
        ws.append(w)
        torch.testing.assert_close(sim.client_states[k]["personal"]["w"], theta)
    sizes = torch.tensor(fed.client_sizes, dtype=F64)
    mean = sum(n * w for n, w in zip(sizes, ws)) / sizes.sum()
    torch.testing.assert_close(sim.server_state["params"]["w"], (1 - beta) * w0 + beta * mean)


def test_pfedme_hands_the_rounds_generator_to_a_randomised_aggregator() -> None:
    """A robust rule such as bucketing draws from the server's generator of the round; pFedMe's
    mixing step must pass it on (without it bucketing falls back to one fixed permutation)."""
    from fedrisk.aggregators.base import WeightedMean

    seen = []

    class Recording(WeightedMean):
        def __call__(self, replies, key, weights=None, gen=None):
            seen.append(gen)
            return super().__call__(replies, key, weights, gen)

    sim = Simulation(PFedMe(**COMMON, beta=0.5, aggregator=Recording()), least_squares(), seed=0, dtype=F64)
    for _ in range(2):
        sim.step()
    assert len(seen) == 2 and all(isinstance(g, torch.Generator) for g in seen)


def test_ditto_personal_model_is_pulled_towards_the_received_global_model() -> None:
    fed = least_squares()
    lam, plr = 0.5, 0.1
    alg = Ditto(**COMMON, lam=lam, personal_lr=plr, personal_steps=2)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    ref = Simulation(FedAvg(**COMMON), fed, seed=0, dtype=F64)
    v = {k: sim.client_states[k]["personal"]["w"].clone() for k in range(3)}
    for r in range(2):
        w_r = sim.server_state["params"]["w"].clone()
        sim.step()
        ref.step()
        for k, s in enumerate(fed.clients):
            from fedrisk.algorithms.base import RoundContext
            from fedrisk.runtime.simulation import fed_info

            idx = alg.draw(RoundContext(r, fed_info(fed)), k, len(s), client_generator(0, round=r, client=k))[
                "personal"
            ]
            for t in range(2):
                v[k] = v[k] - plr * (grad(v[k], s, idx[t]) + lam * (v[k] - w_r))
            torch.testing.assert_close(sim.client_states[k]["personal"]["w"], v[k])
    assert torch.equal(sim.server_state["params"]["w"], ref.server_state["params"]["w"])  # w is FedAvg's


def test_apfl_reductions_and_adaptive_mixing() -> None:
    fed = least_squares()
    # a = 0: the personal model is the global model, and w follows FedAvg exactly
    sim, _ = one_round(APFL(**COMMON, mix=0.0), fed)
    ref, _ = one_round(FedAvg(**COMMON), fed)
    assert torch.equal(sim.server_state["params"]["w"], ref.server_state["params"]["w"])
    alg0 = sim.algorithm
    assert torch.equal(
        alg0.personal_params(sim.server_state, sim.client_states[1], 1)["w"], ref.server_state["params"]["w"]
    )
    # a = 1 fixed: v is local SGD on f_k
    alg = APFL(**COMMON, mix=1.0)
    sim, w0 = one_round(alg, fed)
    for k, s in enumerate(fed.clients):
        idx = draws(alg, fed, k)["batches"]
        v = w0.clone()
        for t in range(3):
            v = v - 0.05 * grad(v, s, idx[t])
        torch.testing.assert_close(sim.client_states[k]["v"]["w"], v)
    # adaptive a: moves, stays in [0, 1], and follows <v - w, grad f(v_bar)> in its first step
    alg = APFL(**{**COMMON, "local_steps": 1}, mix=0.5, mix_lr=0.3)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    sim.client_states[0]["v"] = {"w": sim.client_states[0]["v"]["w"] + 1.0}
    v0, w0 = sim.client_states[0]["v"]["w"].clone(), sim.server_state["params"]["w"].clone()
    sim.step()
    idx = draws(alg, fed, 0)["batches"][0]
    a1 = (0.5 - 0.3 * torch.dot(v0 - w0, grad(0.5 * v0 + 0.5 * w0, fed.clients[0], idx))).clamp(0, 1)
    torch.testing.assert_close(sim.client_states[0]["mix"], a1)
    for _ in range(5):
        sim.step()
    assert all(0.0 <= float(sim.client_states[k]["mix"]) <= 1.0 for k in range(3))


@pytest.mark.parametrize("sampling", ["with_replacement", "shuffle"])
def test_each_baseline_draws_its_batches_in_its_documented_order(sampling: str) -> None:
    """From the client's generator, in this order: FedAvg's K local batches, then the
    fine-tuning batches (localised FedAvg) or the personal batches (Ditto); Per-FedAvg draws
    3K batches (D, D', D'' per step) and one personalisation batch."""
    fed, B = least_squares(), 4
    common = {**COMMON, "sampling": sampling}
    for k, n in enumerate(fed.client_sizes):

        def gen(k: int = k):
            return client_generator(0, round=1, client=k)

        g = gen()
        fine = LocalizedFedAvg(**common, finetune_steps=5)
        expected = {"batches": sample_batches(g, n, 3, B, sampling), "finetune": sample_batches(g, n, 5, B, sampling)}
        cases = [(fine, expected)]
        g = gen()
        ditto = Ditto(**common, personal_steps=2)
        expected = {"batches": sample_batches(g, n, 3, B, sampling), "personal": sample_batches(g, n, 2, B, sampling)}
        cases.append((ditto, expected))
        g = gen()
        maml = PerFedAvg(**common)
        expected = {"batches": sample_batches(g, n, 9, B, sampling), "personal": sample_batch(g, n, B, sampling)}
        cases.append((maml, expected))
        for alg, want in cases:
            got = alg.draw(RoundContext(1, fed_info(fed)), k, n, gen())
            assert got.keys() == want.keys(), alg.name
            for key in want:
                assert torch.equal(got[key], want[key]), (alg.name, key)


@pytest.mark.parametrize(
    ("cls", "key", "value", "allowed"),
    [
        (LocalizedFedAvg, "finetune_steps", -1, "[0, inf)"),
        (LocalizedFedAvg, "finetune_lr", 0.0, "(0.0, inf)"),
        (PerFedAvg, "inner_lr", 0.0, "(0.0, inf)"),
        (PerFedAvg, "hf_delta", 0.0, "(0.0, inf)"),
        (PFedMe, "lam", 0.0, "(0.0, inf)"),
        (PFedMe, "personal_lr", 0.0, "(0.0, inf)"),
        (PFedMe, "inner_steps", 0, "[1, inf)"),
        (PFedMe, "beta", 0.0, "(0.0, inf)"),
        (Ditto, "lam", -1.0, "[0.0, inf)"),
        (Ditto, "personal_lr", 0.0, "(0.0, inf)"),
        (Ditto, "personal_steps", 0, "[1, inf)"),
        (APFL, "mix", 1.5, "[0.0, 1.0]"),
        (APFL, "mix", -0.5, "[0.0, 1.0]"),
        (APFL, "mix_lr", -0.1, "[0.0, inf)"),
    ],
)
def test_bad_hyper_parameters(cls, key: str, value: float, allowed: str) -> None:
    message = f"{key} = {value!r} is out of range; allowed: {allowed}"
    with pytest.raises(FedriskError, match="^" + re.escape(message) + "$"):
        cls(**COMMON, **{key: value})


def test_hyper_parameters_at_their_bounds_are_allowed() -> None:
    LocalizedFedAvg(**COMMON, finetune_steps=0, finetune_lr=1e-9)
    PerFedAvg(**COMMON, inner_lr=1e-9, hf_delta=1e-9)
    PFedMe(**COMMON, lam=1e-9, personal_lr=1e-9, inner_steps=1, beta=1e-9)
    Ditto(**COMMON, lam=0.0, personal_lr=1e-9, personal_steps=1)
    APFL(**COMMON, mix=0.0, mix_lr=0.0)
    APFL(**COMMON, mix=1.0)
    with pytest.raises(FedriskError, match=re.escape("unknown variant 'so'. Valid choices: fo, hf")):
        PerFedAvg(**COMMON, variant="so")
    with pytest.raises(FedriskError, match=re.escape("lr = 0.0 is not allowed")):  # FedAvg's own checks still run
        Ditto(**{**COMMON, "lr": 0.0})


def test_every_baseline_personalises_on_two_clusters() -> None:
    """Opposite labelling in the two clusters: a global linear model without bias sits near 50%,
    every personalised baseline must do clearly better (short run, N = 6).  Measured 2026-11-24
    (FedAvg 0.49): fine-tuning 0.76, Per-FedAvg FO / HF 0.67 / 0.69, pFedMe 0.71, Ditto 0.86, APFL 0.89."""
    fed = perm_two_cluster_federation(6, samples_per_client=60, dim=10, test_per_client=100, seed=1)
    model = FunctionalModel(build_model("logreg", (10,), 2, bias=False))
    kw = {"model": model, "loss": cross_entropy, "lr": 0.3, "local_steps": 5, "batch_size": 16}
    algs = [
        LocalizedFedAvg(**kw, finetune_steps=10, finetune_lr=0.3),
        PerFedAvg(**kw, inner_lr=1.0),
        PerFedAvg(**kw, inner_lr=1.0, variant="hf"),
        PFedMe(**kw, lam=1.0, personal_lr=0.1),
        Ditto(**kw, lam=0.05, personal_lr=0.3, personal_steps=5),
        APFL(**kw, mix=0.5, mix_lr=0.1),
    ]
    fedavg = Simulation(FedAvg(**kw), fed, seed=0)
    for _ in range(15):
        fedavg.step()
    base = evaluate(
        fedavg.algorithm, fedavg.server_state, fedavg.client_states, fedavg.federation, ["accuracy"], personal=True
    )
    for alg in algs:
        sim = Simulation(alg, fed, seed=0)
        for _ in range(15):
            sim.step()
        got = evaluate(alg, sim.server_state, sim.client_states, sim.federation, ["accuracy"])
        assert got["personal_accuracy_mean"] > base["personal_accuracy_mean"] + 0.15, (alg.name, got, base)
