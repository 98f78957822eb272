"""The SGDA family with a network dual player (issue 30 item 4).

* a dual "network" equal to the flat vector (the zoo's ``vector`` model, one parameter tensor)
  playing the fair-classification game through a custom objective reproduces the flat game's
  numbers exactly, for every SGDA-family method, over several rounds with K > 1;
* a network game with a box dual set against a hand transcription of Algorithm 1 (plain
  autograd on tensors: K local simultaneous steps with y clipped after every ascent step, the
  FSGDA server step with η_g ≠ 1 and y clipped again);
* the sequential and vectorised executors agree on a GAN (2 rounds, K > 1);
* bad input: a dual model that does not fit the objective, unknown dual sets, radius <= 0.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedrisk.algorithms.fessgda import FESSGDA, FESSGDARegularized
from fedrisk.algorithms.sgda import FSGDA, SAGDA, FedNormSGDA, LocalSGDA, LocalSGDAPlus
from fedrisk.data import build_federation
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.minimax import per_sample_cross_entropy, weighted_group_loss
from fedrisk.runtime.simulation import Simulation

F64 = torch.float64


def fair_objective(x: Any, y: Any, batch: Any) -> torch.Tensor:
    """Eq. (2) over classes with y a network's (the ``vector`` model's) parameters."""
    per_sample = per_sample_cross_entropy(batch.model(x, batch.inputs), batch.labels)
    return weighted_group_loss(per_sample, batch.labels, y["x"])


NUM_FEATURES, NUM_CLASSES = 6, 4


def small_fed() -> Federation:
    """4 clients of unequal size with a class skew (a small stand-in for digits)."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for i, n in enumerate((30, 20, 25, 15)):
        labels = (torch.arange(n) % (NUM_CLASSES - (i % 2))).long()
        clients.append(Samples(torch.randn(n, NUM_FEATURES, generator=g) + labels[:, None] * 0.3, labels))
    return Federation("small", clients, NUM_CLASSES, test=clients[0])


CASES = [
    (LocalSGDA, {}),
    (FSGDA, {"global_lr": 1.5, "global_lr_dual": 0.7, "lr_dual": 0.3}),
    (FESSGDA, {"global_lr": 1.3, "smoothing": 0.8, "beta": 0.3, "clients_per_round": 3}),
    (LocalSGDAPlus, {"snapshot_period": 2}),
    (FedNormSGDA, {"global_lr": 1.2, "weighting": "samples"}),
    (SAGDA, {"global_lr": 1.4}),
    (FESSGDARegularized, {"epsilon": 0.5}),
]


@pytest.mark.parametrize(("cls", "extra"), CASES, ids=[c.__name__ for c, _ in CASES])
def test_a_vector_network_dual_reproduces_the_flat_fair_game(cls: type, extra: dict[str, Any]) -> None:
    fed = small_fed()
    c = fed.num_classes
    common = {"lr": 0.2, "local_steps": 3, "batch_size": 8, **extra}
    flat = cls(model=FunctionalModel(build_model("logreg", (NUM_FEATURES,), c)), game="fair_class", **common)
    dual = FunctionalModel(build_model("vector", (NUM_FEATURES,), c, init=1.0 / c))
    model = FunctionalModel(build_model("logreg", (NUM_FEATURES,), c))
    net = cls(model=model, dual_model=dual, objective_fn=fair_objective, dual_set="simplex", **common)
    sims = [Simulation(a, fed, seed=2, dtype=F64) for a in (flat, net)]
    moved = False
    for _ in range(4):
        for s in sims:
            s.step()
        a, b = sims[0].server_state, sims[1].server_state
        for k in a["x"]:
            torch.testing.assert_close(b["x"][k], a["x"][k], rtol=0, atol=1e-12)
        torch.testing.assert_close(b["y"]["x"], a["y"], rtol=0, atol=1e-12)
        moved |= not torch.allclose(a["y"], torch.full((c,), 1.0 / c, dtype=F64))
    assert moved  # the dual moved off its start: the comparison is not vacuous


# -- a hand transcription of Algorithm 1 (FSGDA server) with a network dual and a box ------------
D, MU, CLIP = 3, 0.4, 0.15


def linear_game(x: Any, y: Any, batch: Any) -> torch.Tensor:
    """f = mean(D_y(u) (G_x(u) − t)) − (μ/2)||y||² with two linear layers (x: G, y: D)."""
    g = batch.model(x, batch.inputs).reshape(-1)
    d = batch.dual_model(y, batch.inputs).reshape(-1)
    sq = sum((v * v).sum() for v in y.values())
    return (d * (g - batch.labels)).mean() - 0.5 * MU * sq


