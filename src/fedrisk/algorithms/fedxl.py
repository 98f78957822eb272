r"""FeDXL1 and FeDXL2: federated deep X-risk optimisation with active/passive decomposition.

Guo, Jin, Luo & Yang, *FeDXL: Provable Federated Learning for Deep X-Risk Optimization*, ICML 2023
(spec ``shared/specs/004_fedxl.md``; objectives in :mod:`fedrisk.objectives.xrisk`).

The federated X-risk (eqs. (3), (8)) couples every client's positives with every client's
negatives.  Its gradient splits into an *active* part (the client's own data, current model)
and a *passive* part (other clients' prediction scores), eqs. (4)–(6), (10)::

    G1 = mean_{p,q} ∇f(u(z1_p)) ∇_1 ℓ(a_p, h̃2_q) ∇h(w, z1_p)        a = h(w, z1), z1 ~ S1^i (own positives)
    G2 = mean_{p,q} ∇f(ũ_p)     ∇_2 ℓ(h̃1_p, b_q) ∇h(w, z2_q)        b = h(w, z2), z2 ~ S2^i (own negatives)

with ``h̃2`` / ``(h̃1, ũ)`` drawn from the *previous round's* scores of all clients, merged by the
server (:func:`fedrisk.objectives.xrisk.decomposed_surrogate` is the autograd form).

Algorithm 1 (FeDXL1, linear f) / Algorithm 2 (FeDXL2, non-linear f), cleaned (spec §2.2–2.3)::

    round 0 ("bootstrap"): every client scores K minibatches of its positives / negatives with w0 and
        uploads H^0_{i,1}, H^0_{i,2} (FeDXL2: and U^0_i = u0 of those rows); the server merges them.
    round r = 1..R, client i (participants only, Alg. 3):
        w = w̄^{r−1};  G = Ḡ^{r−1}  (FeDXL2)
        B_{i,1}, C_i = the merged H_1, U shuffled with ONE permutation (joint shuffle, spec §6.3);
        B_{i,2} = the merged H_2 shuffled
        for k = 0..K−1:
            z1 ~ S1^i (B1 rows), z2 ~ S2^i (B2 rows);  a = h(w, z1), b = h(w, z2)
            h̃2 = next B2 of B_{i,2};  (h̃1, ũ) = next B1 of (B_{i,1}, C_i)
            FeDXL2: u(z1_p) ← (1−γ) u(z1_p) + γ mean_q ℓ(a_p, h̃2_q)      (eq. (11), before G1)
            FeDXL1: w ← w − η (G1 + G2)
            FeDXL2: G ← (1−β) G + β (G1 + G2);  w ← w − η G
            store a, b (and the updated u(z1)) into H^r_{i,1}, H^r_{i,2} (U^r_i)
        upload w (FeDXL2: G) and H^r_{i,1}, H^r_{i,2} (U^r_i)
    server: w̄^r = mean_i w_i, Ḡ^r = mean_i G_i (over the participants);
            H_1, H_2, U = concatenations in client order (U in H_1's order).

Typo fixes of spec §2.6, as implemented
---------------------------------------
1. Line 14 of Alg. 1/2 ("take next h_ξ, h_ζ, u_ζ from B_{i,1}, B_{i,2}, C_i respectively") has the
   buffers swapped: ``h̃2`` (S2, negative scores) is paired with the active *positives* in G1 and
   ``(h̃1, ũ)`` (S1, positive scores with their u) with the active *negatives* in G2 (eqs. (5),
   (6), (12), (13)).  ``test_fedxl.py`` has a test that fails when the two are swapped.
2. The server averages ``w^{r−1}_{i,K}`` (the paper writes ``w^r_{i,K}``); ``Ḡ^r`` is the averaged
   momentum (the paper names it both ``G^r`` and ``Ḡ^r``).
3. ``u^0 = 0`` is invalid for ``f = λ log``; ``u_init = 1`` (the code; ``ℓ = exp(·) ≥ 1`` keeps
   ``u ≥ 1`` afterwards so ``∇f ≤ λ``).  ``U^0_i`` holds the ``u`` of the bootstrap rows.
4. The undefined ``ẑ`` of Alg. 2 / eq. (30) is read as the training minibatch itself (Alg. 3 and
   the code): the stored scores are those of ``z1``, ``z2`` at ``w^r_{i,k}`` (before the step).
5. ``G^r_{i,−1} := Ḡ^r`` (the broadcast momentum; ``Ḡ^0 = 0``).
6. Passive entries are taken *without replacement* from the shuffled buffer (the paper;
   ``passive_sampling="shuffle"``) or i.i.d. from the pool (``"with_replacement"``); ``history``
   keeps the last ``τ`` rounds' pools (the code's τ = 2), default 1 (the paper).
The squared-hinge sign (spec §1.4) is fixed in :mod:`fedrisk.objectives.xrisk`.

Mapping onto the contract
-------------------------
* Round 0 is the bootstrap (kind ``"bootstrap"``: every client, scores only, no training), so
  ``run.rounds = R + 1`` gives R training rounds.  Every later round is one communication round
  of K local steps.
* Server state: ``params`` (w̄), ``momentum`` (Ḡ; FeDXL2), the pools ``pool_pos`` (H_1),
  ``pool_neg`` (H_2), ``pool_u`` (U; ``xrisk="pauc"``) — the previous ``history`` rounds only,
  so memory never grows with the rounds — and, with ``history > 1``, the per-round pool
  lengths ``sizes_pos`` / ``sizes_neg``.  Client state: the u-table ``u`` over the client's rows
  (only positive rows are used; padded to the largest client's size), persisting across rounds and
  never averaged (``"pauc"`` only).
* Payload: ``params`` (+ ``momentum``) and the merged pools — the ledger counts them, so the
  per-client upload is ``d + K(B1 + B2)`` floats for FeDXL1 and ``2d + K(2 B1 + B2)`` for
  FeDXL2 with ``"pauc"`` (spec §6.16), the download ``N`` times the score part.
* ``draw`` makes every random choice: uniform numbers that ``client_update`` turns into rows of
  the client's own positives / negatives (it sorts its rows by class; ``draw`` only knows the
  row count) and random keys whose ``argsort`` is the buffer shuffle.
* A client without positives (negatives) is allowed: its G1 (G2) term is switched off, and the
  server drops its positive (negative) score uploads using ``FedInfo.class_counts`` (the client
  still sends fixed-size placeholders, counted by the ledger).  ``check`` warns once per client
  (:class:`SingleClassClientWarning`).  A federation without positives or negatives is an error.
* Equal client weights (eqs. (3), (8)): every client contributes the same ``K·B`` scores.
* Scores are ``sigmoid(model output)`` by default (``score="sigmoid"``, the code); bounded
  scores keep ``exp(L/λ)`` finite (spec §6.5).

Example (FeDXL1 with the PSM loss on a small two-client federation):
    >>> import torch
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.tensor([1, 0, 0, 0] * 5)
    >>> fed = Federation("toy", [Samples(torch.randn(20, 3, generator=g) + y[:, None], y) for _ in range(2)], 2)
    >>> alg = FeDXL1(model=FunctionalModel(build_model("mlp", (3,), 1, hidden=[4])), local_steps=2, batch_pos=2,
    ...              batch_neg=3)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> [sim.step().kind for _ in range(3)], tuple(sim.server_state["pool_neg"].shape)
    (['bootstrap', 'train', 'train'], (12,))
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

__all__ = ["PASSIVE_SAMPLING", "SCORES", "FeDXL1", "FeDXL2", "PairwiseBase", "SingleClassClientWarning", "class_order"]

TRAIN, BOOTSTRAP = "train", "bootstrap"
PASSIVE_SAMPLING = ("shuffle", "with_replacement")
SCORES = ("sigmoid", "identity")


class SingleClassClientWarning(UserWarning):
    """A client of a pairwise X-risk algorithm holds a single class (see the module docstring)."""


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


@dataclass(frozen=True)
class PairwiseBase(Algorithm):
    """Shared fields and local loop of FeDXL1/2 and Local Pair (module docstring).

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
        pairs = class_count_pairs(ctx.fed.class_counts) if ctx.fed.class_counts else ()
        rows = max([p for p, _ in pairs] + [1]) if pairs else max(ctx.fed.client_sizes)
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
                index = ranks[k].reshape(-1, *[1] * (u.dim() - 1)).expand_as(u_new)
                u = u.scatter(0, index, torch.where(has_pos > 0, u_new, u_rows))
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


