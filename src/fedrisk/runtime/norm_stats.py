"""BatchNorm running statistics as federated state, for every algorithm and executor.

The algorithm contract passes parameter pytrees; a BatchNorm network also has running
statistics, which its forward pass updates in training and reads in evaluation.  Rather than
every family threading them through its local steps and aggregation, :func:`with_norm_stats`
wraps any algorithm whose model (:class:`~fedrisk.models.functional.FunctionalModel`) has
BatchNorm layers in :class:`NormStatsAlgorithm`, which is itself an ordinary algorithm, so the
sequential, vectorised and distributed executors and the Flower deployment run it unchanged:

* the statistics live in the server state under ``"norm_stats"`` next to the wrapped
  algorithm's own keys (and in each client's state under ``"local"`` / ``"frozen"``);
* ``client_update`` runs the wrapped one inside ``model.norm_scope(stats, train=True)``: every
  training forward pass (whatever local loop the family writes) moves the statistics, as
  ``nn.BatchNorm`` in ``train()`` mode does; the new statistics go into the reply;
* ``aggregate`` runs the wrapped one and then sets the statistics by the run's policy
  (``FunctionalModel(norm_stats=)``, config ``model.norm_stats``):

  - ``"averaged"`` (default): the replies' statistics, weighted by the clients' sample sizes
    (what FedAvg implementations do with a whole ``state_dict``); broadcast every round;
  - ``"local"`` (FedBN, Li et al. 2021): each client keeps its own statistics, never sent; the
    run is personalised (each client's model is evaluated with its statistics) and has no
    global model;
  - ``"frozen"``: the initial statistics (e.g. pretrained ones, ``init="module"`` or
    ``run.init_from``) are used in training and evaluation alike (eval-mode BatchNorm) and
    never change; nothing is sent;

* evaluation, ``configure`` and ``aggregate`` see the model in eval mode with the server's
  statistics; ``global_params`` / ``personal_params`` return the parameters with the
  statistics merged in beside them (a ``state_dict``-like tree), which ``predict`` splits again.

A client's state holds only its statistics beyond what the wrapped algorithm keeps: no copy
of the parameters.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> from fedrisk.runtime.simulation import Simulation
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(20)), s.subset(range(20, 40))], num_classes=2)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    >>> sim = Simulation(FedAvg(model=FunctionalModel(net), loss=cross_entropy, batch_size=5), fed)
    >>> type(sim.algorithm).__name__, sorted(sim.server_state)
    ('NormStatsAlgorithm', ['norm_stats', 'opt', 'params'])
    >>> _ = sim.step()
    >>> bool((sim.server_state["norm_stats"]["1.running_var"] != 1).all())
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tensor_leaves

KEY = "norm_stats"
"""The key of the running statistics in server states, client states, payloads and replies."""


def with_norm_stats(algorithm: Algorithm) -> Algorithm:
    """``algorithm`` wrapped in :class:`NormStatsAlgorithm` when its model has BatchNorm
    running statistics; unchanged otherwise (and when already wrapped)."""
    if isinstance(algorithm, NormStatsAlgorithm):
        return algorithm
    model = getattr(algorithm, "model", None)
    if not getattr(model, "stat_names", None):
        return algorithm
    return NormStatsAlgorithm(algorithm)


def _strip(state: Tree) -> Tree:
    return {k: v for k, v in state.items() if k != KEY} if isinstance(state, Mapping) else state


def _with(state: Tree, stats: Any, who: str) -> Tree:
    if not isinstance(state, Mapping):
        kind = type(state).__name__
        raise FedriskError(f"running statistics need a dict {who} state; the algorithm returned a {kind}")
    if KEY in state:
        raise FedriskError(f"the algorithm's {who} state already has a key {KEY!r}, which BatchNorm statistics need")
    return {**state, KEY: stats}


class NormStatsAlgorithm(Algorithm):
    """``inner`` with its model's running statistics carried as federated state (see the
    module docstring); flags and hyper-parameters are read through from ``inner``."""

    block_update = None  # the fused stacked programs know nothing of running statistics

    def __init__(self, inner: Algorithm) -> None:
        self.inner = inner
        self.model = inner.model  # type: ignore[attr-defined]
        self.policy = self.model.norm_stats
        self.name = inner.name
        self.personalized = inner.personalized or self.policy == "local"
        self.vectorizable = inner.vectorizable
        self.not_vectorizable_reason = inner.not_vectorizable_reason
        self.batched_draw = inner.batched_draw

    def __getattr__(self, name: str) -> Any:  # hyper-parameters, loss, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- set-up -----------------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        self.inner.check(fed)

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        self.inner.check_data(fed, data)

    def init_params(self, gen: torch.Generator) -> Tree:
        """The wrapped algorithm's initial parameters with the initial statistics beside them."""
        return self.model.attach_stats(self.inner.init_params(gen), self.model.init_stats())

    def _split(self, tree: Tree) -> tuple[Tree, dict[str, Tensor]]:
        params, stats = self.model.split_stats(tree)
        if stats is None:  # parameters only (e.g. init_params= without statistics): the initial ones
            like = next(iter(tensor_leaves(params)), torch.zeros(()))
            return params, self.model.init_stats(dtype=like.dtype, device=like.device)
        missing = sorted(set(self.model.stat_names) - set(stats))
        if missing:
            raise FedriskError(f"running statistics {missing[:4]} are missing from the initial model")
        return params, stats

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        inner_params, stats = self._split(params)
        return _with(self.inner.init_server(ctx, inner_params, gen), stats, "server")

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        inner_params, stats = self._split(params)
        state = self.inner.init_client(ctx, client, inner_params)
        return state if self.policy == "averaged" else _with(state, stats, "client")

    # -- one round --------------------------------------------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        with self.model.norm_scope(server_state[KEY], train=False):
            plan = self.inner.configure(ctx, _strip(server_state), gen)
        if self.policy != "averaged":
            return plan
        if KEY in plan.broadcast:
            raise FedriskError(f"the algorithm's broadcast already has a key {KEY!r}, which BatchNorm statistics need")
        return dataclasses.replace(plan, broadcast={**plan.broadcast, KEY: server_state[KEY]})

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return self.inner.draw(ctx, client, num_samples, rng)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        if self.policy == "averaged":
            stats, payload, inner_state = payload[KEY], _strip(payload), state
        else:
            stats, inner_state = state[KEY], _strip(state)
        with self.model.norm_scope(stats, train=True, update=self.policy != "frozen") as scope:
            reply, new_state, metrics = self.inner.client_update(ctx, payload, inner_state, data, draws)
        if self.policy == "averaged":
            return ClientResult(_with(reply, scope.result(), "reply"), new_state, metrics)
        kept = scope.result() if self.policy == "local" else stats
        return ClientResult(reply, _with(new_state, kept, "client"), metrics)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        stats = server_state[KEY]
        with self.model.norm_scope(stats, train=False):
            new = self.inner.aggregate(ctx, _strip(server_state), plan, replies, gen)
        if self.policy == "averaged":
            stats = replies.mean(KEY, ctx.fed.size_weights(replies.clients))
        return _with(new, stats, "server")

    # -- models and evaluation --------------------------------------------------------------
    def predict(self, params: Tree, x: Tensor) -> Tensor:
        inner_params, stats = self._split(params)
        with self.model.norm_scope(stats, train=False):
            return self.inner.predict(inner_params, x)

    def global_params(self, server_state: Tree) -> Tree | None:
        """The wrapped algorithm's global model with the server's statistics (None under
        ``"local"``: each client has its own statistics, so there is no global model)."""
        params = self.inner.global_params(_strip(server_state))
        if params is None or self.policy == "local":
            return None
        return self.model.attach_stats(params, server_state[KEY])

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree | None:
        params = self.inner.personal_params(_strip(server_state), _strip(client_state), client)
        if params is None:
            return None
        stats = client_state[KEY] if self.policy == "local" else server_state[KEY]
        return self.model.attach_stats(params, stats)

    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        with self.model.norm_scope(server_state[KEY], train=False):
            return self.inner.state_metrics(_strip(server_state), federation)
