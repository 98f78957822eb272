"""Unit checks of the Local SGDA family's pieces that the exact multi-step tests do not reach:
the game metrics of the server iterate, against formulas written out here (pinned by the
``sgda`` mutation scope, docs/reliability.md)."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.fessgda import FESSGDA, FESSGDARegularized
from fedrisk.algorithms.sgda import FSGDA, LocalSGDA, LocalSGDAPlus, quadratic_matrix
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model

F64 = torch.float64


def affine() -> FunctionalModel:
    return FunctionalModel(build_model("affine_generator", (1,), 1))


def wgan_state(mu: float, sigma: float) -> dict:
    return {"x": {"mu": torch.tensor(mu, dtype=F64), "sigma": torch.tensor(sigma, dtype=F64)}, "y": torch.zeros(2)}


def wgan_fed(notes: dict | None) -> Federation:
    z = torch.zeros(4, 1, dtype=F64)
    info = {} if notes is None else {"dataset_meta": {"notes": notes}}
    return Federation("wgan", [Samples(z, z[:, 0])], 1, info=info)


def test_generator_error_is_the_squared_distance_to_the_targets_of_the_data() -> None:
    alg = FESSGDA(model=affine(), game="wgan")
    fed = wgan_fed({"target_mu": 0.4, "target_sigma": 0.25})
    got = alg.state_metrics(wgan_state(1.5, -0.5), fed)
    assert got == {"generator_error": pytest.approx((1.5 - 0.4) ** 2 + (-0.5 - 0.25) ** 2, rel=1e-12)}
    # without notes: the wgan_1d defaults, mu_hat = 0 and sigma_hat = 0.1
    got = alg.state_metrics(wgan_state(1.5, -0.5), wgan_fed(None))
    assert got["generator_error"] == pytest.approx(1.5**2 + 0.6**2, rel=1e-12)


def test_grad_phi_norm_averages_the_clients_means_not_the_pooled_rows() -> None:
    """eq. (1): b = (1/M) Σ_i mean(rows_i), so a client with more rows weighs the same."""
    d1, d2, c, mu = 3, 2, 1.3, 0.7
    rows = [torch.tensor([[1.0, 2.0]], dtype=F64), torch.tensor([[3.0, -1.0], [5.0, 0.0], [-2.0, 4.0]], dtype=F64)]
    fed = Federation("quad", [Samples(r, torch.zeros(len(r), dtype=torch.long)) for r in rows], 1)
    model = FunctionalModel(build_model("vector", (d2,), d1, init=0.0))
    alg = FSGDA(model=model, game="quadratic", dual_dim=d2, quadratic_curvature=c, quadratic_mu=mu, quadratic_seed=3)
    x = torch.tensor([0.3, -1.1, 2.0], dtype=F64)
    got = alg.state_metrics({"x": {"x": x}, "y": torch.zeros(d2, dtype=F64)}, fed)
    a = quadratic_matrix(3, d2, d1, F64)
    b = (rows[0].mean(0) + rows[1].mean(0)) / 2
    grad = [-c * math.sin(float(x[k])) + sum(float(a[j, k]) * float(a[j] @ x + b[j]) / mu for j in range(d2))
            for k in range(d1)]  # fmt: skip
    assert got == {"grad_phi_norm": pytest.approx(math.sqrt(sum(g * g for g in grad)), rel=1e-12)}


def test_fair_games_report_the_largest_dual_weight() -> None:
    x = torch.zeros(4, 1, dtype=F64)
    fed = Federation("f", [Samples(x, torch.tensor([0, 1, 0, 1]))], 2)
    alg = LocalSGDA(model=FunctionalModel(build_model("logreg", (1,), 2)))
    state = {"x": alg.model.init_params(dtype=F64), "y": torch.tensor([0.2, 0.8], dtype=F64)}
    assert alg.state_metrics(state, fed) == {"dual_max": pytest.approx(0.8)}


# -- bad input: every hyper-parameter named with its allowed range, and the boundary accepted ----
def vector(d: int = 2) -> FunctionalModel:
    return FunctionalModel(build_model("vector", (d,), 2, init=0.0))


@pytest.mark.parametrize(
    ("cls", "kw", "message"),
    [
        (LocalSGDA, {"lr": 0.0}, "lr = 0.0 is out of range; allowed: (0.0, inf)"),
        (LocalSGDA, {"lr_dual": -1.0}, "lr_dual = -1.0 is out of range; allowed: (0.0, inf)"),
        (LocalSGDA, {"local_steps": 0}, "local_steps = 0 is out of range; allowed: [1, inf)"),
        (LocalSGDA, {"batch_size": 0}, "batch_size = 0 is out of range; allowed: [1, inf)"),
        (LocalSGDA, {"clients_per_round": 0}, "clients_per_round = 0 is out of range; allowed: [1, inf)"),
        (LocalSGDA, {"sampling": "sorted"}, "unknown sampling 'sorted'. Valid choices: shuffle, with_replacement"),
        (LocalSGDA, {"game": "chess"},
         "unknown game 'chess'. Valid choices: fair_class, fair_group, gan, quadratic, wgan"),
        (LocalSGDA, {"dual_set": "sphere"}, "unknown dual_set 'sphere'. Valid choices: auto, ball, box, none, simplex"),
        (LocalSGDA, {"dual_radius": 0.0}, "dual_radius = 0.0 is out of range; allowed: (0.0, inf)"),
        (LocalSGDA, {"dual_low": 0.5, "dual_high": 0.25}, "dual_low = 0.5 must be <= dual_high = 0.25"),
        (LocalSGDA, {"noise_dim": -1}, "noise_dim = -1 is out of range; allowed: [0, inf)"),
        (LocalSGDA, {"dual_dim": 0}, "dual_dim = 0 is out of range; allowed: [1, inf)"),
        (LocalSGDA, {"wgan_lambda": -0.5}, "wgan_lambda = -0.5 is out of range; allowed: [0.0, inf)"),
        (LocalSGDA, {"quadratic_mu": 0.0}, "quadratic_mu = 0.0 is out of range; allowed: (0.0, inf)"),
        (LocalSGDA, {"game": "gan"}, "game 'gan' draws generator noise: set noise_dim >= 1 (the generator's input)"),
        (LocalSGDA, {"game": "gan", "noise_dim": 1, "stationarity": True},
         "stationarity is computed for the vector games only; set stationarity = false"),
        (LocalSGDA, {"dual_model": vector()},
         "dual_model is for network games (a registered game or objective_fn=); game 'fair_class' has a vector y; "
         "allowed games with a dual model: gan"),
        (FSGDA, {"global_lr": 0.0}, "global_lr = 0.0 is out of range; allowed: (0.0, inf)"),
        (FSGDA, {"global_lr_dual": -2.0}, "global_lr_dual = -2.0 is out of range; allowed: (0.0, inf)"),
        (LocalSGDAPlus, {"snapshot_period": 0}, "snapshot_period = 0 is out of range; allowed: [1, inf)"),
        (FESSGDA, {"smoothing": -0.1}, "smoothing = -0.1 is out of range; allowed: [0.0, inf)"),
        (FESSGDA, {"beta": 0.0}, "beta = 0.0 is out of range; allowed: (0.0, 1.0]"),
        (FESSGDA, {"beta": 1.5}, "beta = 1.5 is out of range; allowed: (0.0, 1.0]"),
        (FESSGDARegularized, {"epsilon": 0.0}, "epsilon = 0.0 is out of range; allowed: (0.0, inf)"),
        (FESSGDARegularized, {"dual_diameter": 0.0}, "dual_diameter = 0.0 is out of range; allowed: (0.0, inf)"),
        (FESSGDARegularized, {"game": "wgan"},
         "fessgda_ncc: game 'wgan' has an unbounded Y; give dual_diameter (D(Y) of Theorem 3.3)"),
    ],
)  # fmt: skip
def test_a_bad_hyper_parameter_is_named_with_what_is_allowed(cls: type, kw: dict, message: str) -> None:
    with pytest.raises(FedriskError) as err:
        cls(model=vector(), **kw)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("cls", "kw"),
    [
        (LocalSGDA, {"local_steps": 1, "batch_size": 1, "clients_per_round": 1, "noise_dim": 0, "dual_dim": 1}),
        (LocalSGDA, {"dual_set": "box", "dual_low": 0.5, "dual_high": 0.5, "wgan_lambda": 0.0}),
        (LocalSGDA, {"game": "gan", "noise_dim": 1}),
        (LocalSGDA, {"game": "no such game", "objective_fn": lambda x, y, batch: 0.0}),
        (LocalSGDAPlus, {"snapshot_period": 1}),
        (FESSGDA, {"smoothing": 0.0, "beta": 1.0}),
        (FESSGDARegularized, {"game": "wgan", "dual_diameter": 2.0}),
    ],
)
def test_the_boundary_values_are_accepted(cls: type, kw: dict) -> None:
    cls(model=vector(), **kw)


# -- the fair games by hand: a linear model's softmax cross-entropy, class-weighted --------------
C, FEATURES = 3, 4


def fair_rows(seed: int, n: int, dtype: torch.dtype = F64) -> Samples:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g, dtype=F64)
    labels = torch.tensor([k % C for k in range(n)])
    return Samples(x.to(dtype), labels, {"group": torch.tensor([(k // 2) % C for k in range(n)])})


def linear_params(seed: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"linear.weight": torch.randn(C, FEATURES, generator=g, dtype=F64),
            "linear.bias": torch.randn(C, generator=g, dtype=F64)}  # fmt: skip


def hand_fair_loss(w: dict, rows: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, y: torch.Tensor):
    """Σ_c y_c F̂_c, F̂_c the mean cross-entropy of the rows of group c (0 for an absent group)."""
    out = rows.to(F64) @ w["linear.weight"].T + w["linear.bias"]
    ce = torch.logsumexp(out, 1) - out[torch.arange(len(rows)), labels]
    f = [ce[groups == c].mean() if bool((groups == c).any()) else torch.zeros((), dtype=F64) for c in range(C)]
    return sum(y[c] * f[c] for c in range(C))


def simplex_by_bisection(v: torch.Tensor) -> torch.Tensor:
    """P onto {y >= 0, Σ y = 1}: max(v − θ, 0) with Σ max(v − θ, 0) = 1, θ by bisection."""
    lo, hi = float(v.min()) - 1.0, float(v.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(torch.clamp(v - mid, min=0).sum()) > 1 else (lo, mid)
    return torch.clamp(v - (lo + hi) / 2, min=0)


@pytest.mark.parametrize(
    ("dual_set", "game", "project"),
    [
        ("auto", "fair_class", simplex_by_bisection),
        ("auto", "fair_group", simplex_by_bisection),
        ("none", "fair_class", lambda v: v),
        ("box", "fair_class", lambda v: torch.clamp(v, 0.25, 0.45)),
    ],
)
def test_stationarity_measures_are_the_full_batch_gradient_and_the_projected_dual_step(dual_set, game, project) -> None:
    """Def. 2.1 (l = 1) at an interior y: ||∇_x f|| and ||P_Y(y + ∇_y f) − y||, f = (1/M) Σ_i f_i over
    every row; float32 client rows are read in the state's float64."""
    clients = [fair_rows(1, 5, torch.float32), fair_rows(2, 9, torch.float32)]
    fed = Federation("fair", clients, C)
    alg = LocalSGDA(model=FunctionalModel(build_model("logreg", (FEATURES,), C)), game=game, dual_dim=C,
                    dual_set=dual_set, dual_low=0.25, dual_high=0.45, stationarity=True)  # fmt: skip
    w, y = linear_params(), torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    got = alg.state_metrics({"x": w, "y": y}, fed)
    wv = {k: v.clone().requires_grad_() for k, v in w.items()}
    yv = y.clone().requires_grad_()
    f = sum(hand_fair_loss(wv, c.x, c.y, c.y if game == "fair_class" else c.attrs["group"], yv) for c in clients) / 2
    gw, gb, gy = torch.autograd.grad(f, [wv["linear.weight"], wv["linear.bias"], yv])
    want_x = math.sqrt(float((gw**2).sum() + (gb**2).sum()))
    want_y = float((project(y + gy) - y).norm())
    assert want_y > 1e-3  # the dual step is not vacuous
    assert got["stationarity_x"] == pytest.approx(want_x, rel=1e-12)
    assert got["stationarity_y"] == pytest.approx(want_y, rel=1e-12)
    assert got["dual_max"] == 0.5


