"""APPLE: adapt to adaptation, learned personalisation for cross-silo FL (Luo and Wu, IJCAI 2022).

Every client i has a *core model* theta_i (shared through the server) and a *directed
relationship* (DR) vector p_i in R^N; its personalised model is the combination

    phi_i = sum_j p_ij theta_j

of the core models it downloads.  In its local rounds it minimises, on its own data,

    L_i(phi_i) + lam(r) * mu / 2 * ||p_i - p_i^0||^2

by SGD on its own core theta_i and on p_i (the other cores are fixed during the round):
``theta_i <- theta_i - eta * p_ii * grad_phi L``,
``p_ij <- p_ij - eta_p * (<grad_phi L, theta_j> + lam(r) mu (p_ij - p^0_ij))``.
lam(r) follows the paper's cosine decay ``lam(r) = (1 + cos(pi r / L)) / 2`` for r < L and 0
after, so the DR vectors are first held near p^0 and then learned freely.  The client uploads
theta_i; the server keeps the latest core of every client and broadcasts them.

Resolved choices (stated here, not taken from the authors' code): p_i^0 is uniform (1/N
everywhere); every client downloads every core each round (the paper's limit M on downloads
is not implemented; the ledger counts all N cores down); the DR vectors stay on the clients
and the run's ``alpha.csv`` reads them from the client states.

Example:
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> APPLE(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy).decay(5), APPLE.name
    (0.5, 'apple')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.algorithms.ifca import select_row
from fedrisk.algorithms.local import batch, check_local_sgd, sample_batches, supervised_objective
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import FedriskError, check_range
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tensor_leaves, tree_map, tree_stack


def combine(cores: Tree, p: Tensor) -> Tree:
    """``sum_j p_j cores_j`` for cores stacked ``[N, ...]``."""
    return tree_map(lambda x: (p.to(x.dtype).reshape((-1,) + (1,) * (x.dim() - 1)) * x).sum(0), cores)


@dataclass(frozen=True)
class APPLE(Algorithm):
    """APPLE (see the module docstring).

    Args:
        model, loss: the functional model and ``loss(outputs, labels)``.
        lr: eta, the core model's step; ``dr_lr``: eta_p, the DR vector's step.
        local_steps, batch_size, sampling: the local SGD of one round.
        mu: the proximal strength on p_i; ``decay_rounds``: L of the cosine schedule of lam(r).
        clients_per_round: partial participation (None: every client every round).

    Server state: ``cores`` [N] (the latest uploaded core models); client state: ``p`` (the DR
    vector) and ``me`` (the client's one-hot position among the cores).
    """

    name: ClassVar[str] = "apple"
    personalized: ClassVar[bool] = True
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    dr_lr: float = 0.01
    local_steps: int = 1
    batch_size: int = 32
    mu: float = 0.1
    decay_rounds: int = 10
    clients_per_round: int | None = None
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        check_range("dr_lr", self.dr_lr, 0.0)
        check_range("mu", self.mu, 0.0)
        check_range("decay_rounds", self.decay_rounds, 0)

    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None and self.clients_per_round > fed.num_clients:
            raise FedriskError(
                f"apple: clients_per_round = {self.clients_per_round} is more than the federation's "
                f"{fed.num_clients} clients; allowed: 1 .. {fed.num_clients} (or none for all)"
            )

    def decay(self, round: int) -> float:
        """lam(r) = (1 + cos(pi r / L)) / 2 for r < L, then 0."""
        if round >= self.decay_rounds:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * round / self.decay_rounds))

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"cores": tree_stack([params] * ctx.fed.num_clients)}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        N = ctx.fed.num_clients
        dtype = next(iter(params.values())).dtype if isinstance(params, dict) else torch.float32
        me = torch.zeros(N, dtype=dtype)
        me[client] = 1.0
        return {"p": torch.full((N,), 1.0 / N, dtype=dtype), "me": me}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        return RoundPlan(clients, broadcast={"cores": server_state["cores"]})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = replies.stacked("core")
        clients = torch.tensor(list(replies.clients), dtype=torch.int64, device=tensor_leaves(new)[0].device)
        return {"cores": tree_map(lambda v, x: v.index_copy(0, clients, x.to(v.dtype)), server_state["cores"], new)}

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return combine(server_state["cores"], client_state["p"])

    def client_weights(self, client_states: Mapping[int, Tree]) -> Tensor:
        """The DR vectors as rows of an [N, N] matrix (``alpha.csv``)."""
        return torch.stack([client_states[k]["p"] for k in range(len(client_states))])

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        cores, p, me = payload["cores"], state["p"], state["me"]
        p0 = torch.full_like(p, 1.0 / p.shape[-1])
        strength = self.decay(ctx.round) * self.mu
        objective = supervised_objective(self.model.apply, self.loss)
        vg = value_and_grad(objective)
        core = select_row(cores, me)
        losses = []
        for t in range(self.local_steps):
            # phi_i = sum_{j != i} p_j theta_j (the downloaded cores) + p_i theta_i (the own core, trained)
            p_self = (p * me).sum()
            phi = tree_map(lambda o, c, pi=p_self: o + pi * c, combine(cores, p * (1 - me)), core)
            loss, g = vg(phi, *batch(data, draws["batches"][t]))
            losses.append(loss)
            # <grad_phi L, theta_j> for every j, the own core at its current value
            dots = sum(
                (gx.unsqueeze(0) * x).reshape(x.shape[0], -1).sum(1) for gx, x in zip(_leaves(g), _leaves(cores))
            )
            own = sum((gx * cx).sum() for gx, cx in zip(_leaves(g), _leaves(core)))
            dots = dots * (1 - me) + own * me
            core = tree_map(lambda c, gx, pi=p_self: c - self.lr * pi * gx, core, g)
            p = p - self.dr_lr * (dots + strength * (p - p0))
        return ClientResult({"core": core}, {"p": p, "me": me}, {"loss": torch.stack(losses).mean()})


def _leaves(tree: Tree) -> list[Tensor]:
    if isinstance(tree, dict):
        return [tree[k] for k in sorted(tree)]
    return list(tree)
