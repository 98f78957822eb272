"""FESS-GDA and the Local SGDA family (spec 001 §7.1): reductions, the server map, sampling,
messages, bad input, a short behavioural WGAN run."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from fedrisk.algorithms import ALGORITHMS
from fedrisk.algorithms.base import FedInfo, RoundContext
from fedrisk.algorithms.fessgda import FESSGDA, FESSGDARegularized, smoothing_step
from fedrisk.algorithms.sgda import FSGDA, SAGDA, FedNormSGDA, LocalSGDA, LocalSGDAPlus, quadratic_matrix
from fedrisk.data import build_federation
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.rng import server_generator
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import tensor_leaves

F64 = torch.float64
D1, D2 = 3, 4


def quad_fed(num_clients: int = 5, **options: Any) -> Federation:
    opts = {"dim": D2, "samples_per_client": 20, "heterogeneity": 1.0, "noise_std": 0.3, **options}
    return build_federation("nc_sc_quadratic", "by_attribute", num_clients, seed=0, dataset_options=opts)


def vector_model(init: float = 0.5) -> FunctionalModel:
    return FunctionalModel(build_model("vector", (D2,), D1, init=init))


def quad(cls: type, **kw: Any) -> Any:
    base = {"game": "quadratic", "dual_dim": D2, "quadratic_mu": 0.5, "lr": 0.05, "local_steps": 4, "batch_size": 5}
    return cls(model=vector_model(), **{**base, **kw})


def run_states(alg: Any, fed: Federation, rounds: int, seed: int = 0) -> list[dict[str, Any]]:
    sim = Simulation(alg, fed, seed=seed, dtype=F64)
    out = []
    for _ in range(rounds):
        sim.step()
        out.append(sim.server_state)
    return out


def assert_rel(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-12) -> None:
    err = float((a - b).norm() / max(float(b.norm()), 1e-300))
    assert err <= tol, err


def xy(state: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    return tensor_leaves(state["x"])[0], state["y"]


# -- reductions (U1, U2) ----------------------------------------------------------------------
def test_p0_and_unit_global_rates_is_local_sgda_for_50_rounds() -> None:
    fed = quad_fed()
    fess = run_states(quad(FESSGDA, smoothing=0.0, beta=0.3, clients_per_round=3), fed, 50)
    local = run_states(quad(LocalSGDA, clients_per_round=3), fed, 50)
    for a, b in zip(fess, local):
        for u, v in zip(xy(a), xy(b)):
            assert_rel(u, v)
    assert float(xy(fess[-1])[0].norm()) > 0  # the run moved


@pytest.mark.parametrize("global_lr", [1.5, 2.0])
def test_p0_is_fsgda_and_fed_norm_sgda_is_fsgda(global_lr: float) -> None:
    fed = quad_fed()
    kw = {"clients_per_round": 3, "global_lr": global_lr, "lr_dual": 0.03, "global_lr_dual": 1.25}
    fess = run_states(quad(FESSGDA, smoothing=0.0, **kw), fed, 50)
    fsgda = run_states(quad(FSGDA, **kw), fed, 50)
    norm = run_states(quad(FedNormSGDA, **kw), fed, 50)
    for a, b, c in zip(fess, fsgda, norm):
        for u, v, w in zip(xy(a), xy(b), xy(c)):
            assert_rel(u, v)
            assert_rel(w, v)


def test_smoothing_changes_the_iterates() -> None:
    fed = quad_fed()
    a = run_states(quad(FESSGDA, smoothing=1.0, beta=0.5, global_lr=1.5), fed, 5)[-1]
    b = run_states(quad(FSGDA, global_lr=1.5), fed, 5)[-1]
    assert float((xy(a)[0] - xy(b)[0]).norm()) > 1e-3


# -- the centralised limit (U3) ---------------------------------------------------------------
def test_one_client_one_step_is_centralised_smoothed_gda_by_hand() -> None:
    """M = m = 1, K = 1, η_g = 1, no noise (every minibatch is the full batch): two rounds by hand."""
    fed = quad_fed(1, heterogeneity=0.0, noise_std=0.0)
    lr, lr_y, p, beta, c, mu = 0.1, 0.2, 0.7, 0.4, 1.0, 0.5
    alg = quad(FESSGDA, lr=lr, lr_dual=lr_y, smoothing=p, beta=beta, local_steps=1, quadratic_mu=mu)
    states = run_states(alg, fed, 2)
    a = quadratic_matrix(0, D2, D1, F64)
    b = fed.clients[0].x.to(F64)[0]
    x, y = torch.full((D1,), 0.5, dtype=F64), torch.zeros(D2, dtype=F64)
    z = x.clone()
    for state in states:
        gx = -c * torch.sin(x) + a.T @ y
        gy = a @ x + b - mu * y
        x, y = x - lr * (gx + p * (x - z)), y + lr_y * gy
        z = z + beta * (x - z)
        torch.testing.assert_close(xy(state)[0], x, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(xy(state)[1], y, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(tensor_leaves(state["z"])[0], z, rtol=1e-13, atol=1e-13)


# -- the server map (U4) ----------------------------------------------------------------------
@pytest.mark.parametrize(("c", "beta"), [(0.1, 0.05), (0.5, 0.5), (0.9, 1.0)])
def test_server_map_with_zero_gradient(c: float, beta: float) -> None:
    x, z = torch.tensor([1.0, -2.0], dtype=F64), torch.tensor([0.5, 0.0], dtype=F64)
    for _ in range(5):
        x_new, z_new = smoothing_step(x, x, z, 1.0, c, beta)  # f ≡ 0: x̄ = x
        torch.testing.assert_close(x_new, x - c * (x - z), rtol=0, atol=1e-15)
        torch.testing.assert_close(z_new, z + beta * (x_new - z), rtol=0, atol=1e-15)
        torch.testing.assert_close(x_new - z_new, (1 - c) * (1 - beta) * (x - z), rtol=1e-13, atol=1e-15)
        x, z = x_new, z_new


def test_server_step_uses_old_x_and_z_and_the_global_rates() -> None:
    alg = quad(FESSGDA, lr=0.1, local_steps=3, smoothing=2.0, beta=0.25, global_lr=1.5)
    x, z, x_bar = torch.tensor([1.0], dtype=F64), torch.tensor([0.2], dtype=F64), torch.tensor([0.4], dtype=F64)
    coef = 0.1 * 1.5 * 3 * 2.0
    x1, z1 = smoothing_step({"x": x}, {"x": x_bar}, {"x": z}, alg.global_lr, coef, alg.beta)
    want = x + 1.5 * (x_bar - x) - coef * (x - z)
    torch.testing.assert_close(x1["x"], want)
    torch.testing.assert_close(z1["x"], z + 0.25 * (want - z))


# -- sampling (U6) and messages (U7) ----------------------------------------------------------
def test_exactly_m_distinct_clients_and_uniform_inclusion() -> None:
    alg = quad(FESSGDA, clients_per_round=3)
    info = FedInfo(10, (5,) * 10, 1)
    counts = torch.zeros(10)
    state = {"x": {"x": torch.zeros(D1)}, "y": torch.zeros(D2), "z": {"x": torch.zeros(D1)}}
    rounds = 10_000
    for r in range(rounds):
        plan = alg.configure(RoundContext(r, info), state, server_generator(0, r, "configure"))
        assert len(plan.clients) == 3 == len(set(plan.clients))
        counts[plan.clients] += 1
    p = 3 / 10
    se = math.sqrt(p * (1 - p) / rounds)
    assert bool(((counts / rounds - p).abs() <= 3 * se + 1e-12).all()), counts / rounds
    full = quad(FESSGDA).configure(RoundContext(0, info), state, server_generator(0, 0, "configure"))
    assert full.clients == list(range(10))


def test_z_is_never_sent() -> None:
    fed = quad_fed()
    fess, fsgda = quad(FESSGDA, clients_per_round=3), quad(FSGDA, clients_per_round=3)
    sims = [Simulation(a, fed, seed=1, dtype=F64) for a in (fess, fsgda)]
    for s in sims:
        for _ in range(3):
            s.step()
    plan = fess.configure(RoundContext(0, sims[0].info), sims[0].server_state, server_generator(1, 0, "configure"))
    assert sorted(plan.broadcast) == ["x", "y"]
    assert "z" in sims[0].server_state
    assert sims[0].ledger.total_down == sims[1].ledger.total_down
    assert sims[0].ledger.total_up == sims[1].ledger.total_up


# -- the variants ------------------------------------------------------------------------------
def test_snapshot_with_one_local_step_and_period_one_is_local_sgda() -> None:
    fed = quad_fed()
    plus = run_states(quad(LocalSGDAPlus, local_steps=1, snapshot_period=1), fed, 10)
    plain = run_states(quad(LocalSGDA, local_steps=1), fed, 10)
    for a, b in zip(plus, plain):
        for u, v in zip(xy(a), xy(b)):
            assert_rel(u, v)
    stale = run_states(quad(LocalSGDAPlus, snapshot_period=3), fed, 6)
    assert torch.equal(tensor_leaves(stale[1]["snapshot"])[0], torch.full((D1,), 0.5, dtype=F64))  # x_0 kept
    assert torch.equal(stale[2]["snapshot"]["x"], stale[2]["x"]["x"])  # refreshed after round 3


def test_sagda_alternates_estimate_and_train_rounds() -> None:
    """M = m = 1, K = 1: a train round's step is exactly −η v (the local gradient cancels)."""
    fed = quad_fed(1)
    alg = quad(SAGDA, local_steps=1, lr=0.1)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    kinds = [sim.step().kind for _ in range(2)]
    assert kinds == ["estimate", "train"]
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    sim.step()
    before = {k: v for k, v in sim.server_state.items()}
    sim.step()
    after = sim.server_state
    torch.testing.assert_close(after["x"]["x"], before["x"]["x"] - 0.1 * before["v_x"]["x"], rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(after["y"], before["y"] + 0.1 * before["v_y"], rtol=1e-14, atol=1e-14)


def test_regularised_variant_adds_the_dual_pull() -> None:
    fed = quad_fed(1, heterogeneity=0.0, noise_std=0.0)
    reg = quad(FESSGDARegularized, local_steps=1, epsilon=0.4, dual_diameter=2.0, smoothing=0.0)
    plain = quad(FESSGDA, local_steps=1, smoothing=0.0)
    a, b = run_states(reg, fed, 2), run_states(plain, fed, 2)
    # round 1 starts from y_0 = 0: no pull yet; round 2's y-step has −(ε/2D)(y_1 − 0) more
    assert_rel(a[0]["y"], b[0]["y"])
    assert reg.dual_reg == pytest.approx(0.1)
    assert float((a[1]["y"] - b[1]["y"]).norm()) > 0
    with pytest.raises(FedriskError, match="dual_diameter"):
        quad(FESSGDARegularized)


# -- fair classification ---------------------------------------------------------------------
def group_fed() -> Federation:
    g = torch.Generator().manual_seed(0)

    def part(n: int) -> Samples:
        x = torch.randn(n, 4, generator=g, dtype=F64)
        y = (x[:, 0] > 0).long()
        return Samples(x, y, {"group": torch.arange(n) % 3})

    return Federation("groups", [part(12) for _ in range(4)], 2, test=part(30))


def test_fair_group_game_keeps_y_on_the_simplex_and_reports_worst_group_accuracy() -> None:
    fed = group_fed()
    model = FunctionalModel(build_model("logreg", (4,), 2))
    alg = FESSGDA(model=model, game="fair_group", dual_dim=3, lr=0.5, global_lr=2.0, local_steps=3, batch_size=6)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    for _ in range(4):
        sim.step()
    y = sim.server_state["y"]
    assert y.shape == (3,) and abs(float(y.sum()) - 1) < 1e-12 and bool((y >= 0).all())
    metrics = alg.state_metrics(sim.server_state, fed)
    assert 0 <= metrics["test_worst_group_accuracy"] <= 1 and metrics["dual_max"] >= 1 / 3


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, "lr = 0.0"),
        ({"lr_dual": -1.0}, "lr_dual"),
        ({"global_lr": 0.0}, "global_lr"),
        ({"global_lr_dual": -0.5}, "global_lr_dual"),
        ({"beta": 0.0}, "beta"),
        ({"beta": 1.5}, "beta"),
        ({"smoothing": -1.0}, "smoothing"),
        ({"local_steps": 0}, "local_steps"),
        ({"game": "chess"}, "unknown game 'chess'"),
        ({"sampling": "sorted"}, "sampling"),
    ],
)
def test_bad_hyper_parameters_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        FESSGDA(model=None, **kwargs)


