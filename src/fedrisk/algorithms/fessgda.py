r"""FESS-GDA: federated stochastic smoothed gradient descent-ascent.

Shen, Huang, Zhang & Shen, *Stochastic Smoothed Gradient Descent Ascent for Federated Minimax
Optimization*, AISTATS 2024 (spec ``shared/specs/001_fessgda.md``).  The problem is eq. (1),
``min_x max_{y ∈ Y} (1/M) Σ_i f_i(x, y)``; each round approximately runs GDA on the smoothed
surrogate ``f̂(x, y, z) = f(x, y) + (p/2)||x − z||²`` (§3.1).  Algorithm 1, exactly::

    for t = 0 .. T−1:
        S_t ← m of the M clients, uniformly without replacement          # server
        send (x_t, y_t) to every i ∈ S_t                                  # z_t is NOT sent
        client i ∈ S_t:  (x, y) ← (x_t, y_t)
            for k = 1..K:  ξ ← a minibatch of D_i
                g_x = ∇_x f_i(x, y; ξ),  g_y = ∇_y f_i(x, y; ξ)          # simultaneous, same ξ
                x ← x − η_{x,l} g_x ;   y ← P_Y(y + η_{y,l} g_y)         # y projected at every step
            send (x_i^{K+1}, y_i^{K+1})
        x̄, ȳ = (1/m) Σ_{i ∈ S_t} (x_i^{K+1}, y_i^{K+1})                   # server
        x_{t+1} = x_t + η_{x,g}(x̄ − x_t) − η_{x,l} η_{x,g} K p (x_t − z_t)  # smoothing: OLD x_t, z_t
        y_{t+1} = P_Y(y_t + η_{y,g}(ȳ − y_t))
        z_{t+1} = z_t + β (x_{t+1} − z_t)                                  # the NEW x_{t+1}

The client loop is :class:`~fedrisk.algorithms.sgda.FSGDA`'s (the shared primal-dual engine
:func:`~fedrisk.algorithms.primal_dual.local_sgda`); FESS-GDA differs only on the server, which
keeps ``z`` (never broadcast: the ledger's bytes down are those of FSGDA).  Reductions (§2.2,
tested to 1e-12 in float64): ``p = 0`` is FSGDA; ``p = 0`` with ``η_g = 1`` is Local SGDA; one
client and ``K = 1`` is centralised smoothed GDA with simultaneous steps.

:class:`FESSGDARegularized` is Theorem 3.3's variant for general NC-C objectives: it runs
Algorithm 1 on ``f̃(x, y) = f(x, y) − (ε/(4 D(Y)))||y − y_0||²`` (spec §2.3).

Resolved ambiguities (spec §2.7): ``z_0 = x_0``; sampling without replacement; both the local
and the server projections are applied; one minibatch for both gradients; ``lr_dual`` /
``global_lr_dual`` default to the primal values (the experiments' shared step sizes).  The
defaults ``p = 1``, ``β = 0.05`` are the WGAN experiment's, not the theory's constants (§6-7).

Example:
    >>> from fedrisk.data import build_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = build_federation("wgan_1d", "iid", 10, seed=0)
    >>> alg = FESSGDA(model=FunctionalModel(build_model("affine_generator", (1,), 1)), game="wgan",
    ...               lr=0.1, local_steps=10, batch_size=100, wgan_lambda=0.01)
    >>> sim = Simulation(alg, fed, seed=0, dtype=torch.float64, executor="vectorized")
    >>> start = alg.state_metrics(sim.server_state, fed)["generator_error"]  # (1 - 0)² + (1 - 0.1)²
    >>> for _ in range(20): _ = sim.step()
    >>> round(start, 2), alg.state_metrics(sim.server_state, fed)["generator_error"] < 0.2 * start
    (1.81, True)
    >>> sorted(sim.server_state)  # z lives on the server only
    ['x', 'y', 'z']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import LocalData, RoundContext
from fedrisk.algorithms.primal_dual import extrapolate
from fedrisk.algorithms.sgda import FSGDA
from fedrisk.errors import FedriskError, check_range
from fedrisk.tree import Tree, tensor_leaves, tree_map

__all__ = ["FESSGDA", "FESSGDARegularized", "smooth", "smoothing_step"]


def smoothing_step(x: Tree, x_bar: Tree, z: Tree, global_lr: float, coef: float, beta: float) -> tuple[Tree, Tree]:
    r"""The server map of Alg. 1 on ``(x, z)``:
    ``x' = x + η_g (x̄ − x) − c (x − z)`` with ``c = η_{x,l} η_{x,g} K p``, then ``z' = z + β (x' − z)``.

    Example (``f ≡ 0``: ``x̄ = x``; x − z shrinks by ``(1 − c)(1 − β)``):
        >>> import torch
        >>> x, z = torch.tensor(1.0), torch.tensor(0.0)
        >>> x1, z1 = smoothing_step(x, x, z, 1.0, 0.5, 0.25)
        >>> float(x1), float(z1), float(x1 - z1)
        (0.5, 0.125, 0.375)
    """
    return smooth(extrapolate(x, x_bar, global_lr), x, z, coef, beta)


def smooth(moved: Tree, x: Tree, z: Tree, coef: float, beta: float) -> tuple[Tree, Tree]:
    r"""The smoothing part of :func:`smoothing_step` after the extrapolation ``moved = x + η_g (x̄ − x)``:
    ``x' = moved − c (x − z)`` (the OLD ``x``, ``z``), then ``z' = z + β (x' − z)`` (the NEW ``x'``).

    Example:
        >>> import torch
        >>> [float(u) for u in smooth(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0.0), 0.5, 0.25)]
        [0.5, 0.125]
    """
    x_new = tree_map(lambda m, xt, zt: m - coef * (xt - zt), moved, x, z) if coef else moved
    z_new = tree_map(lambda zt, xn: zt + beta * (xn - zt), z, x_new)
    return x_new, z_new


@dataclass(frozen=True)
class FESSGDA(FSGDA):
    """FESS-GDA, Algorithm 1 (module docstring).

    Args (beyond :class:`~fedrisk.algorithms.sgda.FSGDA`: ``lr`` = η_{x,l}, ``lr_dual`` = η_{y,l},
    ``global_lr`` = η_{x,g}, ``global_lr_dual`` = η_{y,g}, ``local_steps`` = K,
    ``clients_per_round`` = m, the game):
        smoothing: p ≥ 0, the weight of ``(p/2)||x − z||²`` (p = 0: FSGDA).
        beta: β ∈ (0, 1], the step of ``z`` towards the new ``x``.
    """

    name: ClassVar[str] = "fessgda"

    smoothing: float = 1.0
    beta: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("smoothing", self.smoothing, 0.0, None)
        check_range("beta", self.beta, 0.0, 1.0, low_inclusive=False)

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        state = super().init_server(ctx, params, gen)
        state["z"] = tree_map(torch.clone, params)  # z_0 = x_0 (spec §2.7-1)
        return state

    def server_step(self, ctx: RoundContext, server_state: Tree, replies: Replies) -> dict[str, Any]:
        coef = self.lr * self.global_lr * self.local_steps * self.smoothing  # η_{x,l} η_{x,g} K p
        moved, y = self.global_step(ctx, server_state, replies)  # FSGDA's step on (x, y)
        x, z = smooth(moved, server_state["x"], server_state["z"], coef, self.beta)
        return {"x": x, "y": y, "z": z}


@dataclass(frozen=True)
class FESSGDARegularized(FESSGDA):
    r"""FESS-GDA on ``f̃(x, y) = f(x, y) − (ε/(4 D(Y)))||y − y_0||²`` (Theorem 3.3, general NC-C):
    every client adds ``−(ε/(2 D(Y)))(y − y_0)`` to its y-gradient (spec §2.3).  ``y_0`` is the
    initial dual (uniform on the simplex, 0 otherwise), a constant every client knows.

    Args:
        epsilon: ε > 0, the target accuracy (f̃ is ε/(2D)-strongly concave in y).
        dual_diameter: D(Y) > 0 (None: √2, the simplex's diameter; required for other Y).
    """

    name: ClassVar[str] = "fessgda_ncc"

    epsilon: float = 0.01
    dual_diameter: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("epsilon", self.epsilon, 0.0, None, low_inclusive=False)
        if self.dual_diameter is not None:
            check_range("dual_diameter", self.dual_diameter, 0.0, None, low_inclusive=False)
        elif self.feasible_set != "simplex":
            raise FedriskError(
                f"fessgda_ncc: game {self.game!r} has an unbounded Y; give dual_diameter (D(Y) of Theorem 3.3)"
            )

    @property
    def dual_reg(self) -> float:
        """``ε / (2 D(Y))``: the strong-concavity modulus of ``f̃`` in y."""
        diameter = math.sqrt(2.0) if self.dual_diameter is None else self.dual_diameter
        return self.epsilon / (2.0 * diameter)

    def gradients(
        self, x: Tree, y: Tree, data: LocalData, idx: Tensor, noise: Tensor | None = None
    ) -> tuple[Tensor, Tree, Tree]:
        value, gx, gy = super().gradients(x, y, data, idx, *(() if noise is None else (noise,)))
        if isinstance(y, Tensor):
            dim = y.shape[-1]
            y0 = torch.full_like(y, 1.0 / dim) if self.feasible_set == "simplex" else torch.zeros_like(y)
            diff = y - y0
            return value - 0.5 * self.dual_reg * torch.dot(diff, diff), gx, gy - self.dual_reg * diff
        # a network dual: y_0 = 0, or the uniform point of the simplex over all its parameters
        dim = sum(v.numel() for v in tensor_leaves(y))
        diff = tree_map(lambda v: v - (1.0 / dim if self.feasible_set == "simplex" else 0.0), y)
        sq = sum((d * d).sum() for d in tensor_leaves(diff))
        return value - 0.5 * self.dual_reg * sq, gx, tree_map(lambda g, d: g - self.dual_reg * d, gy, diff)