# -- FESSGDARegularized's dual pull −(ε/(2D))(y − y_0), value − (ε/(4D))||y − y_0||² -----------
def local_data(s: Samples) -> LocalData:
    return LocalData(s.x, s.y, torch.tensor(len(s)), dict(s.attrs))


@pytest.mark.parametrize(("dual_set", "diameter", "y0"), [("auto", None, 1 / C), ("box", 2.5, 0.0)])
def test_the_regularised_gradients_pull_y_towards_its_start(dual_set, diameter, y0) -> None:
    """y_0 is the uniform point of the simplex (D = √2 by default), 0 on a box."""
    eps = 0.6
    model = FunctionalModel(build_model("logreg", (FEATURES,), C))
    alg = FESSGDARegularized(model=model, game="fair_class", epsilon=eps, dual_diameter=diameter, dual_set=dual_set)
    reg = eps / (2 * (math.sqrt(2) if diameter is None else diameter))
    rows = fair_rows(3, 7)
    idx = torch.tensor([0, 2, 3, 5, 6])
    w, y = linear_params(), torch.tensor([0.6, 0.1, 0.3], dtype=F64)
    value, gx, gy = alg.gradients(w, y, local_data(rows), idx)
    wv, yv = {k: v.clone().requires_grad_() for k, v in w.items()}, y.clone().requires_grad_()
    f = hand_fair_loss(wv, rows.x[idx], rows.y[idx], rows.y[idx], yv)
    want_gw, want_gb, want_gy = torch.autograd.grad(f, [wv["linear.weight"], wv["linear.bias"], yv])
    close = {"rtol": 1e-12, "atol": 1e-14}
    torch.testing.assert_close(value, f.detach() - 0.5 * reg * ((y - y0) ** 2).sum(), **close)
    torch.testing.assert_close(gx["linear.weight"], want_gw, **close)
    torch.testing.assert_close(gx["linear.bias"], want_gb, **close)
    torch.testing.assert_close(gy, want_gy - reg * (y - y0), **close)


