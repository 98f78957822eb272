r"""The shared machinery of the pairwise / compositional X-risk algorithms (FeDXL1/2, Local Pair,
centralised): class-sorted rows, the active minibatches, the u-table and the K local steps of the
active/passive decomposed gradient.  The algorithms and the paper mapping are described in
:mod:`fedrisk.algorithms.fedxl`; the objectives in :mod:`fedrisk.objectives.xrisk` and
:mod:`fedrisk.objectives.compositional`.

Example (a client's rows, positives first, and the ranks that index its u-table):
    >>> import torch
    >>> d = LocalData(torch.zeros(4, 1), torch.tensor([0, 1, 1, 0]), torch.tensor(4))
    >>> order, n_pos, n_neg = class_order(d)
    >>> order.tolist(), pick_index(n_pos, torch.tensor([0.1, 0.9], dtype=torch.float64)).tolist()
    ([1, 2, 0, 3], [0, 1])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.auc import class_count_pairs, single_output
from fedrisk.objectives.compositional import (
    COMPOSITIONAL,
    U_COLUMNS,
    XRiskSpec,
    check_compositional_params,
    decomposed_step,
)
from fedrisk.objectives.xrisk import (
    check_xrisk_params,
    decomposed_surrogate,
    inner_loss,
    moving_average,
    outer_value,
)
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_zeros_like

__all__ = [
    "BOOTSTRAP",
    "PASSIVE_SAMPLING",
    "SCORES",
    "TRAIN",
    "PairwiseBase",
    "SingleClassClientWarning",
    "class_order",
    "last_occurrence",
    "pick_index",
    "pick_rows",
    "scatter_last",
]

TRAIN, BOOTSTRAP = "train", "bootstrap"
PASSIVE_SAMPLING = ("shuffle", "with_replacement")
SCORES = ("sigmoid", "identity")


class SingleClassClientWarning(UserWarning):
    """A client of a pairwise X-risk algorithm holds a single class (see :mod:`fedrisk.algorithms.fedxl`)."""


def class_order(data: LocalData) -> tuple[Tensor, Tensor, Tensor]:
    """``(order, n_pos, n_neg)``: the client's row indices with its positives first, then its
    negatives, then padding rows (vectorised executor), and the two counts (0-dim tensors).

    Branch-free (a stable ``argsort`` of a class key), so it runs under ``vmap``.

    Example:
        >>> d = LocalData(torch.zeros(5, 1), torch.tensor([0, 1, 0, 1, 0]), torch.tensor(4))
        >>> order, n_pos, n_neg = class_order(d)
        >>> order.tolist(), int(n_pos), int(n_neg)
        ([1, 3, 0, 2, 4], 2, 2)
    """
    valid = torch.arange(data.y.shape[0], device=data.y.device) < data.size
    pos = (data.y == 1) & valid
    key = torch.where(valid, torch.where(pos, 0, 1), 2)
    order = torch.argsort(key, stable=True)
    n_pos = pos.sum()
    return order, n_pos, valid.sum() - n_pos


def pick_index(count: Tensor, unit: Tensor) -> Tensor:
    """Ranks ``floor(unit · count)`` within a class (uniform draws in ``[0, 1)``); 0 when ``count = 0``."""
    idx = torch.floor(unit * count.to(unit.dtype)).to(torch.int64)
    return torch.minimum(idx, (count - 1).clamp(min=0))


def pick_rows(order: Tensor, start: Tensor, count: Tensor, unit: Tensor) -> Tensor:
    """Rows ``order[start + floor(unit · count)]`` (uniform draws in ``[0, 1)`` -> rows of a class);
    a class with ``count = 0`` gets row ``order[start]`` (its term is weighted 0)."""
    return order[torch.clamp(start + pick_index(count, unit), max=order.shape[0] - 1)]


def last_occurrence(rows: Tensor) -> Tensor:
    """For each position ``j`` of ``rows`` (``[B]``), the last position holding the same row.

    Example:
        >>> last_occurrence(torch.tensor([2, 0, 2, 1, 0]))
        tensor([2, 4, 2, 3, 4])
    """
    positions = torch.arange(rows.shape[0], device=rows.device)
    return torch.where(rows[:, None] == rows[None, :], positions[None, :], -1).amax(1)


def scatter_last(table: Tensor, rows: Tensor, values: Tensor) -> Tensor:
    """``table`` with ``table[rows[j]] = values[j]`` in order, so that a row drawn twice keeps its
    **last** value (the u-table update of a minibatch drawn with replacement).

    ``Tensor.scatter`` leaves the winner among duplicate indices unspecified: the CPU's loop keeps
    the last, CUDA kernels another (FeDXL2-NDCG's u-table differed by 0.3 between a CPU and an
    H200 run).  Here every duplicate writes its last occurrence's value, so any order gives the
    same table (and the CPU's result is unchanged).  ``rows``: ``[B]``; ``values``: ``[B, ...]``
    like ``table``'s rows.

        >>> scatter_last(torch.zeros(3), torch.tensor([2, 0, 2]), torch.tensor([1.0, 5.0, 7.0]))
        tensor([5., 0., 7.])
    """
    values = values[last_occurrence(rows)]
    index = rows.reshape(-1, *[1] * (table.dim() - 1)).expand_as(values)
    return table.scatter(0, index, values)


@dataclass(frozen=True)
class PairwiseBase(Algorithm):
    """Shared fields and local loop of FeDXL1/2 and Local Pair (:mod:`fedrisk.algorithms.fedxl`).

    Args:
        model: a functional model with one output.
        lr: step size ``η``.
        local_steps: ``K``, local steps per round.
        batch_pos: ``B1``, positives per step (and passive negatives' partners).
        batch_neg: ``B2``, negatives per step.
        surrogate: pairwise loss ``ℓ`` (:data:`fedrisk.objectives.xrisk.PAIRWISE_LOSSES`).
        margin: margin ``m`` of the squared hinge / square losses.
        score: ``"sigmoid"`` (scores in (0, 1), the paper's code) or ``"identity"``.
        clients_per_round: participants per round (None = all; Algorithm 3 otherwise).
        lr_decay: factor applied to ``lr`` every ``decay_rounds`` training rounds.
        decay_rounds: None = a constant step size (the paper: ×0.1 every 5k iterations).
    """

    name: ClassVar[str] = "pairwise"
    batched_draw: ClassVar[bool] = True
    scorer: ClassVar[bool] = True
    federated_pairs: ClassVar[bool] = True

    model: Any
    lr: float = 0.1
    local_steps: int = 32
    batch_pos: int = 32
    batch_neg: int = 32
    surrogate: str = "sigmoid"
    margin: float = 1.0
    score: str = "sigmoid"
    clients_per_round: int | None = None
    lr_decay: float = 0.1
    decay_rounds: int | None = None

    # -- hyper-parameters not every subclass has (linear f, no momentum) ---------------------
    @property
    def kind(self) -> str:
        return getattr(self, "xrisk", "auc")

    @property
    def momentum_weight(self) -> float | None:
        """``β`` when a momentum ``G`` is kept and averaged, None otherwise."""
        return getattr(self, "beta", None) if self.uses_momentum else None

    @property
    def uses_momentum(self) -> bool:
        return hasattr(self, "beta")

    @property
    def uses_u(self) -> bool:
        return self.kind == "pauc" or self.kind in COMPOSITIONAL

    @property
    def uses_v(self) -> bool:
        """Two-way pAUC's global scalar ``v``, averaged by the server with the model."""
        return self.kind == "tpauc"

    @property
    def spec(self) -> XRiskSpec:
        """The compositional X-risk's hyper-parameters (:mod:`fedrisk.objectives.compositional`)."""
        return XRiskSpec(
            self.kind,
            self.surrogate,
            self.margin,
            gamma=getattr(self, "gamma", 1.0),
            lam=getattr(self, "lam", 1.0),
            lam_pos=getattr(self, "lam_pos", 1.0),
            gamma_v=getattr(self, "gamma_v", 0.1),
            max_fpr=getattr(self, "max_fpr", 0.2),
            dual_lr=getattr(self, "dual_lr", 0.1),
        )

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0.0, None, low_inclusive=False)
        for field in ("local_steps", "batch_pos", "batch_neg"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise FedriskError(f"{field} must be an integer >= 1; got {value!r}")
            check_range(field, value, 1)
        if self.score not in SCORES:
            raise unknown_name("score", self.score, SCORES)
        if self.clients_per_round is not None:
            check_range("clients_per_round", self.clients_per_round, 1)
        check_range("lr_decay", self.lr_decay, 0.0, 1.0, low_inclusive=False)
        if self.decay_rounds is not None:
            check_range("decay_rounds", self.decay_rounds, 1)
        check_xrisk_params(
            kind=self.kind,
            surrogate=self.surrogate,
            lam=getattr(self, "lam", 1.0),
            gamma=getattr(self, "gamma", 1.0),
            beta=getattr(self, "beta", 1.0),
            margin=self.margin,
        )
        if self.uses_u:
            check_range("u_init", getattr(self, "u_init", 1.0), 0.0, None, low_inclusive=False)
        if self.kind in COMPOSITIONAL:
            check_compositional_params(self.spec)

    # -- scores, schedule ---------------------------------------------------------------------
    def scores(self, params: Tree, x: Tensor) -> Tensor:
        """``h(w; x)`` as ``[N]``: the single model output, through a sigmoid by default."""
        out = single_output(self.model.apply(params, x), self.name)
        return torch.sigmoid(out) if self.score == "sigmoid" else out

    def predict(self, params: Tree, x: Tensor) -> Tensor:
        return self.scores(params, x)

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["params"]

    def training_round(self, round: int) -> int:
        """The 0-based training round of contract round ``round`` (FeDXL's round 0 bootstraps)."""
        return round - 1 if self.federated_pairs else round

    def round_lr(self, round: int) -> float:
        """``η · lr_decay^(t // decay_rounds)`` for training round ``t``."""
        if self.decay_rounds is None:
            return self.lr
        return self.lr * self.lr_decay ** (max(self.training_round(round), 0) // self.decay_rounds)

    # -- set-up -------------------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        if fed.num_classes != 2:
            raise FedriskError(
                f"{self.name}: a pairwise X-risk needs binary labels (num_classes = 2, label 1 = positive); got "
                f"num_classes = {fed.num_classes}. Binarise the labels first"
            )
        if not fed.class_counts:
            raise FedriskError(f"{self.name}: needs integer class labels (0/1) to tell positives from negatives")
        pairs = class_count_pairs(fed.class_counts)
        if sum(p for p, _ in pairs) == 0 or sum(n for _, n in pairs) == 0:
            missing = "positive" if sum(p for p, _ in pairs) == 0 else "negative"
            raise FedriskError(
                f"{self.name}: the federation has no {missing} training examples; the X-risk is undefined"
            )
        for k, (pos, neg) in enumerate(pairs):
            if pos and neg:
                continue
            if pos + neg == 0:
                raise FedriskError(f"{self.name}: client {k} has no training samples; every client needs data")
            warnings.warn(
                self.single_class_message(k, "positive" if pos == 0 else "negative", pos + neg),
                SingleClassClientWarning,
                stacklevel=2,
            )

    def single_class_message(self, client: int, missing: str, n: int) -> str:
        term = "G1 (its active positives)" if missing == "positive" else "G2 (its active negatives)"
        return (
            f"{self.name}: client {client} has no {missing} examples ({n} samples). It still trains on the "
            f"cross-client pairs of its other class; its {term} term is 0 and the server drops its {missing} "
            "score uploads"
        )

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        state: dict[str, Any] = {"params": params}
        if self.uses_momentum:
            state["momentum"] = tree_zeros_like(params)  # Ḡ^0 = 0
        if self.uses_v:  # v^0 = mean (u^0)^(λ/λ')
            dtype = next(iter(params.values())).dtype if isinstance(params, dict) and params else None
            u0 = float(getattr(self, "u_init", 1.0))
            state["v"] = torch.tensor(u0 ** (self.spec.lam / self.spec.lam_pos), dtype=dtype)
        return state

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        if not self.uses_u:
            return {}
        dtype = next(iter(params.values())).dtype if isinstance(params, dict) and params else torch.get_default_dtype()
        # one row per *positive* of the client (its rank among the client's positives, in row order),
        # padded to the largest client's positive count so that every client's state has the same
        # shape (the vectorised executor then runs all clients in one vmap group); rows >= the
        # client's positive count are never read.  AP keeps two columns (u_pos, u_all) per positive.
        # (check() has refused a federation without class counts)
        rows = max([p for p, _ in class_count_pairs(ctx.fed.class_counts)] + [1])
        shape = (rows, U_COLUMNS["ap"]) if self.kind == "ap" else (rows,)
        init = 0.0 if self.kind == "pauc_cvar" else float(getattr(self, "u_init", 1.0))  # SOPA's s^0 = 0
        return {"u": torch.full(shape, init, dtype=dtype)}

    # -- one round ----------------------------------------------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        broadcast = {"params": server_state["params"]}
        if self.federated_pairs and ctx.round == 0:  # H^0, U^0 from every client (Alg. 3 too)
            return RoundPlan(list(range(ctx.fed.num_clients)), broadcast, kind=BOOTSTRAP)
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        if self.uses_momentum:
            broadcast["momentum"] = server_state["momentum"]
        if self.uses_v:
            broadcast["v"] = server_state["v"]
        for key in self.pool_keys():
            broadcast[key] = server_state[key]
        return RoundPlan(clients, broadcast, kind=TRAIN)

    def pool_keys(self) -> tuple[str, ...]:
        return ()

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        K, f64 = self.local_steps, torch.float64
        return {"pos": rng.uniform((K, self.batch_pos), f64), "neg": rng.uniform((K, self.batch_neg), f64)}

    def active_rows(self, data: LocalData, draws: Tree) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``[K, B1]`` positive rows, ``[K, B2]`` negative rows, the 0/1 weights (has positives,
        has negatives) of the client, and the ``[K, B1]`` positives' ranks (their u-table rows)."""
        order, n_pos, n_neg = class_order(data)
        rank = pick_index(n_pos, draws["pos"])  # positives come first in ``order``
        rows_pos = order[torch.clamp(rank, max=order.shape[0] - 1)]
        rows_neg = pick_rows(order, n_pos, n_neg, draws["neg"])
        dtype = data.x.dtype if data.x.is_floating_point() else torch.get_default_dtype()
        return rows_pos, rows_neg, (n_pos > 0).to(dtype), (n_neg > 0).to(dtype), rank

    def passive_scores(self, payload: Mapping[str, Any], draws: Tree) -> tuple[Tensor, Tensor, Tensor | None]:
        """``[K, B2]`` passive negatives, ``[K, B1]`` passive positives (and their u)."""
        raise NotImplementedError

    def local_steps_loop(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> tuple[Tree, Tree | None, Tree, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """K local steps; returns (w, G, new state, stored positive / negative scores and u, mean loss,
        the moved global ``v`` of ``"tpauc"`` or None)."""
        kind, surrogate, margin = self.kind, self.surrogate, self.margin
        lam, gamma, beta = getattr(self, "lam", 1.0), getattr(self, "gamma", 1.0), self.momentum_weight
        B1, lr = self.batch_pos, self.round_lr(ctx.round)
        rows_pos, rows_neg, has_pos, has_neg, ranks = self.active_rows(data, draws)
        passive = self.passive_scores(payload, draws) if self.federated_pairs else None
        if not self.federated_pairs:  # Local Pair: a pair needs both classes on this client
            has_pos = has_neg = has_pos * has_neg
        params, G = payload["params"], payload.get("momentum")
        u, v = state.get("u"), payload.get("v")
        names = list(params)
        spec = self.spec if kind in COMPOSITIONAL else None
        stored_a, stored_b, stored_u, losses = [], [], [], []
        for k in range(self.local_steps):
            rp, rn = rows_pos[k], rows_neg[k]
            xs = data.x[torch.cat([rp, rn])]
            u_rows = u[ranks[k]] if u is not None else None

            def objective(
                p: dict[str, Tensor], xs: Tensor = xs, k: int = k, u_rows: Tensor | None = u_rows, v: Any = v
            ) -> Any:
                h = self.scores(p, xs)
                a, b = h[:B1], h[B1:]
                if passive is not None:
                    partner_neg, partner_pos, partner_u = passive[0][k], passive[1][k], passive[2]
                    partner_u = partner_u[k] if partner_u is not None else None
                else:  # local pairs only: the partners are this step's own scores
                    partner_neg, partner_pos, partner_u = b.detach(), a.detach(), None
                if spec is not None:  # AP, two-way / CVaR pAUC (fedrisk.objectives.compositional)
                    loss, u_new, v_new, value = decomposed_step(
                        spec, a, b, partner_neg, partner_pos, partner_u, u_rows, v, has_pos=has_pos, has_neg=has_neg
                    )
                    return loss, (a.detach(), b.detach(), u_new, value, *([v_new] if v is not None else []))
                g = inner_loss(kind, surrogate, a.detach(), partner_neg, lam=lam, margin=margin).mean(1)
                # eq. (11): u(z1) first, then ∇f at the updated u (spec §6.4)
                u_new = moving_average(u_rows, g, gamma) if u_rows is not None else torch.ones_like(g)
                if partner_u is None:
                    partner_u = u_new
                loss = decomposed_surrogate(
                    kind,
                    surrogate,
                    a,
                    b,
                    partner_neg,
                    partner_pos,
                    u_new,
                    partner_u,
                    lam=lam,
                    margin=margin,
                    pos_weight=has_pos,
                    neg_weight=has_neg,
                )
                return loss, (a.detach(), b.detach(), u_new.detach(), outer_value(kind, g, lam).mean())

            (_, (a, b, u_new, value, *moved)), grads = value_and_grad(objective, has_aux=True)(params)
            v = moved[0] if moved else v
            if u is not None:
                u = scatter_last(u, ranks[k], torch.where(has_pos > 0, u_new, u_rows))
            if beta is not None:  # G^r_{i,k} = (1−β) G^r_{i,k−1} + β (G1 + G2)
                G = {n: (1 - beta) * G[n] + beta * grads[n] for n in names}
                step = G
            else:
                step = grads
            params = {n: params[n] - lr * step[n] for n in names}
            stored_a.append(a)
            stored_b.append(b)
            stored_u.append(u_new)
            losses.append(value)
        new_state = dict(state)
        if u is not None:
            new_state["u"] = u
        return (
            params,
            G,
            new_state,
            torch.cat(stored_a),
            torch.cat(stored_b),
            torch.cat(stored_u),
            torch.stack(losses).mean(),
            v,
        )

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        raise NotImplementedError

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = dict(server_state)
        new["params"] = replies.mean("params")  # w̄^r = mean over the participants (Alg. 3)
        if self.uses_momentum:
            new["momentum"] = replies.mean("momentum")  # Ḡ^r
        if self.uses_v:
            new["v"] = replies.mean("v")  # two-way pAUC's global v, averaged like Ḡ
        return new
