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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.pairwise import (
    BOOTSTRAP,
    PASSIVE_SAMPLING,
    SCORES,
    TRAIN,
    PairwiseBase,
    SingleClassClientWarning,
    class_order,
)
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.auc import class_count_pairs
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree

__all__ = [
    "BOOTSTRAP",
    "PASSIVE_SAMPLING",
    "SCORES",
    "TRAIN",
    "FeDXL1",
    "FeDXL2",
    "PairwiseBase",
    "SingleClassClientWarning",
    "class_order",
]


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
        idx = torch.linspace(0, scores.shape[0] - 1, count, device=scores.device).round().to(torch.int64)
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
                    old_sizes = torch.zeros(self.history, dtype=torch.int64, device=pool.device)
                newest = torch.tensor([pool.shape[0]], device=old_sizes.device)
                sizes = torch.cat([newest, old_sizes[:-1]]) if key != "u" else new[sizes_key]
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