def noisy_game(x: dict, y: dict, batch) -> torch.Tensor:
    """f = Σ_k y_k (x_k + mean_b noise_bk) − ½||x||²: ∇_y f = x + mean noise, ∇_x f = y − x."""
    return (y["x"] * (x["x"] + batch.noise.mean(0))).sum() - 0.5 * (x["x"] ** 2).sum()


@pytest.mark.parametrize(("dual_set", "diameter", "y0"), [("simplex", None, 1 / 3), ("box", 0.5, 0.0)])
def test_the_regularised_pull_on_a_network_dual_with_noise(dual_set, diameter, y0) -> None:
    """A network dual's y_0: 1/(its number of parameters) on the simplex, 0 otherwise; the
    game's noise reaches the objective."""
    from fedrisk.objectives.adversarial import MinimaxGame

    eps = 0.3
    vec = FunctionalModel(build_model("vector", (2,), 3, init=0.0))
    alg = FESSGDARegularized(model=vec, dual_model=vec, objective_fn=MinimaxGame(noisy_game, noise=True), noise_dim=3,
                             epsilon=eps, dual_diameter=diameter, dual_set=dual_set)  # fmt: skip
    reg = eps / (2 * (math.sqrt(2) if diameter is None else diameter))
    x = {"x": torch.tensor([0.2, -0.4, 0.9], dtype=F64)}
    y = {"x": torch.tensor([0.5, 0.2, 0.3], dtype=F64)}
    noise = torch.tensor([[0.1, 0.7, -0.3], [0.5, -0.1, 0.1]], dtype=F64)
    data = LocalData(torch.zeros(4, 2, dtype=F64), torch.zeros(4, dtype=F64), torch.tensor(4))
    value, gx, gy = alg.gradients(x, y, data, torch.tensor([1, 3]), noise)
    m = noise.mean(0)
    f = float((y["x"] * (x["x"] + m)).sum() - 0.5 * (x["x"] ** 2).sum())
    close = {"rtol": 1e-12, "atol": 1e-14}
    assert float(value) == pytest.approx(f - 0.5 * reg * float(((y["x"] - y0) ** 2).sum()), rel=1e-12)
    torch.testing.assert_close(gx["x"], y["x"] - x["x"], **close)
    torch.testing.assert_close(gy["x"], x["x"] + m - reg * (y["x"] - y0), **close)


