"""Fault injection: make chosen clients fail in chosen rounds, under any executor.

:class:`FaultInjected` wraps any algorithm; each :class:`Fault` names a client, a round and a
kind:

* ``"raise"``: the client's work raises (a ``RuntimeError``);
* ``"deadline"``: the client misses the round's deadline (a ``TimeoutError``: its reply never
  arrives; a simulator decides this deterministically, so every executor drops the same client);
* ``"nan"`` / ``"inf"``: the client replies, but every floating leaf of its reply and new state
  is NaN / +inf.

Raising faults are raised in ``draw`` (never run under ``vmap``; a block draw that raises is
redone client by client by the vectorised executor, which names the client), non-finite faults
multiply the reply by a per-client factor drawn alongside the wrapped algorithm's draws (1.0 for
healthy clients, which leaves their numbers bit for bit unchanged), so the same code runs in
the sequential, vectorised and distributed executors.

:class:`Absent` is the reference a fault is compared with: the same algorithm whose plan leaves
the faulty clients out of those rounds.  Under ``on_client_failure = "skip"`` a run of
``FaultInjected(alg, faults)`` must equal a run of ``Absent(alg, faults)``: the aggregate
renormalised over the clients that replied, the failing clients' persistent state untouched.

Example:
    >>> import torch
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> from fedrisk.runtime.simulation import Simulation
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(60, 4, generator=g), torch.randint(0, 2, (60,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(i, i + 20)) for i in (0, 20, 40)], num_classes=2)
    >>> alg = FedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, batch_size=5)
    >>> faults = [Fault(client=1, round=0, kind="nan"), Fault(client=2, round=1, kind="deadline")]
    >>> sim = Simulation(FaultInjected(alg, faults), fed, on_client_failure="skip")
    >>> [sorted(sim.step().failed) for _ in range(3)]
    [[1], [2], []]
    >>> ref = Simulation(Absent(alg, faults), fed)
    >>> for _ in range(3):
    ...     _ = ref.step()
    >>> torch.equal(sim.server_state["params"]["linear.weight"], ref.server_state["params"]["linear.weight"])
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError, unknown_name
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_map

FAULT_KINDS = ("raise", "deadline", "nan", "inf")
RAISING = ("raise", "deadline")


@dataclass(frozen=True)
class Fault:
    """Client ``client`` fails in round ``round`` (0-based) as ``kind`` (see the module docstring)."""

    client: int
    round: int
    kind: str = "raise"

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise unknown_name("fault kind", self.kind, FAULT_KINDS)
        if self.client < 0 or self.round < 0:
            raise FedriskError(f"a fault needs client >= 0 and round >= 0, not {self.client} and {self.round}")


class _Wrapped(Algorithm):
    """Delegates everything to ``inner`` (class flags copied onto the instance)."""

    def __init__(self, inner: Algorithm, faults: Iterable[Fault]) -> None:
        self.inner = inner
        self.faults = tuple(faults)
        self.name = inner.name
        self.personalized = inner.personalized
        self.vectorizable = inner.vectorizable
        self.not_vectorizable_reason = inner.not_vectorizable_reason
        self.batched_draw = inner.batched_draw
        self._by_round: dict[int, dict[int, str]] = {}
        for f in self.faults:
            self._by_round.setdefault(f.round, {})[f.client] = f.kind

    def __getattr__(self, name: str) -> Any:  # hyper-parameters, model, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def check(self, fed: FedInfo) -> None:
        bad = [f for f in self.faults if f.client >= fed.num_clients]
        if bad:
            raise FedriskError(f"faults name clients {[f.client for f in bad]}; the federation has {fed.num_clients}")
        self.inner.check(fed)

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        self.inner.check_data(fed, data)

    def init_params(self, gen: torch.Generator) -> Tree:
        return self.inner.init_params(gen)

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return self.inner.init_server(ctx, params, gen)

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return self.inner.init_client(ctx, client, params)

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return self.inner.configure(ctx, server_state, gen)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return self.inner.draw(ctx, client, num_samples, rng)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        return self.inner.client_update(ctx, payload, state, data, draws)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        return self.inner.aggregate(ctx, server_state, plan, replies, gen)

    def predict(self, params: Tree, x: Tensor) -> Tensor:
        return self.inner.predict(params, x)

    def global_params(self, server_state: Tree) -> Tree | None:
        return self.inner.global_params(server_state)

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree | None:
        return self.inner.personal_params(server_state, client_state, client)


class FaultInjected(_Wrapped):
    """``inner`` with ``faults`` injected (see the module docstring)."""

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        faults = self._by_round.get(ctx.round, {})
        ids = client.tolist() if isinstance(client, Tensor) else [int(client)]
        for k in ids:  # a block that holds a raising client raises; the executor retries client by client
            kind = faults.get(k)
            if kind == "raise":
                raise RuntimeError(f"injected failure of client {k} in round {ctx.round}")
            if kind == "deadline":
                raise TimeoutError(f"client {k} missed the deadline of round {ctx.round} (injected)")
        scale = [{"nan": float("nan"), "inf": float("inf")}.get(faults.get(k, ""), 1.0) for k in ids]
        factor = torch.tensor(scale if isinstance(client, Tensor) else scale[0], dtype=torch.float64)
        return {"inner": self.inner.draw(ctx, client, num_samples, rng), "fault_factor": factor}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        reply, new_state, metrics = self.inner.client_update(ctx, payload, state, data, draws["inner"])
        factor = draws["fault_factor"]

        def poison(x: Any) -> Any:
            return x * factor.to(x.dtype) if isinstance(x, Tensor) and x.is_floating_point() else x

        return ClientResult(tree_map(poison, reply), tree_map(poison, new_state), metrics)


class Absent(_Wrapped):
    """``inner`` whose plan leaves out the clients of ``faults`` in their rounds (the reference
    run for :class:`FaultInjected` under ``on_client_failure = "skip"``)."""

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        plan = self.inner.configure(ctx, server_state, gen)
        gone = set(self._by_round.get(ctx.round, {}))
        if not gone & set(plan.clients):
            return plan
        clients = [k for k in plan.clients if k not in gone]
        per_client = None if plan.per_client is None else {k: plan.per_client[k] for k in clients}
        return dataclasses.replace(plan, clients=clients, per_client=per_client)
