r"""Fed-Norm-SGDA(+) and SAGDA: the FSGDA-based baselines of FESS-GDA's paper (spec
``shared/specs/001_fessgda.md`` §2.6), on the round, games and dual sets of
:mod:`fedrisk.algorithms.sgda` (re-exported there).

* :class:`FedNormSGDA` / :class:`FedNormSGDAPlus` — clients send the normalised update
  ``h_i = Δ_i / (η_l τ_i)``, the server steps ``−τ_eff η_g η_l Σ_i w_i h_i`` (Sharma, Panda &
  Joshi 2023); the "+" variant takes the y-gradient at a snapshot ``x̂``;
* :class:`SAGDA` — FSGDA with the control variate ``g_i(w) − g_i(w_t) + v_t`` built from the
  sampled clients' stochastic gradients at ``w_t`` (Yang, Zhang, Fang & Liu 2022).

``y`` may be a vector or a network's parameters (every update here is leaf-wise).

Example:
    >>> from fedrisk.data import build_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = build_federation("digits", "iid", 4, seed=0, dataset_options={"flatten": True})
    >>> alg = SAGDA(model=FunctionalModel(build_model("logreg", (64,), 10)), lr=0.1, local_steps=2, batch_size=16)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> sim.step().kind, sim.step().kind  # an estimate round, then a train round
    ('estimate', 'train')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import ClientResult, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.algorithms.primal_dual import Directions, flat_directions
from fedrisk.algorithms.sgda import ESTIMATE, FSGDA, WEIGHTINGS, _noise, _Snapshot, check_finite_state
from fedrisk.errors import unknown_name
from fedrisk.tree import Tree, tree_map

__all__ = ["SAGDA", "FedNormSGDA", "FedNormSGDAPlus"]


# ============================================================================================
# Fed-Norm-SGDA(+)
# ============================================================================================


@dataclass(frozen=True)
class FedNormSGDA(FSGDA):
    """Fed-Norm-SGDA (Sharma, Panda & Joshi 2023, arXiv 2302.04249): clients send the normalised
    updates ``h_{x,i} = (x_t − x_i^{K+1}) / (η_{x,l} τ_i)`` and ``h_{y,i} = (y_i^{K+1} − y_t) / (η_{y,l} τ_i)``;
    the server steps ``x_{t+1} = x_t − τ_eff η_{x,g} η_{x,l} Σ_i w_i h_{x,i}`` and
    ``y_{t+1} = P_Y(y_t + τ_eff η_{y,g} η_{y,l} Σ_i w_i h_{y,i})``.

    Here every client runs ``τ_i = K`` plain SGDA steps, so ``τ_eff = K``; with ``weighting =
    "uniform"`` (``w_i = 1/m``) it equals FSGDA (to rounding), as spec §2.6 says;
    ``"samples"`` weighs ``w_i ∝ n_i`` (the paper's data-size weights).
    """

    name: ClassVar[str] = "fed_norm_sgda"

    weighting: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weighting not in WEIGHTINGS:
            raise unknown_name("weighting", self.weighting, WEIGHTINGS)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = self.local_window(ctx, payload, data, draws)
        tau = self.local_steps
        h_x = tree_map(lambda a, b: (a - b) / (self.lr * tau), payload["x"], w.v)
        h_y = tree_map(lambda a, b: (a - b) / (self.lr_y * tau), w.alpha, payload["y"])
        return ClientResult({"h_x": h_x, "h_y": h_y}, state, {"loss": w.loss})

    def server_step(self, ctx: RoundContext, server_state: Tree, replies: Replies) -> dict[str, Any]:
        weights = ctx.fed.size_weights(replies.clients) if self.weighting == "samples" else None
        h_x, h_y = replies.mean("h_x", weights), replies.mean("h_y", weights)
        tau = self.local_steps
        x = tree_map(lambda p, h: p - (tau * self.global_lr * self.lr) * h, server_state["x"], h_x)
        y = self._project(
            ctx, tree_map(lambda p, h: p + (tau * self.global_lr_y * self.lr_y) * h, server_state["y"], h_y)
        )
        return {"x": x, "y": y}


@dataclass(frozen=True)
class FedNormSGDAPlus(_Snapshot, FedNormSGDA):
    """Fed-Norm-SGDA+ (Sharma, Panda & Joshi 2023): Fed-Norm-SGDA whose clients take the y-gradient
    at the snapshot ``x̂``, fixed for ``snapshot_period`` (S) rounds and then refreshed to the
    current global x (spec §2.6)."""

    name: ClassVar[str] = "fed_norm_sgda_plus"


# ============================================================================================
# SAGDA
# ============================================================================================


@dataclass(frozen=True)
class SAGDA(FSGDA):
    r"""SAGDA (Yang, Zhang, Fang & Liu, NeurIPS 2022, arXiv 2210.00611): FSGDA with stochastic
    sampling-averaging control variates.  One SAGDA iteration takes two communication rounds
    (round kinds)::

        "estimate" (even rounds): clients i ∈ S send g_i = ∇f_i(x_t, y_t; ξ_i);   server: v_t = mean_i g_i
        "train"    (odd rounds):  clients i ∈ S run K local steps with the corrected directions
                     d = ∇f_i(w_k; ξ_k) − ∇f_i(w_t; ξ_k) + v_t      (w = (x, y); y projected)
                   server: the FSGDA step with η_{x,g}, η_{y,g}

    Each round samples its own S (m clients); ``v`` is kept on the server and sent with
    ``(x_t, y_t)`` in the train round.  The ledger therefore counts two rounds per iteration.
    """

    name: ClassVar[str] = "sagda"

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        state = super().init_server(ctx, params, gen)
        state["v_x"] = tree_map(torch.zeros_like, params)
        state["v_y"] = tree_map(torch.zeros_like, state["y"])
        return state

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        broadcast = self.broadcast(server_state)
        if ctx.round % 2 == 0:
            return RoundPlan(clients, broadcast=broadcast, kind=ESTIMATE)
        return RoundPlan(clients, broadcast={**broadcast, "v_x": server_state["v_x"], "v_y": server_state["v_y"]})

    def directions(self, payload: Mapping[str, Any], data: LocalData, draws: Tree) -> Directions:
        batches, noise, x0, y0 = draws["batches"], draws.get("noise"), payload["x"], payload["y"]
        v_x, v_y = payload["v_x"], payload["v_y"]

        def fn(t: int, x: Tree, y: Tree) -> tuple[Tensor, Tree, Tree]:
            z = None if noise is None else noise[t]
            loss, gx, gy = self.gradients(x, y, data, batches[t], *_noise(z))
            _, rx, ry = self.gradients(x0, y0, data, batches[t], *_noise(z))
            return (
                loss,
                tree_map(lambda g, r, v: g - r + v, gx, rx, v_x),
                tree_map(lambda g, r, v: g - r + v, gy, ry, v_y),
            )

        return flat_directions(fn, x0, y0)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        if ctx.kind == ESTIMATE:
            self._check_data(data, ctx.fed)
            noise = draws["noise"][0] if "noise" in draws else None
            loss, gx, gy = self.gradients(payload["x"], payload["y"], data, draws["batches"][0], *_noise(noise))
            return ClientResult({"g_x": gx, "g_y": gy}, state, {"loss": loss})
        return super().client_update(ctx, payload, state, data, draws)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        if ctx.kind == ESTIMATE:
            new = {**server_state, "v_x": replies.mean("g_x"), "v_y": replies.mean("g_y")}
            check_finite_state(self.name, ctx.round, new, {"v_x": "v_x (control variate)", "v_y": "v_y"})
            return new
        return {**server_state, **super().aggregate(ctx, server_state, plan, replies, gen)}
