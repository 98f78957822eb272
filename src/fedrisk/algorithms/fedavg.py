"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020).

FedAvg, one round r:

    server:  choose S_r (all clients, or ``clients_per_round`` uniformly without replacement);
             send w_r
    client k in S_r:  w <- w_r;  repeat E times:  w <- w - lr * grad f_k(w; minibatch)
             (FedProx adds mu * (w - w_r) to every gradient)
    server:  w_bar = sum_k p_k w_k   (p_k = n_k / sum n, or 1/|S_r| with weighting="uniform")
             w_{r+1} = w_r + server_opt(w_bar - w_r)     (server_lr(1) = plain averaging)

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> alg = FedAvg(model=FunctionalModel(build_model("logreg", (4,), 3)), loss=cross_entropy, lr=0.1)
    >>> alg.local_steps, alg.weighting
    (1, 'samples')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedrisk.aggregators.base import Aggregator, Replies, WeightedMean
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.fused import fused_sgd_steps
from fedrisk.algorithms.local import (
    active_fast_paths,
    check_local_sgd,
    sample_batches,
    sgd_steps,
    supervised_objective,
)
from fedrisk.algorithms.server_opt import ServerOpt, apply_step, identity
from fedrisk.errors import check_range, unknown_name
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_map, tree_sub

WEIGHTINGS = ("samples", "uniform")


@dataclass(frozen=True)
class FedAvg(Algorithm):
    """Federated averaging with E local SGD steps per round.

    Args:
        model: a functional model (``init_params``, ``apply``).
        loss: ``loss(outputs, labels)``.
        lr: local learning rate.
        local_steps: E, local SGD steps per round.
        batch_size: local minibatch size.
        weighting: ``"samples"`` (p_k = n_k / n) or ``"uniform"`` (p_k = 1/|S_r|).
        clients_per_round: partial participation (None = every client every round).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.
        aggregator: how client models are combined (``WeightedMean`` by default).
        server_opt: server step on the averaged delta (``identity()`` = plain averaging).
    """

    name: ClassVar[str] = "fedavg"
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    weighting: str = "samples"
    clients_per_round: int | None = None
    sampling: str = "with_replacement"
    aggregator: Aggregator = field(default_factory=WeightedMean)
    server_opt: ServerOpt = field(default_factory=identity)

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        if self.weighting not in WEIGHTINGS:
            raise unknown_name("weighting", self.weighting, WEIGHTINGS)

    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None:
            check_range("clients_per_round", self.clients_per_round, 1, fed.num_clients)

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"params": params, "opt": self.server_opt.init(params)}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        return RoundPlan(clients, broadcast={"params": server_state["params"]})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        weights = ctx.fed.size_weights(replies.clients) if self.weighting == "samples" else None
        mean = self.aggregator(replies, "params", weights, gen=gen)
        params = server_state["params"]
        step, opt = self.server_opt.update(tree_sub(mean, params), server_state["opt"], params)
        return {"params": apply_step(params, step), "opt": opt}

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["params"]

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}

    def local_correction(self, payload: Mapping[str, Any], state: Tree):
        """The gradient correction of this family (none for FedAvg)."""
        return None

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        objective = supervised_objective(self.model.apply, self.loss)
        params, loss = sgd_steps(
            objective, payload["params"], data, draws["batches"], self.lr, self.local_correction(payload, state)
        )
        return ClientResult({"params": params}, state, {"loss": loss})

    def block_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], data: LocalData, draws: Tree
    ) -> ClientResult | None:
        """:meth:`client_update` of a block of stateless clients sharing ``payload`` at once,
        as the vectorised executor's fast path: ``data`` and ``draws`` stacked ``[C, ...]``, the
        result stacked likewise.  None (the executor then uses ``vmap``) unless this is FedAvg's
        own local loop with no correction or FedProx's proximal term, on a model and loss that
        :func:`~fedrisk.algorithms.fused.fused_sgd_steps` supports.
        """
        if type(self).client_update is not FedAvg.client_update or not active_fast_paths().fused:
            return None
        mu = 0.0
        if type(self).local_correction is FedProx.local_correction:
            mu = float(self.mu)  # type: ignore[attr-defined]
        elif self.local_correction(payload, {}) is not None:
            return None
        out = fused_sgd_steps(self.model, self.loss, payload["params"], data, draws["batches"], self.lr, mu)
        if out is None:
            return None
        return ClientResult({"params": out[0]}, {}, {"loss": out[1]})


@dataclass(frozen=True)
class FedProx(FedAvg):
    """FedAvg whose local objective adds ``(mu/2) ||w - w_r||^2`` (Li et al., 2020, eq. (2)).

    With ``mu = 0`` it is exactly FedAvg.
    """

    name: ClassVar[str] = "fedprox"
    mu: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("mu", self.mu, 0.0)

    def local_correction(self, payload: Mapping[str, Any], state: Tree):
        anchor, mu = payload["params"], self.mu
        return lambda params, g: tree_map(lambda gi, p, a: gi + mu * (p - a), g, params, anchor)