def test_more_sampled_clients_than_clients_is_refused() -> None:
    with pytest.raises(FedriskError, match="clients_per_round = 6 exceeds the number of clients M = 5"):
        Simulation(quad(FESSGDA, clients_per_round=6), quad_fed(), seed=0)


def test_simplex_dimension_must_match_the_classes_and_groups() -> None:
    fed = group_fed()
    model = FunctionalModel(build_model("logreg", (4,), 2))
    with pytest.raises(FedriskError, match="dual_dim = 3 does not match the number of classes 2"):
        Simulation(FESSGDA(model=model, dual_dim=3), fed, seed=0)
    with pytest.raises(FedriskError, match="needs dual_dim"):
        Simulation(FESSGDA(model=model, game="fair_group"), fed, seed=0)
    with pytest.raises(FedriskError, match="discriminator has 2 parameters"):
        Simulation(FESSGDA(model=model, game="wgan", dual_dim=3), fed, seed=0)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("cls", [FESSGDA, SAGDA])
def test_group_ids_are_checked_before_the_run_whatever_the_executor(executor: str, cls: type) -> None:
    """Group ids >= dual_dim (or < 0) and a missing attribute are refused when the simulation is
    built, before round 0 — also under vmap, where the clients' own check cannot run."""
    model = FunctionalModel(build_model("logreg", (4,), 2))
    fed = group_fed()
    with pytest.raises(
        FedriskError,
        match=r"client 0's attribute 'group' has group ids from 0 to 2 but the simplex "
        r"dimension dual_dim = 2; allowed ids: 0 \.\. 1",
    ):
        Simulation(cls(model=model, game="fair_group", dual_dim=2, batch_size=4), fed, seed=0, executor=executor)
    with pytest.raises(FedriskError, match="no attribute 'sex'; attributes: group"):
        Simulation(cls(model=model, game="fair_group", dual_dim=3, group_attr="sex"), fed, seed=0, executor=executor)
    fed.clients[2].attrs["group"][0] = -1
    with pytest.raises(FedriskError, match="client 2's attribute 'group' has group ids from -1 to 2"):
        Simulation(cls(model=model, game="fair_group", dual_dim=3, batch_size=4), fed, seed=0, executor=executor)
    fed.clients[2].attrs["group"][0] = 0
    sim = Simulation(cls(model=model, game="fair_group", dual_dim=3, batch_size=4), fed, seed=0, executor=executor)
    sim.step()  # the valid ids run
    # a client that no simulation checked (e.g. deployed) still refuses bad ids in its eager round
    bad = dataclasses.replace(sim.data[1], attrs={"group": sim.data[1].attrs["group"] + 3})
    with pytest.raises(FedriskError, match="the client's attribute 'group' has group ids from 3 to 5"):
        sim.algorithm._check_data(bad, sim.info)


