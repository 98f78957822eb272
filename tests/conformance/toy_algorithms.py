"""Tiny algorithms that exercise every pattern of the algorithm contract the paper families need.

Each toy is a frozen dataclass following :mod:`fedrisk.algorithms.base`, with a model
``f(x) = x @ w`` (params ``{"w": [D]}``) and client code that runs under ``torch.func.vmap``
(masked full-data means through ``LocalData.valid()``, random rows only through ``draw``).

=====================  ===================================================================
toy                    pattern (and the paper family that needs it)
=====================  ===================================================================
``ControlCounter``     (1) persistent per-client state updated on every participation
                       (SCAFFOLD/CODASCA control variates), (7) partial participation,
                       (8) randomness from ``draw`` only
``Shuffle``            (2) a different payload per client (PERM hands client k the model
                       owned by client sigma(k))
``ScorePool``          (3) a server-side pool concatenated from the replies and broadcast
                       next round (FeDXL's passive scores), (8) draws
``Robust``             (4) a ``gather`` aggregator (coordinate-wise median computed here) or
                       a mean; target of (5) ``NegativeMean``, an omniscient attack
``Kinds``              (6) round kinds chosen from the server state (every 3rd round is an
                       "estimate" round with a different reply; PERM's weight estimation)
``Silent``             no communication: empty server state, payload and reply (LocalOnly)
``Faulty``             client failures (raise in ``draw`` / in ``client_update``, NaN reply)
                       and a server state that becomes NaN
=====================  ===================================================================

The tests in ``test_contract.py`` recompute every toy's expected values by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.attacks.base import Attack
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree

D = 3
"""Feature / parameter dimension of every toy."""


def masked_mean(data: LocalData) -> Tensor:
    """The mean of the client's real rows (padding rows masked out)."""
    valid = data.valid()
    return (data.x * valid[:, None]).sum(0) / data.size


@dataclass(frozen=True)
class Toy(Algorithm):
    """Common model: ``f(x) = x @ w`` with ``w ~ N(0, I)`` from the init generator."""

    name: ClassVar[str] = "toy"

    def init_params(self, gen: torch.Generator) -> Tree:
        return {"w": torch.randn(D, generator=gen, dtype=torch.float64)}

    def predict(self, params: Tree, x: Tensor) -> Tensor:
        return x @ params["w"]


# (1) persistent per-client state, (7) partial participation, (8) draws ---------------------
@dataclass(frozen=True)
class ControlCounter(Toy):
    """A control-variate counter.

    client k (when selected): rows ~ U{0..n_k-1}^batch from ``draw``;
        c_k+ = x - mean(x_rows);  reply dc = c_k+ - c_k;  count_k += 1
    server: c <- c + (1/N) sum_S dc;  x <- x - lr * c       (so c = mean_k c_k always)
    """

    name: ClassVar[str] = "control_counter"
    batched_draw: ClassVar[bool] = True
    per_round: int | None = None
    lr: float = 0.5
    batch: int = 3

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"x": params["w"], "c": torch.zeros_like(params["w"])}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"count": torch.zeros((), dtype=params["w"].dtype), "c": torch.zeros_like(params["w"])}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(sample_clients(gen, ctx.fed.num_clients, self.per_round), {"x": server_state["x"]})

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"rows": rng.integers(num_samples, (self.batch,))}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        c_new = payload["x"] - data.x[draws["rows"]].mean(0)
        count = state["count"] + 1
        return ClientResult({"dc": c_new - state["c"]}, {"count": count, "c": c_new}, {"count": count})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        c = server_state["c"] + replies.sum("dc") / ctx.fed.num_clients
        return {"x": server_state["x"] - self.lr * c, "c": c}

    def global_params(self, server_state: Tree) -> Tree:
        return {"w": server_state["x"]}


