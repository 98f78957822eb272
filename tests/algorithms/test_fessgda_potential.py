"""Spec 001 §7.2-B7: along FESS-GDA's iterates the proof's Lyapunov function
``V_t = f̂(x_t, y_t, z_t) − 2Ψ(y_t, z_t) + 2P(z_t)`` (§1.6) is non-increasing when the theory's
step-size relations are used (p = 2l, η_y = η_x/256, small β), on a quadratic NC-SC game where
Ψ and P have closed forms:

    f_i(x, y) = ½ xᵀHx + yᵀ(A x + r_i) − (μ/2)||y||²,   H indefinite (nonconvex in x),  Σ_i r_i / M = b
    f̂ = f + (p/2)||x − z||²
    Ψ(y, z) = min_x f̂ :  x* = (H + pI)⁻¹(p z − Aᵀy)
    P(z) = min_x max_y f̂ = min_x ½xᵀHx + (p/2)||x − z||² + ||A x + b||²/(2μ)

Exact gradients (every client's rows are copies of its r_i, so σ = 0) and client heterogeneity
(r_i differ), K = 2 local steps, all clients.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.algorithms.base import LocalData
from fedrisk.algorithms.fessgda import FESSGDA
from fedrisk.data.federation import Federation, Samples
from fedrisk.models import FunctionalModel, build_model
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import Tree, tensor_leaves

F64 = torch.float64
H = torch.diag(torch.tensor([-0.5, 0.2, 1.0], dtype=F64))
A = torch.tensor([[1.0, 0.3, 0.0], [0.0, 1.0, -0.4], [0.5, 0.0, 1.0], [0.2, -0.3, 0.1]], dtype=F64)
MU = 1.0
M_CLIENTS = 4


@dataclass(frozen=True)
class QuadraticNCSC(FESSGDA):
    """FESS-GDA on the module docstring's quadratic game (the client's rows are ``r_i``)."""

    name: ClassVar[str] = "ncsc_potential_check"

    def objective(self, x: Tree, y: Tensor, data: LocalData, idx: Tensor) -> Tensor:
        (xv,) = tensor_leaves(x)
        r = data.x[idx].mean(0)
        return 0.5 * xv @ H @ xv + y @ (A @ xv + r) - 0.5 * MU * y @ y

    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        return {}


def smoothness() -> float:
    """l: the spectral norm of f's Hessian in (x, y)."""
    hess = torch.cat([torch.cat([H, A.T], 1), torch.cat([A, -MU * torch.eye(4, dtype=F64)], 1)], 0)
    return float(torch.linalg.eigvalsh(hess).abs().max())


def rows() -> tuple[list[Tensor], Tensor]:
    g = torch.Generator().manual_seed(0)
    b = torch.randn(4, generator=g, dtype=F64)
    delta = torch.randn(M_CLIENTS, 4, generator=g, dtype=F64)
    delta = delta - delta.mean(0)
    return [b + d for d in delta], b


def potential(x: Tensor, y: Tensor, z: Tensor, p: float, b: Tensor) -> float:
    eye = torch.eye(3, dtype=F64)

    def f_hat(xv: Tensor, yv: Tensor) -> Tensor:
        return 0.5 * xv @ H @ xv + yv @ (A @ xv + b) - 0.5 * MU * yv @ yv + 0.5 * p * (xv - z) @ (xv - z)

    x_psi = torch.linalg.solve(H + p * eye, p * z - A.T @ y)
    q = H + p * eye + A.T @ A / MU
    x_p = torch.linalg.solve(q, p * z - A.T @ b / MU)
    p_val = 0.5 * x_p @ H @ x_p + 0.5 * p * (x_p - z) @ (x_p - z) + (A @ x_p + b) @ (A @ x_p + b) / (2 * MU)
    return float(f_hat(x, y) - 2 * f_hat(x_psi, y) + 2 * p_val)


def run_potential(rounds: int, lr: float, k: int = 2, beta_scale: float = 1.0) -> list[float]:
    l_smooth = smoothness()
    p = 2 * l_smooth
    lr_dual = lr / 256  # η_y = η_x / 256 (global rates 1)
    beta = beta_scale * lr_dual * k * MU  # the theory's β ∝ η_y K μ (its 1/80000 relaxed)
    r, b = rows()
    clients = [Samples(ri.repeat(2, 1), torch.zeros(2, dtype=torch.long)) for ri in r]
    fed = Federation("ncsc_potential", clients, 2)
    model = FunctionalModel(build_model("vector", (1,), 3, init=1.0))
    alg = QuadraticNCSC(
        model=model,
        game="quadratic",
        dual_dim=4,
        lr=lr,
        lr_dual=lr_dual,
        local_steps=k,
        batch_size=2,
        smoothing=p,
        beta=beta,
    )
    sim = Simulation(alg, fed, seed=0, dtype=F64)

    def v() -> float:
        s = sim.server_state
        return potential(tensor_leaves(s["x"])[0], s["y"], tensor_leaves(s["z"])[0], p, b)

    out = [v()]
    for _ in range(rounds):
        sim.step()
        out.append(v())
    return out


def phi_star() -> float:
    """``Φ* = min_x Φ(x)``, ``Φ(x) = ½xᵀHx + ||A x + b||²/(2μ)`` (H + AᵀA/μ is positive definite)."""
    _, b = rows()
    x = torch.linalg.solve(H + A.T @ A / MU, -A.T @ b / MU)
    return float(0.5 * x @ H @ x + (A @ x + b) @ (A @ x + b) / (2 * MU))


def test_b7_potential_is_non_increasing_with_the_theory_step_sizes() -> None:
    """Measured 2026-11-24: V_0 − Φ* = 6.80, after 200 rounds 5.15; the largest one-round change
    −0.006 (every round decreases)."""
    v = run_potential(200, lr=1.0 / (4 * smoothness()))
    steps = [b - a for a, b in itertools.pairwise(v)]
    assert max(steps) < 0  # V_{t+1} < V_t in every round (σ = 0: no noise to allow for)
    gap0, gap = v[0] - phi_star(), v[-1] - phi_star()
    assert gap > 0  # V ≥ P(z) ≥ Φ* (§1.6)
    assert gap < 0.8 * gap0