def test_diverging_client_reply_names_the_round_and_the_variable() -> None:
    fed = build_federation("wgan_1d", "iid", 2, seed=0, dataset_options={"num_samples": 200})
    gen = FunctionalModel(build_model("affine_generator", (1,), 1))
    alg = FSGDA(model=gen, game="wgan", lr=50.0, global_lr=2.0, local_steps=5, batch_size=10, wgan_lambda=0.0)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    message = r"client 0 replied with NaN/inf values in round 1 .*first non-finite leaf: x\.mu\)"
    with pytest.raises(FedriskError, match=message):
        for _ in range(200):
            sim.step()


def test_diverging_config_run_stops_naming_round_and_variable_and_keeps_its_checkpoint(tmp_path: Any) -> None:
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.runner import load_checkpoint, run_experiment

    raw = {
        "data": {"dataset": "wgan_1d", "num_clients": 2, "dataset_options": {"num_samples": 200}},
        "model": {"name": "affine_generator"},
        "algorithm": {
            "name": "fsgda",
            "game": "wgan",
            "lr": 0.5,
            "global_lr": 2.0,
            "local_steps": 2,
            "batch_size": 10,
            "wgan_lambda": 0.0,
        },
        "run": {"rounds": 50, "splits": [], "dtype": "float64", "checkpoint_every": 1},
        "output": {"plots": False},
    }
    with pytest.raises(FedriskError, match=r"NaN/inf values in round 5 .*first non-finite leaf: (x\.mu|x\.sigma|y)\)"):
        run_experiment(resolve_config(raw), tmp_path / "run", progress="none")
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["simulation"]["round"] == 5
    assert all(bool(torch.isfinite(v).all()) for v in tensor_leaves(ckpt["simulation"]["server_state"]))