def one_row_fed() -> Federation:
    """Client i holds 4 copies of one row (u_i, t_i): every minibatch is the same, so the hand loop is exact."""
    g = torch.Generator().manual_seed(5)
    rows = [(torch.randn(D, generator=g, dtype=F64), torch.randn((), generator=g, dtype=F64)) for _ in range(3)]
    clients = [Samples(u.expand(4, D).clone(), t.expand(4).clone()) for u, t in rows]
    return Federation("one_row", clients, 1, test=clients[0])


def test_network_dual_with_a_box_matches_algorithm_1_by_hand() -> None:
    fed = one_row_fed()
    lr, lr_y, g_x, g_y, k, rounds = 0.3, 0.5, 1.6, 0.8, 3, 3
    gen, disc = (FunctionalModel(build_model("logreg", (D,), 1)) for _ in range(2))
    alg = FSGDA(model=gen, dual_model=disc, objective_fn=linear_game, dual_set="box", dual_low=-CLIP, dual_high=CLIP,
                lr=lr, lr_dual=lr_y, global_lr=g_x, global_lr_dual=g_y, local_steps=k, batch_size=2)  # fmt: skip
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    x = {n: v.clone() for n, v in sim.server_state["x"].items()}
    y = {n: v.clone() for n, v in sim.server_state["y"].items()}
    assert all(float(v.abs().max()) <= CLIP for v in y.values())  # y_0 projected onto the box
    names = sorted(x)

    def grads(xw: dict, yw: dict, u: torch.Tensor, t: torch.Tensor) -> tuple[dict, dict]:
        xs = {n: v.detach().requires_grad_() for n, v in xw.items()}
        ys = {n: v.detach().requires_grad_() for n, v in yw.items()}
        gval = u @ xs["linear.weight"].T.reshape(-1) + xs["linear.bias"].reshape(())
        dval = u @ ys["linear.weight"].T.reshape(-1) + ys["linear.bias"].reshape(())
        f = dval * (gval - t) - 0.5 * MU * sum((v * v).sum() for v in ys.values())
        gx = torch.autograd.grad(f, [xs[n] for n in names], retain_graph=True)
        gy = torch.autograd.grad(f, [ys[n] for n in names])
        return dict(zip(names, gx)), dict(zip(names, gy))

    assert names == ["linear.bias", "linear.weight"]
    clipped = 0

    def clip(v: torch.Tensor) -> torch.Tensor:
        nonlocal clipped
        out = v.clamp(-CLIP, CLIP)
        clipped += int((out != v).sum())
        return out

    for _ in range(rounds):
        outs = []
        for c in fed.clients:
            u, t = c.x[0], c.y[0]
            xl, yl = dict(x), dict(y)
            for _ in range(k):
                gx, gy = grads(xl, yl, u, t)
                xl = {n: xl[n] - lr * gx[n] for n in names}
                yl = {n: clip(yl[n] + lr_y * gy[n]) for n in names}  # P_Y after every ascent step
            outs.append((xl, yl))
        x = {n: x[n] + g_x * (sum(o[0][n] for o in outs) / 3 - x[n]) for n in names}
        y = {n: clip(y[n] + g_y * (sum(o[1][n] for o in outs) / 3 - y[n])) for n in names}
        sim.step()
        for n in names:
            torch.testing.assert_close(sim.server_state["x"][n], x[n], rtol=1e-12, atol=1e-13)
            torch.testing.assert_close(sim.server_state["y"][n], y[n], rtol=1e-12, atol=1e-13)
    assert clipped > 0  # the box was active


# -- executors --------------------------------------------------------------------------------------
def gan(cls: type = FESSGDA, **kw: Any) -> Any:
    mlp = lambda out: FunctionalModel(build_model("mlp", (2,), out, hidden=[8]))  # noqa: E731
    base = {"dual_model": mlp(1), "game": "gan", "noise_dim": 2, "lr": 0.05, "local_steps": 3, "batch_size": 8}
    return cls(model=mlp(2), **{**base, **kw})


def mog_fed(num_clients: int = 4) -> Federation:
    return build_federation("mog_2d", "k_classes", num_clients, seed=0, dataset_options={"num_samples": 200},
                            partition_options={"classes_per_client": 2})  # fmt: skip


