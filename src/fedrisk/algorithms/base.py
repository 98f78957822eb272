"""The algorithm contract.

A federated algorithm is a small object with frozen hyper-parameters and *pure* functions over
explicit state (pytrees of tensors).  Nothing is kept in mutable attributes between calls, so
every executor (sequential, vectorised, distributed) can run it and every run can be
checkpointed and resumed.  One round is one broadcast and one reply per selected client.

The five calls, in the order a round uses them::

    init_server(ctx, params, gen)                    -> server_state         (once)
    init_client(ctx, client, params)                 -> client_state         (once per client)
    configure(ctx, server_state, gen)                -> RoundPlan            (server, every round)
    draw(ctx, client, num_samples, rng)              -> draws                (client randomness)
    client_update(ctx, payload, state, data, draws)  -> ClientResult         (client, pure tensors)
    aggregate(ctx, server_state, plan, replies, gen) -> server_state         (server)

* ``configure`` decides the round's kind (``plan.kind``; e.g. a stage boundary, PERM's
  weight-estimation round) from the server state, which clients take part, and the payload:
  a ``broadcast`` that every selected client receives plus optional ``per_client`` parts
  (PERM sends each client a different model).
* ``draw`` makes all of a client's random choices for the round (minibatch indices, noise)
  from the client's own counter-based generator (:class:`fedrisk.rng.ClientRNG`, a pure
  function of (seed, round, client)).  With ``batched_draw = True`` the same ``draw`` code
  also runs once for a whole block of clients (see :meth:`Algorithm.draw`).  ``client_update`` is then
  a deterministic tensor function of its inputs, written with :mod:`fedrisk.autodiff` /
  ``torch.func`` so that the vectorised executor can ``vmap`` it over a block of clients.
  It must not branch in Python on tensor *values*.
* ``aggregate`` sees the replies through a :class:`~fedrisk.aggregators.base.Replies` view: it
  asks for sums / means (``sum`` kind: one all-reduce in the distributed executor) or gathers
  every reply (``gather`` kind: robust aggregators, pools such as FeDXL's passive scores).

Example (FedAvg in a few lines; the real one is :class:`fedrisk.algorithms.fedavg.FedAvg`):

    >>> from fedrisk.algorithms.base import Algorithm, RoundPlan, ClientResult
    >>> class Average(Algorithm):
    ...     name = "average"
    ...     def init_server(self, ctx, params, gen): return {"params": params}
    ...     def configure(self, ctx, state, gen):
    ...         return RoundPlan(clients=list(range(ctx.fed.num_clients)), broadcast={"params": state["params"]})
    ...     def client_update(self, ctx, payload, state, data, draws):
    ...         return ClientResult({"params": payload["params"]}, state, {})
    ...     def aggregate(self, ctx, state, plan, replies, gen): return {"params": replies.mean("params")}
    ...     def global_params(self, state): return state["params"]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from fedrisk.tree import Tree

if TYPE_CHECKING:
    from fedrisk.aggregators.base import Replies
    from fedrisk.rng import ClientRNG


@dataclass(frozen=True)
class FedInfo:
    """What every party may know about the federation's shape (never the data itself).

    ``class_counts[k][c]`` is the number of training samples of class ``c`` on client ``k``.
    """

    num_clients: int
    client_sizes: tuple[int, ...]
    num_classes: int
    class_counts: tuple[tuple[int, ...], ...] = ()

    @property
    def total_size(self) -> int:
        return sum(self.client_sizes)

    def size_weights(self, clients: Sequence[int]) -> dict[int, float]:
        """``n_k / sum n`` over the given clients (FedAvg's sample weighting)."""
        total = sum(self.client_sizes[k] for k in clients)
        return {k: self.client_sizes[k] / total for k in clients}


@dataclass(frozen=True)
class RoundContext:
    """Static facts about the current round, identical for every client in it."""

    round: int
    fed: FedInfo
    kind: str = "train"


@dataclass
class RoundPlan:
    """The server's decision for one round.

    Attributes:
        clients: the participating client ids (sorted, no duplicates).
        broadcast: the payload every participating client receives.
        per_client: optional extra payload per client, merged over ``broadcast``; every
            participating client must then have an entry with the same keys and shapes.
        kind: the round kind handed to ``client_update`` through ``ctx.kind``.
    """

    clients: list[int]
    broadcast: Mapping[str, Any] = field(default_factory=dict)
    per_client: Mapping[int, Mapping[str, Any]] | None = None
    kind: str = "train"

    def __post_init__(self) -> None:
        self.clients = sorted(int(c) for c in self.clients)
        if len(set(self.clients)) != len(self.clients):
            raise ValueError("RoundPlan.clients contains duplicates")
        if self.per_client is not None:
            missing = [c for c in self.clients if c not in self.per_client]
            if missing:
                raise ValueError(f"RoundPlan.per_client has no payload for clients {missing}")

    def payload(self, client: int) -> dict[str, Any]:
        """The full payload of ``client``: the broadcast merged with its own part."""
        if self.per_client is None:
            return dict(self.broadcast)
        return {**self.broadcast, **self.per_client[client]}


class ClientResult(NamedTuple):
    """What ``client_update`` returns: the reply sent to the server, the client's new
    persistent state, and scalar training metrics (tensors) for logging."""

    reply: dict[str, Any]
    state: Tree
    metrics: dict[str, Tensor]


@dataclass(frozen=True)
class LocalData:
    """A client's training data as ``client_update`` sees it.

    Under the vectorised executor ``x``/``y``/``attrs`` are padded to a common length;
    ``size`` (a 0-dim int64 tensor) is the number of real rows and draws must index below it.
    Use :meth:`valid` for masked full-batch computations.
    """

    x: Tensor
    y: Tensor
    size: Tensor
    attrs: Mapping[str, Tensor] = field(default_factory=dict)

    def valid(self) -> Tensor:
        """A float mask of the real (non-padding) rows."""
        return (torch.arange(self.x.shape[0], device=self.x.device) < self.size).to(self.x.dtype)


class Algorithm:
    """Base class of every federated algorithm (see the module docstring for the contract).

    Subclasses are frozen dataclasses of hyper-parameters.  Class attributes:

    * ``name``: the registry name.
    * ``personalized``: True when each client ends with its own model (evaluated per client).
    * ``vectorizable``: False (with ``not_vectorizable_reason``) if ``client_update`` cannot
      run under ``torch.func.vmap``.
    * ``batched_draw``: True if :meth:`draw` also accepts a block of clients (see there).
    """

    name: ClassVar[str] = "algorithm"
    personalized: ClassVar[bool] = False
    vectorizable: ClassVar[bool] = True
    not_vectorizable_reason: ClassVar[str] = ""
    batched_draw: ClassVar[bool] = False

    # -- set-up -------------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        """Validate the hyper-parameters against the federation; raise ``FedriskError``."""

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        """Validate every client's data once, before the first round and outside any ``vmap``
        (e.g. the values of an attribute the objective indexes by); raise ``FedriskError``."""

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        raise NotImplementedError

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        """The persistent state of ``client`` (default: none)."""
        return {}

    # -- one round ----------------------------------------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        raise NotImplementedError

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        """All random choices of ``client`` for this round (default: none).

        ``client`` is the client id (int), ``num_samples`` its number of training rows (int)
        and ``rng`` its generator.  Draw only through ``rng``'s methods (or helpers built on
        them such as :func:`fedrisk.algorithms.local.sample_batches`), never from torch's
        global generator.

        With ``batched_draw = True`` the vectorised executor calls ``draw`` once per block:
        ``client`` and ``num_samples`` are then int64 tensors ``[C]``, ``rng`` is the block's
        generator, and every leaf of the returned tree must carry a leading client dimension
        whose row ``i`` equals what ``draw`` returns for client ``client[i]`` alone (the
        conformance suite checks this for every registered algorithm).  Write such a ``draw``
        without Python branches on ``client`` / ``num_samples`` and index trailing dimensions
        (``[..., 0, :]``), not the leading one.
        """
        return {}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        raise NotImplementedError

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        raise NotImplementedError

    # -- models and evaluation ----------------------------------------------------------
    def init_params(self, gen: torch.Generator) -> Tree:
        """The initial model parameters (default: ``self.model.init_params(gen)``)."""
        return self.model.init_params(gen)  # type: ignore[attr-defined]

    def predict(self, params: Tree, x: Tensor) -> Tensor:
        """Scores / logits of the model with ``params`` on inputs ``x`` (used for evaluation)."""
        return self.model.apply(params, x)  # type: ignore[attr-defined]

    def global_params(self, server_state: Tree) -> Tree | None:
        """The model parameters to evaluate globally (None if there is no global model)."""
        return None

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree | None:
        """Client ``client``'s own model (personalised algorithms); default: the global one."""
        return self.global_params(server_state)

    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        """Metrics of the server state itself, added to every evaluation (default: none; the
        minimax games report e.g. the WGAN's generator error or ``||∇Φ(x)||``)."""
        return {}


def sample_clients(gen: torch.Generator, num_clients: int, per_round: int | None) -> list[int]:
    """``per_round`` distinct clients drawn uniformly (all clients when None or >= num_clients)."""
    if per_round is None or per_round >= num_clients:
        return list(range(num_clients))
    return sorted(torch.randperm(num_clients, generator=gen)[:per_round].tolist())
