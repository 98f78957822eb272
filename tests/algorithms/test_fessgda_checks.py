"""Spec 001 §7.2 behavioural checks that run in seconds: B4 (PL-PL with p = 0: geometric decay to a
drift floor that shrinks with the step size; partial participation raises the floor, more with
larger heterogeneity σ_G) and B5 (linear speedup in m: the noise floor of ||∇Φ||² falls as m grows)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor

from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.fessgda import FESSGDA
from fedrisk.data import build_federation
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.minimax import quadratic_matrix
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import Tree, tensor_leaves

F64 = torch.float64


@dataclass(frozen=True)
class PLPLGame(FESSGDA):
    """FESS-GDA on B4's two-sided PL game (Yang et al. 2020), shifted per client:
    ``f_i(x, y) = x² + 3 sin²x sin²y − 4y² − 10 sin²y + a_i x − c_i y`` with ``(a_i, c_i)`` the
    client's rows (``Σ_i (a_i, c_i) = 0``: the global f, saddle (0, 0), is unchanged)."""

    name: ClassVar[str] = "plpl_check"

    def objective(self, x: Tree, y: Tensor, data: LocalData, idx: Tensor) -> Tensor:
        (xv,) = tensor_leaves(x)
        u, v = xv[0], y[0]
        a, c = data.x[idx].mean(0)
        su, sv = torch.sin(u), torch.sin(v)
        return u * u + 3 * su * su * sv * sv - 4 * v * v - 10 * sv * sv + a * u - c * v

    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        return {}


def plpl_federation(sigma_g: float, num_clients: int = 10) -> Federation:
    """Each client holds 4 copies of its shift row (so every minibatch gradient is exact: σ = 0)."""
    shifts = torch.randn(num_clients, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    shifts = sigma_g * (shifts - shifts.mean(0))
    clients = [Samples(shifts[k].repeat(4, 1), torch.zeros(4, dtype=torch.long)) for k in range(num_clients)]
    return Federation("plpl", clients, 2)


def distance_to_saddle(lr: float, rounds: int, sigma_g: float, m: int | None = None) -> list[float]:
    """``||x_t||² + ||y_t||²`` after every round (K = 5, p = 0, float64, start (1, 0))."""
    model = FunctionalModel(build_model("vector", (1,), 1, init=1.0))
    alg = PLPLGame(
        model=model,
        game="quadratic",
        dual_dim=1,
        smoothing=0.0,
        lr=lr,
        local_steps=5,
        batch_size=4,
        clients_per_round=m,
    )
    sim = Simulation(alg, plpl_federation(sigma_g), seed=0, dtype=F64)
    out = []
    for _ in range(rounds):
        sim.step()
        out.append(float(tensor_leaves(sim.server_state["x"])[0][0] ** 2 + sim.server_state["y"][0] ** 2))
    return out


def test_b4_pl_pl_geometric_decay_to_a_floor_that_shrinks_with_the_step_size() -> None:
    fast = distance_to_saddle(0.02, 40, sigma_g=20.0)
    # geometric phase: about a factor 10 every 8 rounds while far above the floor
    assert fast[0] < 0.7 and fast[8] < 0.03 and fast[16] < 3e-3
    floor = statistics.mean(fast[-8:])
    assert 2e-4 < floor < 3e-3  # the client-drift floor (heterogeneity, K = 5)
    assert max(fast[-8:]) < 1.5 * min(fast[-8:])  # reached: flat
    slow = distance_to_saddle(0.01, 80, sigma_g=20.0)
    assert statistics.mean(slow[-8:]) < 0.2 * floor  # η_l halved: the floor falls


def test_b4_partial_participation_raises_the_floor_more_with_larger_heterogeneity() -> None:
    full = statistics.mean(distance_to_saddle(0.02, 40, sigma_g=20.0)[-15:])
    small = statistics.mean(distance_to_saddle(0.02, 40, sigma_g=10.0, m=3)[-15:])
    large = statistics.mean(distance_to_saddle(0.02, 40, sigma_g=20.0, m=3)[-15:])
    assert large > 3 * full  # m = 3 of 10: the sampled shifts no longer cancel
    assert large > 2 * small  # and that floor grows with σ_G (≈ σ_G²)


def noise_floor(m: int, rounds: int = 200, executor: str = "vectorized") -> float:
    """B5's setting: the NC-SC game (d1 = 3, d2 = 4, μ = 1) with σ_G = 0 (no client shifts) and
    noisy rows (σ = 1, batch 1), FESS-GDA p = 1, β = 0.5, lr 0.05, K = 5; the mean of
    ||∇Φ(x_t)||² over the second half of the rounds."""
    opts = {"dim": 4, "samples_per_client": 50, "heterogeneity": 0.0, "noise_std": 1.0}
    fed = build_federation("nc_sc_quadratic", "by_attribute", 10, seed=0, dataset_options=opts)
    alg = FESSGDA(
        model=FunctionalModel(build_model("vector", (4,), 3, init=0.5)),
        game="quadratic",
        dual_dim=4,
        quadratic_mu=1.0,
        lr=0.05,
        local_steps=5,
        batch_size=1,
        clients_per_round=m,
        smoothing=1.0,
        beta=0.5,
    )
    sim = Simulation(alg, fed, seed=0, dtype=F64, executor=executor)
    tail = []
    for r in range(rounds):
        sim.step()
        if r >= rounds // 2:
            tail.append(alg.state_metrics(sim.server_state, fed)["grad_phi_norm"] ** 2)
    return statistics.mean(tail)


def test_quadratic_game_runs_under_vmap_from_a_cold_cache() -> None:
    """The coupling A is drawn on the server (init_server), never inside the clients' vmap."""
    quadratic_matrix.cache_clear()
    assert noise_floor(10, rounds=2) > 0


@pytest.mark.slow
def test_b5_noise_floor_falls_like_one_over_m() -> None:
    """Measured 2026-11-24: 0.093, 0.071, 0.031, 0.010 for m = 1, 2, 5, 10 (m·floor / floor(1) =
    1, 1.5, 1.7, 1.1)."""
    floors = {m: noise_floor(m) for m in (1, 2, 5, 10)}
    assert floors[1] > floors[2] > floors[5] > floors[10]
    for m in (2, 5, 10):
        assert 0.5 < m * floors[m] / floors[1] < 2.0  # ∝ 1/m within a factor of 2 (spec §7.2-B5)