# (2) per-client payloads ----------------------------------------------------------------
@dataclass(frozen=True)
class Shuffle(Toy):
    """Every client owns a model row; in round r client k trains the model of
    sigma_r(k) = (k + r + 1) mod N:  m <- m + step * (mean_k - m), then the server writes the
    reply back into row sigma_r(k)."""

    name: ClassVar[str] = "shuffle"
    step: float = 0.5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        n = ctx.fed.num_clients
        offsets = torch.arange(n, dtype=params["w"].dtype)[:, None]
        return {"models": params["w"][None, :] + offsets}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        n = ctx.fed.num_clients
        owner = {k: (k + ctx.round + 1) % n for k in range(n)}
        per_client = {k: {"model": server_state["models"][owner[k]], "owner": torch.tensor(owner[k])} for k in range(n)}
        step = torch.tensor(self.step, dtype=server_state["models"].dtype)
        return RoundPlan(list(range(n)), broadcast={"step": step}, per_client=per_client)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        m = payload["model"]
        new = m + payload["step"] * (masked_mean(data) - m)
        return ClientResult({"model": new, "owner": payload["owner"]}, state, {"moved": (new - m).norm()})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        owners = replies.stacked("owner").long()
        return {"models": server_state["models"].index_copy(0, owners, replies.stacked("model"))}

    def global_params(self, server_state: Tree) -> Tree:
        return {"w": server_state["models"].mean(0)}

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return {"w": server_state["models"][client]}


# (3) a server-side pool built from the replies --------------------------------------------
@dataclass(frozen=True)
class ScorePool(Toy):
    """Clients score ``num_scores`` drawn rows with w and reply the scores plus a gradient that
    uses last round's pool:  g_k = X_rows^T (X_rows w - mean(pool)) / s.
    server: pool <- concat_k(scores_k) (client order);  w <- w - lr * mean_k g_k."""

    name: ClassVar[str] = "score_pool"
    batched_draw: ClassVar[bool] = True
    num_scores: int = 2
    lr: float = 0.1

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        pool = torch.zeros(ctx.fed.num_clients * self.num_scores, dtype=params["w"].dtype)
        return {"w": params["w"], "pool": pool}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)), {"w": server_state["w"], "pool": server_state["pool"]})

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"rows": rng.integers(num_samples, (self.num_scores,))}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        x = data.x[draws["rows"]]
        scores = x @ payload["w"]
        grad = x.T @ (scores - payload["pool"].mean()) / self.num_scores
        return ClientResult({"scores": scores, "grad": grad}, state, {"score": scores.mean()})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        pool = torch.cat(replies.gather("scores"))
        return {"w": server_state["w"] - self.lr * replies.mean("grad"), "pool": pool}

    def global_params(self, server_state: Tree) -> Tree:
        return {"w": server_state["w"]}


# (4) a gather aggregator, target of (5) the attack -----------------------------------------
def coordinate_median(stacked: Tensor) -> Tensor:
    """Coordinate-wise median of ``[m, ...]`` (the mean of the two middle values for even m)."""
    ordered = stacked.sort(dim=0).values
    m = stacked.shape[0]
    return ordered[m // 2] if m % 2 else (ordered[m // 2 - 1] + ordered[m // 2]) / 2


@dataclass(frozen=True)
class Robust(Toy):
    """client: w_k = w - lr * (w - mean(x_rows)) with 2 drawn rows;
    server: w <- median_k w_k (``aggregator="median"``, gather kind) or mean_k w_k."""

    name: ClassVar[str] = "robust"
    aggregator: str = "median"
    lr: float = 0.5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"w": params["w"]}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)), {"w": server_state["w"]})

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"rows": rng.integers(num_samples, (2,))}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = payload["w"]
        return ClientResult({"w": w - self.lr * (w - data.x[draws["rows"]].mean(0))}, state, {})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        if self.aggregator == "median":
            return {"w": coordinate_median(replies.stacked("w"))}
        return {"w": replies.mean("w")}

    def global_params(self, server_state: Tree) -> Tree:
        return server_state


class NegativeMean(Attack):
    """Omniscient attack: every Byzantine reply becomes ``-scale x`` the mean of the honest
    replies (key by key)."""

    name = "negative_mean"

    def __init__(self, scale: float = 10.0) -> None:
        self.scale = scale

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        every = replies.as_dict()
        honest = [k for k in replies.clients if k not in byzantine]
        keys = list(every[replies.clients[0]])
        forged = {key: -self.scale * torch.stack([every[k][key] for k in honest]).mean(0) for key in keys}
        return InMemoryReplies({k: (dict(forged) if k in byzantine else every[k]) for k in replies.clients})


