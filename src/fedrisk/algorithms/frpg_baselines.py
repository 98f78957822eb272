"""The baselines of paper 002 (Dong et al.) beside FRPG and LFRPG (:mod:`fedrisk.algorithms.frpg`):
RSA (Li et al., 2019) and distributed SGD with a robust aggregator, on the same problem (5) and
the same server model ``w`` (all zeros unless ``zero_init`` is off).

RSA (Li et al., 2019), round k with ``eta_k = lr / sqrt(k)``::

    worker:  w_n <- w_n - eta_k (grad f(w_n; x) + lambda_R sign(w_n - w_0))     upload w_n
    server:  w_0 <- w_0 - eta_k (grad f_0(w_0) + lambda_R sum_n sign(w_0 - w_n))

RobustSGD: workers send a minibatch gradient at ``w_0``; ``w_0 <- w_0 - eta_k agg(gradients)``
with any aggregator (``mean`` = the paper's SGD, ``krum``, ``geometric_median`` = its Krum and
GeoMed baselines, which are equivariant, so aggregating gradients equals aggregating the models
``w_0 - eta_k grad``).

Example:
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> alg = RSA(model=FunctionalModel(build_model("logreg", (4,), 3)), loss=cross_entropy, lr=0.5)
    >>> alg.name, alg.lam, RobustSGD(model=alg.model, loss=cross_entropy).aggregator.name
    ('rsa', 0.02, 'mean')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedrisk.aggregators.base import Aggregator, Mean, Replies
from fedrisk.algorithms.base import ClientResult, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.frpg import _ServerModel, _vec
from fedrisk.algorithms.local import (
    batch,
    check_sampling,
    sample_batches,
    supervised_objective,
)
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import check_range, unknown_name
from fedrisk.objectives.penalties import check_positive, l1_subgrad
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_map, tree_unflatten_vector

__all__ = ["LR_DECAYS", "RSA", "RobustSGD"]

LR_DECAYS = ("sqrt", "constant")


class _BroadcastSGD(_ServerModel):
    """RSA and SGD-with-aggregation: the server broadcasts ``w`` as ``w0``; one minibatch per round."""

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"w": params}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)), broadcast={"w0": server_state["w"]})

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, 1, self.batch_size, self.sampling)}  # type: ignore[attr-defined]


# ============================================================================= RSA
@dataclass(frozen=True)
class RSA(_BroadcastSGD):
    """Robust Stochastic Aggregation with the l1 penalty (Li et al., 2019), step ``lr / sqrt(k)``.

    Workers upload their models ``w_n``; the server applies ``sign`` itself, so a faulty model of
    any magnitude moves ``w_0`` by at most ``eta_k lambda_R`` per coordinate.  ``lam`` is RSA's
    lambda_R (the paper does not give it; spec P8: about ``lambda / sqrt(d)``).
    """

    name: ClassVar[str] = "rsa"
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lam: float = 0.02
    lr: float = 3.0
    delta: float = 0.003
    delta_server: float = 0.003
    batch_size: int = 10
    sampling: str = "with_replacement"
    zero_init: bool = True

    def __post_init__(self) -> None:
        for name in ("lam", "lr"):
            check_positive(name, getattr(self, name))
        check_range("delta", self.delta, 0.0)
        check_range("delta_server", self.delta_server, 0.0)
        check_range("batch_size", self.batch_size, 1)
        check_sampling(self.sampling)

    def step_size(self, ctx: RoundContext) -> float:
        return self.lr / math.sqrt(ctx.round + 1)

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"w": params}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        eta = self.step_size(ctx)
        like = state["w"]
        w, w0 = _vec(state["w"]), _vec(payload["w0"])
        x, y = batch(data, draws["batches"][0])
        value, g = value_and_grad(supervised_objective(self.model.apply, self.loss))(like, x, y)
        direction = _vec(g) + self.delta * w + self.lam * l1_subgrad(w - w0)
        new = tree_unflatten_vector(w - eta * direction, like)
        return ClientResult({"w": new}, {"w": new}, {"loss": value})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        eta = self.step_size(ctx)
        w0 = _vec(server_state["w"])
        signs = torch.stack([l1_subgrad(w0 - _vec(w)) for w in replies.gather("w")]).sum(dim=0)
        new = w0 - eta * (self.delta_server * w0 + self.lam * signs)
        return {"w": tree_unflatten_vector(new, server_state["w"])}


# ============================================================================= SGD + aggregator
@dataclass(frozen=True)
class RobustSGD(_BroadcastSGD):
    """Distributed SGD whose server combines the workers' gradients with ``aggregator``.

    ``w_0 <- w_0 - eta_k agg_n(grad f_n(w_0; x_n))`` with ``eta_k = lr / sqrt(k)`` (``lr_decay =
    "sqrt"``, the paper's ``3/sqrt(k)``) or ``lr`` (``"constant"``).  ``aggregator = "mean"`` is the
    paper's SGD baseline, ``"krum"`` / ``"geometric_median"`` its Krum / GeoMed baselines.
    """

    name: ClassVar[str] = "robust_sgd"
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 3.0
    lr_decay: str = "sqrt"
    delta: float = 0.003
    batch_size: int = 10
    sampling: str = "with_replacement"
    zero_init: bool = True
    aggregator: Aggregator = field(default_factory=Mean)

    def __post_init__(self) -> None:
        check_positive("lr", self.lr)
        check_range("delta", self.delta, 0.0)
        check_range("batch_size", self.batch_size, 1)
        check_sampling(self.sampling)
        if self.lr_decay not in LR_DECAYS:
            raise unknown_name("lr_decay", self.lr_decay, LR_DECAYS)

    def step_size(self, ctx: RoundContext) -> float:
        return self.lr / math.sqrt(ctx.round + 1) if self.lr_decay == "sqrt" else self.lr

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w0 = payload["w0"]
        x, y = batch(data, draws["batches"][0])
        value, g = value_and_grad(supervised_objective(self.model.apply, self.loss))(w0, x, y)
        grad = tree_map(lambda gi, p: gi + self.delta * p, g, w0)
        return ClientResult({"grad": grad}, state, {"loss": value})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        eta = self.step_size(ctx)
        direction = self.aggregator(replies, "grad", None, gen=gen)  # bucketing draws from the round's generator
        return {"w": tree_map(lambda p, d: p - eta * d, server_state["w"], direction)}

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["w"]
