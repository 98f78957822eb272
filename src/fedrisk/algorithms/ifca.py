"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin and Ramchandran, "An
Efficient Framework for Clustered Federated Learning", NeurIPS 2020), Algorithm 1 with model
averaging.

The server keeps k cluster models theta_1..theta_k.  In round t it sends all k to the sampled
clients M_t; client i

1. estimates its cluster ``j_hat = argmin_j F_i(theta_j)`` (its full local loss; ties: the
   smallest j) and keeps the one-hot ``s_i = e_{j_hat}``;
2. runs ``local_steps`` SGD steps from ``theta_{j_hat}`` (the paper's "model averaging"
   option, tau local steps) and replies with the model and ``s_i``.

The server sets ``theta_j = sum_{i in M_t} s_{i,j} theta_i' / sum_{i in M_t} s_{i,j}`` (a
uniform average over the clients that chose j; a cluster nobody chose keeps its model).

Resolved choices: theta_1 is the run's initial model and theta_2..theta_k fresh random
initialisations from the server's generator (the paper initialises randomly); a client's
personal model is the cluster model of its latest estimate (clients not yet sampled use
cluster 1); there is no global model (the k cluster models are the result).

Example:
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> IFCA(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, num_clusters=1)
    Traceback (most recent call last):
    ...
    fedrisk.errors.FedriskError: num_clusters = 1 is out of range; allowed: [2, inf)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.algorithms.local import (
    check_local_sgd,
    full_batch_objective,
    sample_batches,
    sgd_steps,
    supervised_objective,
)
from fedrisk.errors import FedriskError, check_range
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_map, tree_stack


def select_row(stacked: Tree, onehot: Tensor) -> Tree:
    """``sum_j onehot[j] * stacked[j]``: row j of a stacked tree, chosen by a one-hot tensor
    (no Python branch on its value, so it runs under ``vmap``; exact for a 0/1 vector)."""
    return tree_map(lambda x: (onehot.to(x.dtype).reshape((-1,) + (1,) * (x.dim() - 1)) * x).sum(0), stacked)


@dataclass(frozen=True)
class IFCA(Algorithm):
    """IFCA with k cluster models (see the module docstring).

    Args:
        model, loss: the functional model and ``loss(outputs, labels)``.
        num_clusters: k >= 2.
        lr, local_steps, batch_size, sampling: the local SGD from the chosen cluster model.
        clients_per_round: partial participation (None: every client every round).

    Server state: ``models`` (k models stacked); client state: ``cluster`` (the one-hot estimate).
    """

    name: ClassVar[str] = "ifca"
    personalized: ClassVar[bool] = True
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    num_clusters: int = 2
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    clients_per_round: int | None = None
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        check_range("num_clusters", self.num_clusters, 2)

    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None and self.clients_per_round > fed.num_clients:
            raise FedriskError(
                f"ifca: clients_per_round = {self.clients_per_round} is more than the federation's "
                f"{fed.num_clients} clients; allowed: 1 .. {fed.num_clients} (or none for all)"
            )

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        others = [tree_map(lambda p, q: q.to(p), params, self.init_params(gen)) for _ in range(1, self.num_clusters)]
        return {"models": tree_stack([params, *others])}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        first = torch.zeros(self.num_clusters, dtype=torch.int64)
        first[0] = 1
        return {"cluster": first}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        return RoundPlan(clients, broadcast={"models": server_state["models"]})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        s = replies.stacked("cluster")  # [C, k] one-hot
        new = replies.stacked("params")  # [C, ...]
        counts = s.sum(0)

        def average(old: Tensor, x: Tensor) -> Tensor:
            x = x.to(old.dtype)
            total = torch.einsum("ck,c...->k...", s.to(x.dtype), x)
            shape = (-1,) + (1,) * (old.dim() - 1)
            mean = total / counts.clamp_min(1).to(x.dtype).reshape(shape)
            return torch.where((counts > 0).reshape(shape), mean, old)

        return {"models": tree_map(average, server_state["models"], new)}

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return select_row(server_state["models"], client_state["cluster"])

    def client_clusters(self, client_states: Mapping[int, Tree]) -> Tensor:
        """Every client's current cluster estimate j_hat (``clusters.csv``; 0 before its first round)."""
        return torch.stack([client_states[k]["cluster"].argmax() for k in range(len(client_states))])

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        models = payload["models"]
        full = full_batch_objective(self.model.apply, self.loss)
        losses = torch.stack([full(tree_map(lambda x, j=j: x[j], models), data) for j in range(self.num_clusters)])
        onehot = torch.nn.functional.one_hot(losses.argmin(), self.num_clusters)
        start = select_row(models, onehot)
        params, loss = sgd_steps(
            supervised_objective(self.model.apply, self.loss), start, data, draws["batches"], self.lr
        )
        return ClientResult({"params": params, "cluster": onehot}, {"cluster": onehot}, {"loss": loss})