# (6) round kinds from the server state ------------------------------------------------------
@dataclass(frozen=True)
class Kinds(Toy):
    """The server counts rounds in its state ``t``; when ``t % 3 == 2`` the round is an
    "estimate" round: clients reply their loss 0.5 * mean_i ||x_i - w||^2 and the server stores
    the mean loss; otherwise ("train") clients reply w + lr * (mean_k - w) and the server averages."""

    name: ClassVar[str] = "kinds"
    lr: float = 0.5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        zero = torch.zeros((), dtype=params["w"].dtype)
        return {"w": params["w"], "t": zero, "estimate": zero}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        kind = "estimate" if int(server_state["t"]) % 3 == 2 else "train"
        return RoundPlan(list(range(ctx.fed.num_clients)), {"w": server_state["w"]}, kind=kind)

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = payload["w"]
        if ctx.kind == "estimate":
            sq = ((data.x - w) ** 2).sum(1) * data.valid()
            loss = 0.5 * sq.sum() / data.size
            return ClientResult({"loss": loss}, state, {"loss": loss})
        return ClientResult({"w": w + self.lr * (masked_mean(data) - w)}, state, {})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        t = server_state["t"] + 1
        if plan.kind == "estimate":
            return {"w": server_state["w"], "t": t, "estimate": replies.mean("loss")}
        return {"w": replies.mean("w"), "t": t, "estimate": server_state["estimate"]}

    def global_params(self, server_state: Tree) -> Tree:
        return {"w": server_state["w"]}


# no communication at all ---------------------------------------------------------------------
@dataclass(frozen=True)
class Silent(Toy):
    """Local-only training: empty server state, empty payload, empty reply; each client keeps
    its own model in its state:  w_k <- w_k + lr * (mean(x_rows) - w_k) with 2 drawn rows."""

    name: ClassVar[str] = "silent"
    personalized: ClassVar[bool] = True
    lr: float = 0.5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"w": params["w"]}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)))

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"rows": rng.integers(num_samples, (2,))}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = state["w"]
        return ClientResult({}, {"w": w + self.lr * (data.x[draws["rows"]].mean(0) - w)}, {})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        return server_state

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return {"w": client_state["w"]}


# failures ----------------------------------------------------------------------------------
FAULT_MODES = ("raise_in_draw", "raise_in_update", "nan_reply", "server_nan")


@dataclass(frozen=True)
class Faulty(Toy):
    """Clients reply w_k = w + lr (mean_k - w) and count their participations; the server
    averages uniformly.  In round ``round`` client ``client`` fails according to ``mode``:

    * ``raise_in_draw``: ``draw`` raises a RuntimeError;
    * ``raise_in_update``: ``client_update`` raises (``torch.linalg.cholesky`` of a matrix
      that is not positive definite for that client only: a data-independent way to raise
      inside tensor code that also raises under ``vmap``);
    * ``nan_reply``: the client's reply is NaN;
    * ``server_nan``: no client fails, the server state becomes NaN in that round.
    """

    name: ClassVar[str] = "faulty"
    mode: str = "nan_reply"
    client: int = 1
    round: int = 1
    lr: float = 0.5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"w": params["w"]}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"count": torch.zeros((), dtype=params["w"].dtype)}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        return RoundPlan(list(range(ctx.fed.num_clients)), {"w": server_state["w"]})

    def draw(self, ctx: RoundContext, client: int, num_samples: int, rng: ClientRNG) -> Tree:
        hit = client == self.client and ctx.round == self.round
        if hit and self.mode == "raise_in_draw":
            raise RuntimeError("injected failure in draw")
        return {"bad": torch.tensor(1.0 if hit else 0.0, dtype=torch.float64)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        w = payload["w"]
        bad = draws["bad"].to(w.dtype)
        new = w + self.lr * (masked_mean(data) - w)
        if self.mode == "raise_in_update":
            sign = 1.0 - 2.0 * bad  # -1 for the failing client: not positive definite
            new = new + 0.0 * torch.linalg.cholesky(sign * torch.eye(2, dtype=w.dtype)).sum()
        if self.mode == "nan_reply":
            new = torch.where(bad > 0, torch.full_like(new, float("nan")), new)
        return ClientResult({"w": new}, {"count": state["count"] + 1}, {})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        w = replies.mean("w")
        if self.mode == "server_nan" and ctx.round == self.round:
            w = w * float("nan")
        return {"w": w}

    def global_params(self, server_state: Tree) -> Tree:
        return server_state