# -- the game metrics: which game reports what ---------------------------------------------------
def test_a_network_game_reports_its_own_metrics_or_none() -> None:
    from fedrisk.objectives.adversarial import MinimaxGame

    vec = FunctionalModel(build_model("vector", (2,), 3, init=0.0))
    x, y = {"x": torch.tensor([1.0, 2.0, 3.0])}, {"x": torch.tensor([0.5, -0.25, 4.0])}
    fed = wgan_fed(None)
    silent = LocalSGDA(model=vec, dual_model=vec, objective_fn=MinimaxGame(noisy_game))
    assert silent.state_metrics({"x": x, "y": y}, fed) == {}

    def metrics(xp, yp, federation, alg):
        return {"sum_xy": float((xp["x"] * yp["x"]).sum()), "clients": len(federation.clients)}

    game = MinimaxGame(noisy_game, metrics=metrics)
    assert LocalSGDA(model=vec, dual_model=vec, objective_fn=game).state_metrics({"x": x, "y": y}, fed) == {
        "sum_xy": 0.5 - 0.5 + 12.0,
        "clients": 1,
    }


def test_generator_error_needs_the_wgan_game_and_the_affine_generator() -> None:
    """Another generator in the WGAN, or μ/σ-named parameters in a fair game: no generator_error
    (the dual's largest weight instead)."""
    fed = wgan_fed({"target_mu": 0.4, "target_sigma": 0.25})
    phi = torch.tensor([0.3, -0.7], dtype=F64)
    mlp = FunctionalModel(build_model("vector", (1,), 2, init=0.0))
    other = LocalSGDA(model=mlp, game="wgan").state_metrics({"x": {"x": torch.ones(2)}, "y": phi}, fed)
    assert other == {"dual_max": pytest.approx(0.3)}
    state = wgan_state(1.5, -0.5)
    state["y"] = torch.tensor([0.25, 0.75], dtype=F64)
    assert LocalSGDA(model=affine(), game="fair_class").state_metrics(state, fed) == {"dual_max": 0.75}


