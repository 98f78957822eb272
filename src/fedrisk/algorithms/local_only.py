"""The two reference points of every federated comparison: no federation and no privacy.

* :class:`LocalOnly` — every client trains its own model on its own data and never
  communicates (the lower reference of personalised FL; e.g. PERM's "local" baseline).
* centralised training — minibatch SGD on all clients' data pooled in one place (the upper
  reference).  :func:`centralized` pools a federation into a one-client federation, and
  :class:`Centralized` is FedAvg restricted to such a federation: one client running E local
  steps per round with the server adopting its model is exactly plain minibatch SGD with E
  steps per "round" (tested step for step against ``torch.optim.SGD``).

Resolved choices:

* LocalOnly's server sends nothing and clients reply nothing, so the ledger records
  **0 bytes** in both directions; the server state is empty.  Each client's model lives in its
  client state (``{"params": ...}``), starting from the common initial parameters.
  ``global_params`` is None (there is no global model), so evaluation reports personalised
  metrics only, which needs per-client test splits (``Federation.client_tests``).
* Because a LocalOnly reply is empty, a diverging client (NaN parameters) is not caught by the
  runtime's reply check; its NaN shows up in its training loss and personalised metrics.
* Centralised training is a data transformation, not a new optimiser: pooling keeps the global
  validation / test sets and concatenates the per-client test splits into the one client's
  test split.  A config can therefore say ``algorithm = "centralized"`` only for a pooled
  federation; :meth:`Centralized.check` says how to get one.

Example:
    >>> import torch
    >>> from fedrisk.data.federation import Federation, Samples
    >>> s = Samples(torch.randn(6, 2), torch.tensor([0, 1, 0, 1, 1, 0]))
    >>> fed = Federation("toy", [s.subset([0, 1]), s.subset([2, 3, 4, 5])], num_classes=2, test=s)
    >>> pooled = centralized(fed)
    >>> pooled.num_clients, pooled.client_sizes, len(pooled.test)
    (1, (6,), 6)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local import check_local_sgd, sample_batches, sgd_steps, supervised_objective
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree


@dataclass(frozen=True)
class LocalOnly(Algorithm):
    """Each client runs ``local_steps`` SGD steps per round on its own model; no averaging.

    Args:
        model: a functional model (``init_params``, ``apply``).
        loss: ``loss(outputs, labels)``.
        lr: learning rate.
        local_steps: SGD steps per round (every client takes part in every round).
        batch_size: minibatch size.
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.

    Server state ``{}``; client state ``{"params": w_k}``; payload ``{}``; reply ``{}``.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> alg = LocalOnly(model=FunctionalModel(build_model("logreg", (4,), 3)), loss=cross_entropy)
        >>> alg.personalized, alg.global_params({})
        (True, None)
    """

    name: ClassVar[str] = "local_only"
    batched_draw: ClassVar[bool] = True
    personalized: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, None)

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"params": params}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)))  # an empty broadcast

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        objective = supervised_objective(self.model.apply, self.loss)
        params, loss = sgd_steps(objective, state["params"], data, draws["batches"], self.lr)
        return ClientResult({}, {"params": params}, {"loss": loss})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        return server_state

    def global_params(self, server_state: Tree) -> None:
        return None

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return client_state["params"]


def centralized(federation: Federation) -> Federation:
    """The same data with every client's training split pooled into one client.

    Validation and test sets are kept; per-client test (and validation) splits are concatenated
    into the single client's test (validation) split.  FedAvg (or :class:`Centralized`) on the
    result is minibatch SGD on the pooled data.

    Example:
        >>> import torch
        >>> from fedrisk.data.federation import Federation, Samples
        >>> s = Samples(torch.arange(4.0).reshape(4, 1), torch.tensor([0, 1, 1, 0]))
        >>> centralized(Federation("toy", [s.subset([0]), s.subset([1, 2, 3])], 2)).clients[0].x.flatten().tolist()
        [0.0, 1.0, 2.0, 3.0]
    """
    tests, vals = federation.client_tests, federation.client_validations
    return Federation(
        name=f"{federation.name} (pooled)",
        clients=[federation.pooled()],
        num_classes=federation.num_classes,
        client_tests=None if tests is None else [Samples.concat(tests)],
        client_validations=None if vals is None else [Samples.concat(vals)],
        validation=federation.validation,
        test=federation.test,
        class_names=federation.class_names,
        info={**federation.info, "pooled_clients": federation.num_clients},
    )


@dataclass(frozen=True)
class Centralized(FedAvg):
    """Minibatch SGD on pooled data: FedAvg on a one-client federation (see :func:`centralized`).

    ``local_steps`` SGD steps make one "round" (one evaluation unit); ``clients_per_round``,
    ``weighting`` and the aggregator are irrelevant with one client.  ``server_opt`` still
    applies (``server_lr(1)`` = plain SGD).

    ``requires_pooled_data`` tells a runner to pass the federation through
    :func:`centralized` first.
    """

    name: ClassVar[str] = "centralized"
    requires_pooled_data: ClassVar[bool] = True

    def check(self, fed: FedInfo) -> None:
        if fed.num_clients != 1:
            raise FedriskError(
                f"algorithm 'centralized' trains on pooled data and needs a federation with exactly 1 "
                f"client, got num_clients = {fed.num_clients}; pool the clients first with "
                "fedrisk.algorithms.local_only.centralized(federation)"
            )
        super().check(fed)