def test_diverging_server_state_stops_naming_round_and_variable_and_keeps_its_checkpoint(tmp_path: Any) -> None:
    """The clients' replies stay finite; the server's smoothing step overflows x (c = η K p ≈ 1e99)."""
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.runner import load_checkpoint, run_experiment

    raw = {
        "data": {
            "dataset": "nc_sc_quadratic",
            "partition": "by_attribute",
            "num_clients": 5,
            "dataset_options": {"dim": D2, "samples_per_client": 20, "heterogeneity": 1.0, "noise_std": 0.3},
        },
        "model": {"name": "vector", "num_outputs": D1, "init": 0.5},
        "algorithm": {
            "name": "fessgda",
            "game": "quadratic",
            "dual_dim": D2,
            "quadratic_mu": 0.5,
            "lr": 0.05,
            "local_steps": 4,
            "batch_size": 5,
            "smoothing": 1e100,
            "beta": 0.5,
        },
        "run": {"rounds": 20, "splits": [], "dtype": "float64", "checkpoint_every": 1},
        "output": {"plots": False},
    }
    with pytest.raises(FedriskError, match=r"fessgda diverged in round 4: x \(primal\) became NaN/inf"):
        run_experiment(resolve_config(raw), tmp_path / "run", progress="none")
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["simulation"]["round"] == 4
    state = ckpt["simulation"]["server_state"]
    assert all(bool(torch.isfinite(v).all()) for v in tensor_leaves(state))
    assert float(tensor_leaves(state["x"])[0].abs().max()) > 1e295  # the last good iterate, about to overflow