@pytest.mark.parametrize(("state_dtype", "rel"), [(F64, 1e-12), (torch.float32, 1e-5)])
def test_grad_phi_norm_reads_float32_rows_in_the_state_dtype(state_dtype: torch.dtype, rel: float) -> None:
    d1, d2, c, mu = 2, 3, 0.8, 1.7
    rows = [torch.tensor([[0.1, 0.7, -0.3], [0.3, 0.2, 0.9]]), torch.tensor([[1.1, -0.6, 0.05]])]  # float32
    fed = Federation("quad", [Samples(r, torch.zeros(len(r), dtype=torch.long)) for r in rows], 1)
    model = FunctionalModel(build_model("vector", (d2,), d1, init=0.0))
    alg = LocalSGDA(model=model, game="quadratic", dual_dim=d2, quadratic_curvature=c, quadratic_mu=mu)
    x = torch.tensor([0.4, -0.9], dtype=F64)
    got = alg.state_metrics({"x": {"x": x.to(state_dtype)}, "y": torch.zeros(d2, dtype=state_dtype)}, fed)
    a = quadratic_matrix(0, d2, d1, F64)
    b = sum(r.to(F64).mean(0) for r in rows) / 2
    grad = -c * torch.sin(x) + a.T @ (a @ x + b) / mu
    assert got["grad_phi_norm"] == pytest.approx(float(grad.norm()), rel=rel)


def test_worst_group_accuracy_only_for_the_group_game_on_float32_test_rows() -> None:
    test = fair_rows(4, 12, torch.float32)
    fed = Federation("fair", [fair_rows(1, 5)], C, test=test)
    model = FunctionalModel(build_model("logreg", (FEATURES,), C))
    w, y = linear_params(), torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    got = LocalSGDA(model=model, game="fair_group", dual_dim=C).state_metrics({"x": w, "y": y}, fed)
    pred = (test.x.to(F64) @ w["linear.weight"].T + w["linear.bias"]).argmax(1)
    groups = test.attrs["group"]
    accuracy = [float((pred[groups == g] == test.y[groups == g]).double().mean()) for g in range(C)]
    assert got == {"dual_max": 0.5, "test_worst_group_accuracy": pytest.approx(min(accuracy), rel=1e-15)}
    assert len(set(accuracy)) > 1  # the groups differ: the minimum is the point
    assert LocalSGDA(model=model, game="fair_class").state_metrics({"x": w, "y": y}, fed) == {"dual_max": 0.5}


def test_a_network_duals_start_follows_the_runs_seed() -> None:
    """y_0 is the dual model's initialisation drawn from the server's seeded generator: FESS-GDA
    (which adds z to the state) starts where FSGDA does, and another seed starts elsewhere."""
    from fedrisk.runtime.simulation import Simulation

    def game(x, y, batch):
        return batch.dual_model(y, batch.inputs).mean() * (x["x"] ** 2).sum()

    kw = {"model": FunctionalModel(build_model("vector", (1,), 2, init=0.5)), "objective_fn": game,
          "dual_model": FunctionalModel(build_model("logreg", (1,), 1))}  # fmt: skip
    fed = wgan_fed(None)
    starts = {(cls, seed): Simulation(cls(**kw), fed, seed=seed).server_state["y"] for cls in (FSGDA, FESSGDA)
              for seed in (0, 1)}  # fmt: skip
    for seed in (0, 1):
        for name, leaf in starts[FSGDA, seed].items():
            assert torch.equal(starts[FESSGDA, seed][name], leaf)
    assert not torch.equal(starts[FESSGDA, 0]["linear.weight"], starts[FESSGDA, 1]["linear.weight"])