@pytest.mark.parametrize("cls", [FESSGDA, SAGDA])
def test_sequential_and_vectorized_executors_agree_on_a_gan(cls: type) -> None:
    fed = mog_fed()
    alg = gan(cls, global_lr=1.2, dual_set="ball", dual_radius=3.0, clients_per_round=3)
    sims = [Simulation(alg, fed, seed=1, dtype=F64, executor=e) for e in ("sequential", "vectorized")]
    for _ in range(3):
        reports = [s.step() for s in sims]
        assert reports[0].clients == reports[1].clients
    a, b = sims[0].server_state, sims[1].server_state
    for key in ("x", "y"):
        for n in a[key]:
            torch.testing.assert_close(b[key][n], a[key][n], rtol=1e-9, atol=1e-10)
    norm = torch.sqrt(sum((v * v).sum() for v in a["y"].values()))
    assert float(norm) <= 3.0 + 1e-9


def test_gan_metrics_and_noise_draws() -> None:
    fed = mog_fed()
    alg = gan()
    sim = Simulation(alg, fed, seed=0)
    draws = alg.draw(None, 0, 50, __import__("fedrisk.rng", fromlist=["client_generator"]).client_generator(0, 0, 0))
    assert draws["noise"].shape == (3, 8, 2)
    sim.step()
    m = alg.state_metrics(sim.server_state, fed)
    assert set(m) == {"modes_covered", "high_quality_fraction", "mode_balance"}


# -- bad input ---------------------------------------------------------------------------------------
def test_a_discriminator_with_several_outputs_is_refused_naming_dual_model() -> None:
    mlp = lambda out: FunctionalModel(build_model("mlp", (2,), out, hidden=[4]))  # noqa: E731
    alg = LocalSGDA(model=mlp(2), dual_model=mlp(3), game="gan", noise_dim=2)
    with pytest.raises(FedriskError, match=r"discriminator \(\[dual_model\]\) must give one logit per row"):
        Simulation(alg, mog_fed(), seed=0)


def test_a_dual_model_the_objective_cannot_use_is_refused_in_one_line() -> None:
    wrong = FunctionalModel(build_model("logreg", (5,), 1))  # takes 5 inputs, the rows have 3
    alg = FSGDA(model=FunctionalModel(build_model("logreg", (D,), 1)), dual_model=wrong, objective_fn=linear_game)
    with pytest.raises(FedriskError, match=r"game 'linear_game': the objective fails on the models' outputs") as e:
        Simulation(alg, one_row_fed(), seed=0)
    assert "\n" not in str(e.value)


def test_an_objective_that_is_not_scalar_is_refused() -> None:
    alg = FSGDA(model=FunctionalModel(build_model("logreg", (D,), 1)),
                dual_model=FunctionalModel(build_model("logreg", (D,), 1)),
                objective_fn=lambda x, y, b: b.model(x, b.inputs))  # fmt: skip
    with pytest.raises(FedriskError, match="must return a scalar loss"):
        Simulation(alg, one_row_fed(), seed=0)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dual_set": "sphere"}, "unknown dual_set 'sphere'"),
        ({"dual_set": "ball", "dual_radius": 0.0}, "dual_radius = 0.0 is out of range"),
        ({"dual_radius": -1.0}, "dual_radius = -1.0 is out of range"),
        ({"dual_set": "box", "dual_low": 1.0, "dual_high": 0.0}, "dual_low = 1.0 must be <= dual_high = 0.0"),
        ({"noise_dim": 0}, "game 'gan' draws generator noise: set noise_dim >= 1"),
        ({"game": "gann"}, "unknown game 'gann'. Did you mean 'gan'"),
    ],
)
def test_bad_dual_settings_are_refused_naming_the_key(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        gan(**kw)


def test_a_network_game_without_its_dual_model_and_a_vector_game_with_one_are_refused() -> None:
    with pytest.raises(FedriskError, match=r"game 'gan' has a network dual player: give its model"):
        Simulation(gan(dual_model=None), mog_fed(), seed=0)
    with pytest.raises(FedriskError, match="dual_model is for network games"):
        FSGDA(model=None, dual_model=FunctionalModel(build_model("logreg", (D,), 1)), game="fair_class")


def test_a_dual_model_with_batchnorm_is_refused_naming_the_layer() -> None:
    bn = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
    with pytest.raises(FedriskError, match=r"dual_model: BatchNorm layer '1' has running statistics"):
        Simulation(gan(dual_model=FunctionalModel(bn)), mog_fed(), seed=0)