@dataclass(frozen=True)
class FeDXL1(PairwiseBase):
    """FeDXL1 (Algorithm 1): linear f (pairwise AUROC surrogate, e.g. PSM), plain local SGD steps
    on ``G1 + G2`` with passive scores from the previous round (module docstring).

    Args:
        passive_sampling: ``"shuffle"`` (take the next entries of the shuffled buffer, the paper)
            or ``"with_replacement"``.
        history: ``τ``, rounds of scores kept in the pools (1 = the previous round, the paper).
        upload: scores of each class a client uploads per round (None = all ``K·B``; fewer is
            the paper's communication-saving remark, an evenly spaced subset of the steps).
    """

    name: ClassVar[str] = "fedxl1"

    passive_sampling: str = "shuffle"
    history: int = 1
    upload: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.passive_sampling not in PASSIVE_SAMPLING:
            raise unknown_name("passive_sampling", self.passive_sampling, PASSIVE_SAMPLING)
        check_range("history", self.history, 1)
        if self.upload is not None:
            check_range("upload", self.upload, 1)
            if self.upload > self.local_steps * min(self.batch_pos, self.batch_neg):
                raise FedriskError(
                    f"{self.name}: upload = {self.upload} exceeds the K·B = "
                    f"{self.local_steps * min(self.batch_pos, self.batch_neg)} scores a client computes per round"
                )

    def pool_keys(self) -> tuple[str, ...]:
        """The broadcast pools (the per-round lengths of ``history > 1`` stay on the server)."""
        return ("pool_pos", "pool_neg", "pool_u") if self.uses_u else ("pool_pos", "pool_neg")

    def uploads(self) -> tuple[int, int]:
        """Scores of each class one client uploads per round."""
        if self.upload is None:
            return self.local_steps * self.batch_pos, self.local_steps * self.batch_neg
        return self.upload, self.upload

    def check(self, fed: FedInfo) -> None:
        super().check(fed)
        if self.passive_sampling != "shuffle":
            return
        pairs = class_count_pairs(fed.class_counts)
        n = min(self.clients_per_round or fed.num_clients, fed.num_clients)
        # the fewest clients whose scores can fill a round's pool (partial participation: the worst draw)
        with_pos = sorted(p > 0 for p, _ in pairs)[:n] if n < fed.num_clients else [p > 0 for p, _ in pairs]
        with_neg = sorted(q > 0 for _, q in pairs)[:n] if n < fed.num_clients else [q > 0 for _, q in pairs]
        up_pos, up_neg = self.uploads()
        for what, clients, per, need in (
            ("positive", max(1, sum(with_pos)), up_pos, self.local_steps * self.batch_pos),
            ("negative", max(1, sum(with_neg)), up_neg, self.local_steps * self.batch_neg),
        ):
            if clients * per < need:
                raise FedriskError(
                    f"{self.name}: a round requests K·B = {need} passive {what} scores without replacement, but the "
                    f"pool may hold only {clients} client(s) x {per} = {clients * per}; allowed: a pool at least as "
                    "large as the request (raise upload or clients_per_round), or passive_sampling = 'with_replacement'"
                )

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        out = super().draw(ctx, client, num_samples, rng)
        if ctx.round == 0:
            return out
        K, f64 = self.local_steps, torch.float64
        if self.passive_sampling == "shuffle":  # random keys; their argsort is the buffer's shuffle
            up_pos, up_neg = self.uploads()
            cap = ctx.fed.num_clients * self.history
            out["keys_pos"] = rng.uniform((cap * up_pos,), f64)
            out["keys_neg"] = rng.uniform((cap * up_neg,), f64)
        else:
            out["keys_pos"] = rng.uniform((K, self.batch_pos), f64)
            out["keys_neg"] = rng.uniform((K, self.batch_neg), f64)
        return out

    def passive_scores(self, payload: Mapping[str, Any], draws: Tree) -> tuple[Tensor, Tensor, Tensor | None]:
        K = self.local_steps
        picks = []
        for key, batch in (("neg", self.batch_neg), ("pos", self.batch_pos)):
            pool = payload[f"pool_{key}"]
            size, keys = pool.shape[0], draws[f"keys_{key}"]
            if self.passive_sampling == "shuffle":
                if size < K * batch:
                    raise FedriskError(
                        f"{self.name}: the pool holds {size} {key} scores but a round takes K·B = {K * batch} without "
                        "replacement; allowed: a pool at least that large, or passive_sampling = 'with_replacement'"
                    )
                if keys.shape[-1] < size:
                    raise FedriskError(f"{self.name}: the {key} pool ({size}) is larger than the N·τ·K·B bound")
                idx = torch.argsort(keys[:size])[: K * batch].reshape(K, batch)  # shuffle, then take next
            else:
                idx = torch.clamp(torch.floor(keys * size).to(torch.int64), max=size - 1)
            picks.append(idx)
        u = payload["pool_u"][picks[1]] if self.uses_u else None  # the same index: h̃1 keeps its ũ (§6.3)
        return payload["pool_neg"][picks[0]], payload["pool_pos"][picks[1]], u

    def subsample(self, scores: Tensor, count: int) -> Tensor:
        """An evenly spaced subset of ``count`` of a round's scores (``upload``)."""
        if count >= scores.shape[0]:
            return scores
        idx = torch.linspace(0, scores.shape[0] - 1, count).round().to(torch.int64)
        return scores[idx]

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        up_pos, up_neg = self.uploads()
        if ctx.kind == BOOTSTRAP:  # H^0_{i,1}, H^0_{i,2} (and U^0_i) with w0
            rows_pos, rows_neg, _, _, ranks = self.active_rows(data, draws)
            with torch.no_grad():
                a = self.scores(payload["params"], data.x[rows_pos.reshape(-1)])
                b = self.scores(payload["params"], data.x[rows_neg.reshape(-1)])
            reply = {"h_pos": self.subsample(a, up_pos), "h_neg": self.subsample(b, up_neg)}
            if self.uses_u:
                reply["u_pos"] = self.subsample(state["u"][ranks.reshape(-1)], up_pos)
            return ClientResult(reply, state, {})
        params, G, new_state, h_pos, h_neg, u_pos, loss, v = self.local_steps_loop(ctx, payload, state, data, draws)
        reply: dict[str, Any] = {"params": params}
        if G is not None:
            reply["momentum"] = G
        if v is not None:
            reply["v"] = v
        reply["h_pos"], reply["h_neg"] = self.subsample(h_pos, up_pos), self.subsample(h_neg, up_neg)
        if self.uses_u:
            reply["u_pos"] = self.subsample(u_pos, up_pos)
        return ClientResult(reply, new_state, {"loss": loss})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = dict(server_state) if ctx.kind == BOOTSTRAP else super().aggregate(ctx, server_state, plan, replies, gen)
        pairs = class_count_pairs(ctx.fed.class_counts)
        keep_pos = [i for i, k in enumerate(replies.clients) if pairs[k][0] > 0]
        keep_neg = [i for i, k in enumerate(replies.clients) if pairs[k][1] > 0]
        merged = {"pos": (replies.gather("h_pos"), keep_pos), "neg": (replies.gather("h_neg"), keep_neg)}
        if self.uses_u:
            merged["u"] = (replies.gather("u_pos"), keep_pos)  # U concatenated in H_1's order
        for key, (parts, keep) in merged.items():
            if not keep:  # no participant holds that class this round: keep the previous pool
                continue
            pool = torch.cat([parts[i] for i in keep])
            if self.history > 1:  # the newest τ rounds' pools, newest first (memory stays bounded)
                sizes_key = "sizes_neg" if key == "neg" else "sizes_pos"
                old_sizes = server_state.get(sizes_key)
                if old_sizes is None:
                    old_sizes = torch.zeros(self.history, dtype=torch.int64)
                sizes = torch.cat([torch.tensor([pool.shape[0]]), old_sizes[:-1]]) if key != "u" else new[sizes_key]
                old = server_state.get(f"pool_{key}")
                pool = pool if old is None else torch.cat([pool, old])[: int(sizes.sum())]
                if key != "u":
                    new[sizes_key] = sizes
            new[f"pool_{key}"] = pool
        return new