def test_the_wgan_objective_of_any_generator_by_hand() -> None:
    """f = mean D_φ(real) − mean D_φ(G(z)) − λ||φ||², D_φ(t) = φ₁ t + φ₂ t² (§4.1), on the rows idx."""
    lam = 0.03
    alg = LocalSGDA(model=affine(), game="wgan", wgan_lambda=lam)
    z = torch.tensor([[0.3], [-1.2], [0.8], [2.0]], dtype=F64)
    real = torch.tensor([0.11, -0.2, 0.35, 0.07], dtype=F64)
    data = LocalData(z, real, torch.tensor(4))
    idx = torch.tensor([3, 0, 2])
    mu, sigma, phi = 0.4, 1.3, torch.tensor([0.7, -0.45], dtype=F64)
    x = {"mu": torch.tensor(mu, dtype=F64), "sigma": torch.tensor(sigma, dtype=F64)}

    def d(t: float) -> float:
        return float(phi[0]) * t + float(phi[1]) * t * t

    r = [float(real[i]) for i in idx]
    g = [mu + sigma * float(z[i, 0]) for i in idx]
    want = sum(map(d, r)) / 3 - sum(map(d, g)) / 3 - lam * float(phi @ phi)
    assert float(alg.objective(x, phi, data, idx)) == pytest.approx(want, rel=1e-13)


def test_a_missing_dual_dim_names_what_it_should_be() -> None:
    from fedrisk.algorithms.base import FedInfo

    info = FedInfo(2, (3, 3), 2)
    with pytest.raises(FedriskError) as err:
        LocalSGDA(model=vector(), game="fair_group", group_attr="sex").check(info)
    assert str(err.value) == "game 'fair_group' needs dual_dim (the number of groups of attribute 'sex')"
    with pytest.raises(FedriskError) as err:
        LocalSGDA(model=vector(), game="quadratic").check(info)
    assert str(err.value) == "game 'quadratic' needs dual_dim (d2)"


# -- the gradients: the affine WGAN's closed form only there, autograd elsewhere -----------------
def test_the_wgan_gradients_of_another_generator_by_hand() -> None:
    """G(z) = w z + b (a linear layer, not the affine generator): ∂f/∂w = −mean D'(g) z,
    ∂f/∂b = −mean D'(g), ∇_φ f = (mean(r − g), mean(r² − g²)) − 2λφ, D'(t) = φ₁ + 2φ₂ t."""
    lam = 0.05
    alg = LocalSGDA(model=FunctionalModel(build_model("logreg", (1,), 1)), game="wgan", wgan_lambda=lam)
    z = torch.tensor([[0.3], [-1.2], [0.8], [2.0]], dtype=F64)
    real = torch.tensor([0.11, -0.2, 0.35, 0.07], dtype=F64)
    idx = torch.tensor([1, 3, 0])
    w, b, phi = 0.9, -0.3, torch.tensor([0.6, 0.25], dtype=F64)
    x = {"linear.weight": torch.tensor([[w]], dtype=F64), "linear.bias": torch.tensor([b], dtype=F64)}
    value, gx, gy = alg.gradients(x, phi, LocalData(z, real, torch.tensor(4)), idx)
    zs, rs = [float(z[i, 0]) for i in idx], [float(real[i]) for i in idx]
    gs = [w * u + b for u in zs]
    p1, p2 = float(phi[0]), float(phi[1])
    slope = [p1 + 2 * p2 * g for g in gs]
    close = {"rtol": 1e-13, "atol": 1e-15}
    torch.testing.assert_close(gx["linear.weight"], torch.tensor([[-sum(s * u for s, u in zip(slope, zs)) / 3]],
                                                                 dtype=F64), **close)  # fmt: skip
    torch.testing.assert_close(gx["linear.bias"], torch.tensor([-sum(slope) / 3], dtype=F64), **close)
    want_phi = [sum(r - g for r, g in zip(rs, gs)) / 3 - 2 * lam * p1,
                sum(r * r - g * g for r, g in zip(rs, gs)) / 3 - 2 * lam * p2]  # fmt: skip
    torch.testing.assert_close(gy, torch.tensor(want_phi, dtype=F64), **close)
    d = [p1 * t + p2 * t * t for t in (*rs, *gs)]
    assert float(value) == pytest.approx(sum(d[:3]) / 3 - sum(d[3:]) / 3 - lam * (p1 * p1 + p2 * p2), rel=1e-13)