def test_report_shows_the_game_metrics_without_being_asked(tmp_path: Any) -> None:
    """``fedrisk report`` (no ``--metrics``) tabulates generator_error and grad_phi_norm, the best
    value being the smallest, and prints tiny errors in scientific notation."""
    from fedrisk.cli import main

    wgan = {
        "data": {"dataset": "wgan_1d", "num_clients": 2, "dataset_options": {"num_samples": 200}},
        "model": {"name": "affine_generator"},
        "algorithm": {
            "name": "fessgda",
            "game": "wgan",
            "lr": 0.1,
            "local_steps": 10,
            "batch_size": 100,
            "wgan_lambda": 0.01,
        },
        "run": {
            "rounds": 300,
            "eval_every": 100,
            "eval_at_start": True,
            "splits": [],
            "dtype": "float64",
            "checkpoint_every": 0,
        },
        "output": {"plots": False},
    }
    quadratic = {
        "data": {
            "dataset": "nc_sc_quadratic",
            "partition": "by_attribute",
            "num_clients": 5,
            "dataset_options": {"dim": D2, "samples_per_client": 20},
        },
        "model": {"name": "vector", "num_outputs": D1, "init": 0.5},
        "algorithm": {
            "name": "fsgda",
            "game": "quadratic",
            "dual_dim": D2,
            "lr": 0.05,
            "local_steps": 4,
            "batch_size": 5,
        },
        "run": {"rounds": 4, "eval_every": 2, "splits": [], "dtype": "float64", "checkpoint_every": 0},
        "output": {"plots": False},
    }
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.outputs import load_run
    from fedrisk.experiment.runner import run_experiment

    for name, raw in (("wgan", wgan), ("quadratic", quadratic)):
        run_experiment(resolve_config(raw), tmp_path / name, progress="none")
    runs = [str(tmp_path / "wgan"), str(tmp_path / "quadratic")]
    assert main(["report", *runs, "--out", str(tmp_path), "--no-plots"]) == 0
    text = (tmp_path / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| configuration"))
    for metric in ("generator_error", "grad_phi_norm"):
        # no validation split here, so no selected column; the test-picked "best" is never tabulated
        assert f"final {metric}" in header and f"best {metric}" not in header
    errors = [r["generator_error"] for r in load_run(tmp_path / "wgan").records]
    assert errors[0] == pytest.approx(1.81) and errors[-1] < 1e-4  # converged: printed as x.xxe-yy
    row = next(line for line in text.splitlines() if line.startswith("| fessgda"))
    col = header.split("|").index(" final generator_error ")
    assert row.split("|")[col].strip().startswith(f"{errors[-1]:.2e}")
    assert row.split("|")[col + 1].strip() == "–"  # the WGAN game has no grad_phi_norm


def test_every_family_member_is_registered() -> None:
    for name in (
        "fessgda",
        "fessgda_ncc",
        "local_sgda",
        "local_sgda_plus",
        "fsgda",
        "fed_norm_sgda",
        "fed_norm_sgda_plus",
        "sagda",
    ):
        assert name in ALGORITHMS


# -- behaviour: the WGAN of §4.1 ---------------------------------------------------------------
def wgan_error(cls: type, rounds: int, **kw: Any) -> float:
    fed = build_federation("wgan_1d", "iid", 10, seed=0)
    gen = FunctionalModel(build_model("affine_generator", (1,), 1))
    alg = cls(model=gen, game="wgan", local_steps=10, batch_size=100, **kw)
    sim = Simulation(alg, fed, seed=0, dtype=F64, executor="vectorized")
    for _ in range(rounds):
        sim.step()
    return alg.state_metrics(sim.server_state, fed)["generator_error"]


def test_fessgda_solves_the_wgan_where_fsgda_stalls() -> None:
    """λ = 0.01, lr 0.1 / η_g 1 (best of the grid for both in the prototype), 150 rounds."""
    fess = wgan_error(FESSGDA, 150, lr=0.1, wgan_lambda=0.01, smoothing=1.0, beta=0.05)
    fsgda = wgan_error(FSGDA, 150, lr=0.1, wgan_lambda=0.01)
    assert fess < 1e-3, fess
    assert fsgda > 10 * fess, (fess, fsgda)


def test_fed_norm_sample_weighting_differs_from_uniform_on_unequal_clients() -> None:
    fed = group_fed()
    parts = [fed.clients[0], fed.clients[1].subset(list(range(6))), *fed.clients[2:]]
    fed = Federation("uneven", parts, 2, test=fed.test)
    model = FunctionalModel(build_model("logreg", (4,), 2))
    kw = {"model": model, "lr": 0.3, "local_steps": 3, "batch_size": 4}
    a = run_states(FedNormSGDA(weighting="samples", **kw), fed, 2)[-1]
    b = run_states(FedNormSGDA(weighting="uniform", **kw), fed, 2)[-1]
    assert float((a["y"] - b["y"]).norm()) > 0
    with pytest.raises(FedriskError, match="unknown weighting 'size'"):
        FedNormSGDA(model=model, weighting="size")


def test_regularised_variant_on_the_simplex_uses_its_diameter() -> None:
    fed = group_fed()
    model = FunctionalModel(build_model("logreg", (4,), 2))
    alg = FESSGDARegularized(model=model, epsilon=0.2, local_steps=2, batch_size=4)
    assert alg.dual_reg == pytest.approx(0.2 / (2 * math.sqrt(2)))
    y = run_states(alg, fed, 2)[-1]["y"]
    assert abs(float(y.sum()) - 1) < 1e-12 and bool((y >= 0).all())
