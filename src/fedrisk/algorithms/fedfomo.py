"""FedFomo: federated first-order model optimisation (Zhang, Sapra, Fidler, Yeung and Alvarez,
"Personalized Federated Learning with First Order Model Optimization", ICLR 2021), Alg. 1.

Every client i keeps its own model theta_i and a validation part of its data.  In round t the
server sends each sampled client M models of other clients (the latest each uploaded),
chosen epsilon-greedily by the server's affinity matrix P (eq. (8)): with probability
epsilon_t M clients uniformly at random, else the M with the largest P_{i,n}.  Client i then

1. weighs each downloaded model by its first-order improvement on its validation loss L_i
   (eq. (6)):  ``w_n = (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||``;
2. moves towards the models that help (eq. (7)):
   ``theta_i <- theta_i + sum_n max(w_n, 0) / sum_m max(w_m, 0) (theta_n - theta_i)`` (no move
   when no w_n is positive);
3. trains ``local_steps`` SGD steps on its training part and uploads theta_i and w.

The server stores theta_i and adds w to its affinity row: ``P_{i,n} += w_n``.

Resolved choices: the validation part is the last ``ceil(val_fraction * n_i)`` rows of a
client's training data (at least one row is kept for training); a zero distance (a model equal
to theta_i, as in round 0) gives w_n = 0; epsilon_t = max(0, epsilon - epsilon_decay * t);
ties in P are broken by the smaller client id.  The affinity matrix P is the run's "whom to
learn from" (``alpha.csv``).

Example:
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> FedFomo(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, val_fraction=1.0)
    Traceback (most recent call last):
    ...
    fedrisk.errors.FedriskError: val_fraction = 1.0 is out of range; allowed: (0.0, 1.0)
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
from fedrisk.algorithms.local import check_local_sgd, sample_batches, sgd_steps, supervised_objective
from fedrisk.errors import FedriskError, check_range
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_flatten_vector, tree_map, tree_stack


def validation_rows(num_samples: Any, fraction: float) -> Any:
    """``ceil(fraction * n)``: the number of validation rows (an int, or int64 tensor for a block)."""
    if isinstance(num_samples, Tensor):
        return torch.ceil(num_samples.to(torch.float64) * fraction - 1e-9).to(torch.int64)
    return math.ceil(num_samples * fraction - 1e-9)


def masked_loss(apply: Any, loss: LossFn, params: Tree, x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    """The mean of ``loss`` over the rows where ``mask`` is 1 (per-row losses, then a masked mean)."""
    out = apply(params, x)
    per_row = torch.vmap(lambda o, t: loss(o.unsqueeze(0), t.unsqueeze(0)))(out, y)
    return (per_row * mask).sum() / mask.sum().clamp_min(1.0)


def fomo_weights(own_loss: Tensor, losses: Tensor, distances: Tensor) -> Tensor:
    """Eq. (6): ``w_n = (L(theta_i) - L(theta_n)) / ||theta_n - theta_i||`` (0 where the distance is 0)."""
    safe = torch.where(distances > 0, distances, torch.ones_like(distances))
    return torch.where(distances > 0, (own_loss - losses) / safe, torch.zeros_like(losses))


@dataclass(frozen=True)
class FedFomo(Algorithm):
    """FedFomo (see the module docstring).

    Args:
        model, loss: the functional model and ``loss(outputs, labels)``.
        lr, local_steps, batch_size, sampling: the local SGD on the training part.
        num_download: M, the models a client receives per round (at most N - 1).
        epsilon, epsilon_decay: the epsilon-greedy choice of the downloads.
        val_fraction: the share of each client's rows used as its validation part.
        clients_per_round: partial participation (None: every client every round).

    Server state: ``models`` [N] (the latest uploaded theta_i), ``affinity`` P [N, N], ``round``;
    client state: ``model`` (theta_i).
    """

    name: ClassVar[str] = "fedfomo"
    personalized: ClassVar[bool] = True
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    num_download: int = 5
    epsilon: float = 0.3
    epsilon_decay: float = 0.05
    val_fraction: float = 0.2
    clients_per_round: int | None = None
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        check_range("num_download", self.num_download, 1)
        check_range("epsilon", self.epsilon, 0.0, 1.0)
        check_range("epsilon_decay", self.epsilon_decay, 0.0)
        check_range("val_fraction", self.val_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)

    def check(self, fed: FedInfo) -> None:
        if fed.num_clients < 2:
            raise FedriskError("fedfomo needs at least 2 clients (each learns from the others' models)")
        if self.clients_per_round is not None and self.clients_per_round > fed.num_clients:
            raise FedriskError(
                f"fedfomo: clients_per_round = {self.clients_per_round} is more than the federation's "
                f"{fed.num_clients} clients; allowed: 1 .. {fed.num_clients} (or none for all)"
            )
        bad = [k for k, n in enumerate(fed.client_sizes) if not 1 <= validation_rows(n, self.val_fraction) < n]
        if bad:
            raise FedriskError(
                f"fedfomo: clients {bad} are too small to split into training and validation rows with "
                f"val_fraction = {self.val_fraction}; every client needs at least one of each"
            )

    def downloads(self, fed: FedInfo) -> int:
        return min(self.num_download, fed.num_clients - 1)

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        N = ctx.fed.num_clients
        dtype = tree_flatten_vector(params).dtype
        return {
            "models": tree_stack([params] * N),
            "affinity": torch.zeros(N, N, dtype=dtype),
            "round": torch.zeros((), dtype=torch.int64),
        }

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"model": params}

    def choose(self, affinity: Tensor, client: int, M: int, epsilon: float, gen: torch.Generator) -> list[int]:
        """The M clients whose models ``client`` downloads (epsilon-greedy on its affinity row)."""
        others = [n for n in range(affinity.shape[0]) if n != client]
        if float(torch.rand((), generator=gen, dtype=torch.float64)) < epsilon:
            pick = torch.randperm(len(others), generator=gen)[:M].tolist()
            return sorted(others[p] for p in pick)
        row = affinity[client, others].to(torch.float64)
        order = sorted(range(len(others)), key=lambda p: (-float(row[p]), others[p]))
        return sorted(others[p] for p in order[:M])

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        epsilon = max(0.0, self.epsilon - self.epsilon_decay * int(server_state["round"]))
        M = self.downloads(ctx.fed)
        per_client = {}
        for k in clients:
            ids = self.choose(server_state["affinity"], k, M, epsilon, gen)
            index = torch.tensor(ids, dtype=torch.int64)
            per_client[k] = {"others": tree_map(lambda x, i=index: x[i], server_state["models"]), "ids": index}
        return RoundPlan(clients, per_client=per_client)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = replies.stacked("params")
        clients = torch.tensor(list(replies.clients), dtype=torch.int64, device=server_state["affinity"].device)
        models = tree_map(lambda v, x: v.index_copy(0, clients, x.to(v.dtype)), server_state["models"], new)
        affinity = server_state["affinity"].clone()
        for k, w in zip(replies.clients, replies.gather("weights")):
            ids = plan.per_client[k]["ids"]  # type: ignore[index]
            affinity[k, ids] += w.to(affinity.dtype)
        return {"models": models, "affinity": affinity, "round": server_state["round"] + 1}

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return client_state["model"]

    def weight_matrix(self, server_state: Tree) -> Tensor:
        """The affinity matrix P (row i: how much client i gained from each client's model)."""
        return server_state["affinity"]

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        train = num_samples - validation_rows(num_samples, self.val_fraction)
        return {"batches": sample_batches(rng, train, self.local_steps, self.batch_size, self.sampling)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        own, others = state["model"], payload["others"]
        M = int(payload["ids"].shape[-1])
        rows = torch.arange(data.x.shape[0], device=data.x.device)
        val = ((rows >= data.size - validation_rows(data.size, self.val_fraction)) & (rows < data.size)).to(
            data.x.dtype
        )
        val_loss = lambda p: masked_loss(self.model.apply, self.loss, p, data.x, data.y, val)  # noqa: E731
        own_vec = tree_flatten_vector(own)
        losses, dists, deltas = [], [], []
        for n in range(M):
            theta = tree_map(lambda x, n=n: x[n], others)
            losses.append(val_loss(theta))
            delta = tree_map(lambda a, b: a - b, theta, own)
            deltas.append(delta)
            dists.append((tree_flatten_vector(theta) - own_vec).norm())
        w = fomo_weights(val_loss(own), torch.stack(losses), torch.stack(dists))
        positive = w.clamp_min(0.0)
        coef = positive / positive.sum().clamp_min(torch.finfo(w.dtype).tiny)
        start = own
        for n in range(M):
            start = tree_map(lambda s, d, c=coef[n]: s + c * d, start, deltas[n])
        objective = supervised_objective(self.model.apply, self.loss)
        params, loss = sgd_steps(objective, start, data, draws["batches"], self.lr)
        return ClientResult({"params": params, "weights": w}, {"model": params}, {"loss": loss})