class ShiftScale(torch.nn.Module):
    """out = mu + sigma ⊙ inputs[:, :C]: parameters named like the affine generator's."""

    def __init__(self) -> None:
        super().__init__()
        self.mu = torch.nn.Parameter(torch.zeros(C))
        self.sigma = torch.nn.Parameter(torch.ones(C))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.mu + self.sigma * inputs[:, :C]


def test_a_fair_game_whose_parameters_are_named_mu_and_sigma_takes_its_own_gradient() -> None:
    """The WGAN closed form is for the WGAN game only, not for any model with μ and σ."""
    alg = LocalSGDA(model=FunctionalModel(ShiftScale()), game="fair_class")
    rows = fair_rows(5, 6)
    mu, sigma = torch.tensor([0.2, -0.5, 0.1], dtype=F64), torch.tensor([1.5, 0.7, -0.4], dtype=F64)
    y, idx = torch.tensor([0.5, 0.3, 0.2], dtype=F64), torch.tensor([0, 1, 2, 4])
    value, gx, gy = alg.gradients({"mu": mu, "sigma": sigma}, y, local_data(rows), idx)
    m, s, yv = mu.clone().requires_grad_(), sigma.clone().requires_grad_(), y.clone().requires_grad_()
    out = m + s * rows.x[idx, :C]
    ce = torch.logsumexp(out, 1) - out[torch.arange(len(idx)), rows.y[idx]]
    f = sum(yv[c] * ce[rows.y[idx] == c].mean() for c in range(C))
    want = torch.autograd.grad(f, [m, s, yv])
    close = {"rtol": 1e-12, "atol": 1e-14}
    torch.testing.assert_close(value, f.detach(), **close)
    torch.testing.assert_close(gx["mu"], want[0], **close)
    torch.testing.assert_close(gx["sigma"], want[1], **close)
    torch.testing.assert_close(gy, want[2], **close)


# -- the "+" variants' snapshot gradient with a game's noise; the client's loss ------------------
def test_the_plus_variants_dual_step_takes_the_snapshot_and_the_steps_noise() -> None:
    """Local SGDA+ on f = Σ y_k (x_k + mean_b noise_bk) − ½||x||²: K = 3 steps of
    x ← x − η(y − x), y ← y + η_y (x̂ + mean noise_t) (∇_y at the snapshot x̂, with step t's noise);
    the reported loss is the mean of f(x_t, y_t; noise_t) over the steps."""
    from fedrisk.algorithms.base import FedInfo, RoundContext
    from fedrisk.objectives.adversarial import MinimaxGame

    vec = FunctionalModel(build_model("vector", (2,), 3, init=0.0))
    lr, lr_y, k = 0.2, 0.3, 3
    alg = LocalSGDAPlus(model=vec, dual_model=vec, objective_fn=MinimaxGame(noisy_game, noise=True), noise_dim=3,
                        lr=lr, lr_dual=lr_y, local_steps=k, batch_size=2, snapshot_period=4)  # fmt: skip
    g = torch.Generator().manual_seed(11)
    noise = torch.randn(k, 2, 3, generator=g, dtype=F64)
    draws = {"batches": torch.tensor([[0, 1], [2, 3], [1, 1]]), "noise": noise}
    x, y, snap = (torch.randn(3, generator=g, dtype=F64) for _ in range(3))
    payload = {"x": {"x": x}, "y": {"x": y}, "snapshot": {"x": snap}}
    data = LocalData(torch.zeros(4, 2, dtype=F64), torch.zeros(4, dtype=F64), torch.tensor(4))
    out = alg.client_update(RoundContext(0, FedInfo(1, (4,), 1)), payload, None, data, draws)
    losses = []
    for t in range(k):
        m = noise[t].mean(0)
        losses.append(float((y * (x + m)).sum() - 0.5 * (x * x).sum()))
        x, y = x - lr * (y - x), y + lr_y * (snap + m)
    close = {"rtol": 1e-13, "atol": 1e-15}
    torch.testing.assert_close(out.reply["x"]["x"], x, **close)
    torch.testing.assert_close(out.reply["y"]["x"], y, **close)
    assert sorted(out.metrics) == ["loss"]
    assert float(out.metrics["loss"]) == pytest.approx(sum(losses) / k, rel=1e-13)