@dataclass(frozen=True)
class FeDXL2(FeDXL1):
    """FeDXL2 (Algorithm 2; Algorithm 3 with ``clients_per_round``): non-linear f — by default
    KL-DRO one-way pAUC (``f = λ log``, inner ``exp(L/λ)``, squared hinge) — with the moving-average
    u-table (γ) and a momentum ``G`` (β) averaged by the server together with ``w``.

    Args:
        xrisk: ``"pauc"`` (default), ``"auc"`` (linear f; FeDXL1 plus momentum), ``"ap"`` (average
            precision, eq. (19): a 2-vector u per positive, passive partners = both pools),
            ``"tpauc"`` (two-way KL-DRO pAUC) or ``"pauc_cvar"`` (one-way CVaR pAUC) — the last
            three in :mod:`fedrisk.objectives.compositional`.
        lam: ``λ > 0``, the KL temperature (paper: tuned in [1, 5]; code 1).
        gamma: ``γ ∈ (0, 1]``, the u moving-average weight (code 0.1).
        beta: ``β ∈ (0, 1]``, the momentum weight (paper 0.1; 1 = no momentum).
        u_init: ``u^0`` (> 0; the code's 1 — the paper's 0 is invalid for ``λ log``); both
            columns of AP's u.  CVaR's thresholds start at 0 (SOPA).
        lam_pos: ``λ' > 0``, the positives' KL temperature of ``"tpauc"`` (LibAUC's ``tau``).
        gamma_v: ``γ_v ∈ (0, 1]``, the moving-average weight of ``"tpauc"``'s global ``v``
            (each client moves its copy; the server averages them with the model).
        max_fpr: ``"pauc_cvar"``'s FPR bound / CVaR level ``∈ (0, 1]`` (LibAUC's ``beta``).
        dual_lr: ``"pauc_cvar"``'s threshold step size ``η > 0`` (LibAUC's ``eta``).
    """

    name: ClassVar[str] = "fedxl2"

    surrogate: str = "squared_hinge"
    xrisk: str = "pauc"
    lam: float = 1.0
    gamma: float = 0.1
    beta: float = 0.1
    u_init: float = 1.0
    lam_pos: float = 1.0
    gamma_v: float = 0.1
    max_fpr: float = 0.2
    dual_lr: float = 0.1