# -- a diverging server state names the variable ----------------------------------------------
def test_a_diverging_dual_or_anchor_is_named_in_full() -> None:
    """y overflows in the server step (a client's inf), or z alone overflows (x finite, z far
    away, p = 0): the message names the variable, the round and what to do."""
    from fedrisk.aggregators.base import InMemoryReplies
    from fedrisk.algorithms.base import FedInfo, RoundContext, RoundPlan

    alg = FESSGDA(model=FunctionalModel(build_model("vector", (2,), 2, init=0.0)), game="quadratic", dual_dim=2,
                  smoothing=0.0, beta=0.5)  # fmt: skip
    ctx = RoundContext(3, FedInfo(1, (4,), 1))
    big = torch.full((2,), 1e308, dtype=F64)
    cases = [
        ({"x": {"x": torch.zeros(2)}, "y": torch.zeros(2), "z": {"x": torch.zeros(2)}},
         {"x": {"x": torch.ones(2)}, "y": torch.tensor([float("inf"), 0.0])}, "y (dual)"),
        ({"x": {"x": big}, "y": torch.zeros(2, dtype=F64), "z": {"x": -big}},
         {"x": {"x": big}, "y": torch.zeros(2, dtype=F64)}, "z (smoothing anchor)"),
    ]  # fmt: skip
    for state, reply, label in cases:
        with pytest.raises(FedriskError) as err:
            alg.aggregate(ctx, state, RoundPlan([0]), InMemoryReplies({0: reply}), torch.Generator())
        assert str(err.value) == (
            f"fessgda diverged in round 3: {label} became NaN/inf; lower the learning rates "
            "(the last good checkpoint is kept)"
        )


def test_init_dual_without_a_generator_draws_a_network_dual_from_a_fresh_one() -> None:
    """Called without ``gen`` (outside a simulation), a network dual's y_0 comes from a fresh
    default generator: the same start every call, projected onto Y."""
    model = FunctionalModel(build_model("logreg", (3,), 2))
    alg = LocalSGDA(model=model, dual_model=model, objective_fn=noisy_game, dual_set="box", dual_low=0.0,
                    dual_high=0.1)  # fmt: skip
    like = torch.zeros(1, dtype=F64)
    a, b = alg.init_dual(wgan_fed(None), like), alg.init_dual(wgan_fed(None), like)
    want = model.init_params(torch.Generator(), dtype=F64)
    for name, leaf in want.items():
        assert torch.equal(a[name], b[name])
        torch.testing.assert_close(a[name], leaf.clamp(0.0, 0.1), rtol=0, atol=0)


def test_shuffle_sampling_reaches_the_draws() -> None:
    """``sampling = "shuffle"``: K·B = n rows drawn as one permutation (every row once)."""
    from fedrisk.rng import client_generator

    alg = LocalSGDA(model=vector(), local_steps=3, batch_size=4, sampling="shuffle")
    batches = alg.draw(None, 0, 12, client_generator(5, round=0, client=0))["batches"]
    assert batches.shape == (3, 4)
    assert sorted(batches.flatten().tolist()) == list(range(12))


def test_the_messages_list_every_attribute_and_every_network_game(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedrisk.algorithms.base import FedInfo
    from fedrisk.objectives.adversarial import GAME_REGISTRY

    alg = LocalSGDA(model=vector(), game="fair_group", dual_dim=2)
    rows = torch.zeros(3, 2)
    for attrs, listed in (({"site": torch.zeros(3), "age": torch.ones(3)}, "age, site"), ({}, "(none)")):
        with pytest.raises(FedriskError) as err:
            alg.check_data(FedInfo(1, (3,), 2), [LocalData(rows, torch.zeros(3), torch.tensor(3), attrs)])
        assert str(err.value) == (
            f"game 'fair_group': the data has no attribute 'group'; attributes: {listed} (set group_attr)"
        )
    monkeypatch.setattr(GAME_REGISTRY, "_entries", {**GAME_REGISTRY._entries, "duel": GAME_REGISTRY._entries["gan"]})
    with pytest.raises(FedriskError, match=r"allowed games with a dual model: duel, gan$"):
        LocalSGDA(model=vector(), dual_model=vector())
