r"""Federated NDCG (FeDXL2 with the SONG listwise X-risk) and its Local Pair / centralised baselines.

The objective is :mod:`fedrisk.objectives.ndcg`'s, eq. (1) with one anchor per relevant (query,
item) pair ``(q, i) ∈ S`` and the items ``S_q`` of its query as partners::

    R(w) = (1/|S|) Σ_{(q,i) ∈ S} f_{q,i}(g_{q,i}),   g_{q,i} = mean_{j ∈ S_q} ℓ(h_i, h_j),
    f_{q,i}(g) = −(2^{r_i} − 1) / (Z_q log2(1 + |S_q| g))

where a query's items may lie on several clients (federated search: every organisation holds
part of every query's candidates), so ``g`` couples clients exactly like FeDXL's pairs.  Its
gradient splits into the active/passive parts of eqs. (5)–(6), (12)–(13)::

    G1 = E_{(q,i) ~ own relevant rows} ∇f_{q,i}(u_{q,i}) mean_p ∂_1 ℓ(a_i, h̃_p) ∇h_i     h̃_p: passive items of q
    G2 = E_{j ~ own rows} c_{q(j)} mean_p ∇f(ũ_p) ∂_2 ℓ(h̃1_p, b_j) ∇h_j      (h̃1_p, ũ_p): passive anchors of q(j)
    c_q = |D| |S_q^+| / (|S| |S_q|)   (|D| all items, |S| all relevant pairs: G2's importance weight)

``u_{q,i}`` is one number per relevant row of the client (per query, never shared across
queries), updated before ``∇f`` (eq. (11)).  The passive entries are the previous round's
scores of every client's sampled anchors (with query, relevance and u) and items (with query),
merged by the server; partners of query ``q`` are drawn, with replacement, among the pool's
entries of ``q`` (a query absent from the pool switches its term off for that step).

``u`` starts *unset* (:data:`UNSET`, −1) and a row's first update reads ``u^0 = 0`` (SONG,
LibAUC).  ``∇f(0)`` is infinite (``log2(1 + N·0) = 0``; the floor ``N u ≥ 1`` turns it into the
largest weight ``∇f(1/N)``, ~100× a typical one), so a passive anchor whose ``u`` was never
estimated — every anchor of the bootstrap round, and an anchor whose query had no passive
partner when it was drawn — is left out of G2's draws (as FeDXL2's ``u_init = 1`` for ``λ log``
in :mod:`fedrisk.algorithms.fedxl`).  Shipping them with ``u = 0`` made round 1's G2 two orders
of magnitude too large and federated NDCG collapse (test NDCG@5 0.08 instead of 0.74,
``docs/results/fedxl.md``).

Round 0 (``"bootstrap"``) also exchanges each client's histogram of (query, relevance) counts, from
which the server forms the global ``|S_q|``, ``|S_q^+|`` and ideal DCG ``Z_q`` and broadcasts
them (``3 · num_queries`` numbers per round, counted by the ledger).  ``num_queries`` is a
hyper-parameter (query ids are ``0 .. num_queries − 1`` in ``attrs["query"]``; checked).  Data
without ``attrs["query"]`` is one query (id 0): NDCG of the whole item list, e.g. binary labels.

:class:`LocalNDCG` (Local Pair): the partners are the client's *own* items of the query, scored
by the current model (both sides active: SONG on the client's data with its own ``|S_q|`` and
``Z_q``), models and momenta averaged every K steps.  :class:`CentralizedNDCG`: the same on pooled
data — SONG with per-query ``N = |S_q|``.

Evaluation: ``state_metrics`` adds the test NDCG@k (``eval_k``) of the global model over the
test queries (:func:`fedrisk.metrics.ranking.ndcg_at_k`).

Example (two clients holding parts of every query):
    >>> from fedrisk.data.sources.ranking import synthetic_ranking_data
    >>> from fedrisk.data.federation import Federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> tr, te, _ = synthetic_ranking_data(num_clients=1, queries_per_client=4, items_per_query=8, dim=3)
    >>> fed = Federation("r", [tr.subset(range(0, 32, 2)), tr.subset(range(1, 32, 2))], 4, test=te)
    >>> alg = FeDXL2NDCG(model=FunctionalModel(build_model("logreg", (3,), 1)), num_queries=4, local_steps=2,
    ...                  batch_pos=2, batch_neg=3, batch_partners=4)
    >>> sim = Simulation(alg, fed, seed=0)
    >>> [sim.step().kind for _ in range(2)], sim.server_state["query_size"].tolist()
    (['bootstrap', 'train'], [8.0, 8.0, 8.0, 8.0])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.algorithms.pairwise import SCORES, SingleClassClientWarning, scatter_last
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.auc import single_output
from fedrisk.objectives.ndcg import check_queries, ndcg_grad_weight
from fedrisk.objectives.xrisk import PAIRWISE_LOSSES
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_zeros_like

__all__ = ["UNSET", "CentralizedNDCG", "FeDXL2NDCG", "LocalNDCG", "query_stats"]

TRAIN, BOOTSTRAP = "train", "bootstrap"

UNSET = -1.0
"""The value of a ``u`` that was never estimated (``u`` itself is a mean of losses, ``>= 0``)."""


def query_stats(hist: Tensor, max_items: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(|S_q|, |S_q^+|, Z_q)`` from a ``[Q, G]`` histogram of (query, relevance grade) counts.

    ``Z_q`` places the grades from the highest down: a grade ``g`` with count ``c`` after ``p`` items
    contributes ``(2^g − 1) Σ_{t=p+1}^{p+c} 1 / log2(t + 1)`` (branch-free: a cumulative sum of the
    discounts).  ``max_items``: a static bound on a query's size (under ``vmap``; default: read it).

    Example:
        >>> size, rel, z = query_stats(torch.tensor([[1.0, 1.0, 0.0, 1.0]]))   # grades 0, 1, 3
        >>> size.tolist(), rel.tolist(), round(float(z[0]), 6)                 # 7/1 + 1/log2(3)
        ([3.0], [2.0], 7.63093)
    """
    Q, G = hist.shape
    dtype = hist.dtype if hist.is_floating_point() else torch.float64
    h = hist.to(dtype)
    size, rel = h.sum(1), h[:, 1:].sum(1)
    desc = h.flip(1)  # highest grade first
    after = desc.cumsum(1)  # items placed once each grade is done
    before = after - desc
    n = max_items if max_items is not None else (int(h.sum(1).max().item()) if Q else 0)
    on = {"dtype": dtype, "device": hist.device}
    cum = torch.cat([torch.zeros(1, **on), (1 / torch.log2(torch.arange(2, n + 2, **on))).cumsum(0)])
    gains = (2.0 ** torch.arange(G - 1, -1, -1, **on)) - 1
    z = (gains * (cum[after.long()] - cum[before.long()])).sum(1)
    return size, rel, z


def queries_of(data: Any) -> Tensor:
    """``attrs["query"]`` of a client's data (or a test split), or all zeros (one query) without it."""
    q = data.attrs.get("query") if hasattr(data, "attrs") else None
    return q if q is not None else torch.zeros(data.y.shape[0], dtype=torch.int64, device=data.y.device)


def _pick_in_query(
    keys: Tensor, valid: Tensor, queries: Tensor, unit: Tensor, num_queries: int
) -> tuple[Tensor, Tensor]:
    """Indices of entries with query ``queries[...]`` among ``keys`` (valid entries only), drawn
    uniformly with the ``unit`` numbers; and a 0/1 mask (the query has an entry).  Branch-free."""
    qs = torch.arange(num_queries, device=keys.device)
    member = (keys[:, None] == qs[None, :]) & valid[:, None]
    counts = member.sum(0)
    start = counts.cumsum(0) - counts
    sort_key = torch.where(valid, keys, torch.full_like(keys, num_queries))
    order = torch.argsort(sort_key, stable=True)
    c = counts[queries]
    idx = torch.minimum(torch.floor(unit * c.to(unit.dtype)).to(torch.int64), (c - 1).clamp(min=0))
    pos = torch.clamp(start[queries] + idx, max=keys.shape[0] - 1)
    return order[pos], (c > 0).expand(pos.shape)


@dataclass(frozen=True)
class FeDXL2NDCG(Algorithm):
    """FeDXL2 with the NDCG (SONG) X-risk (module docstring).

    Args:
        model: a one-output scorer.
        num_queries: query ids are ``0 .. num_queries − 1`` (``attrs["query"]``).
        lr, local_steps, beta, gamma, margin, surrogate, score, clients_per_round: as in
            :class:`~fedrisk.algorithms.fedxl.FeDXL2` (``β`` momentum, ``γ`` u moving average).
        batch_pos: relevant (anchor) rows per step.
        batch_neg: active item rows per step (G2's partners; any relevance).
        batch_partners: passive partners per anchor / passive anchors per item.
        eval_k: the k of the reported test NDCG@k.
    """

    name: ClassVar[str] = "fedxl2_ndcg"
    batched_draw: ClassVar[bool] = True
    scorer: ClassVar[bool] = True
    federated_pairs: ClassVar[bool] = True

    model: Any
    num_queries: int = 1
    lr: float = 0.1
    local_steps: int = 16
    batch_pos: int = 16
    batch_neg: int = 16
    batch_partners: int = 16
    beta: float = 0.1
    gamma: float = 0.1
    margin: float = 1.0
    surrogate: str = "squared_hinge"
    score: str = "sigmoid"
    clients_per_round: int | None = None
    eval_k: int = 10

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0.0, None, low_inclusive=False)
        for field in ("num_queries", "local_steps", "batch_pos", "batch_neg", "batch_partners", "eval_k"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise FedriskError(f"{field} must be an integer >= 1; got {value!r}")
            check_range(field, value, 1)
        check_range("beta", self.beta, 0.0, 1.0, low_inclusive=False)
        check_range("gamma", self.gamma, 0.0, 1.0, low_inclusive=False)
        check_range("margin", self.margin, 0.0, None, low_inclusive=False)
        if self.surrogate not in PAIRWISE_LOSSES:
            raise unknown_name("surrogate", self.surrogate, tuple(PAIRWISE_LOSSES))
        if self.score not in SCORES:
            raise unknown_name("score", self.score, SCORES)
        if self.clients_per_round is not None:
            check_range("clients_per_round", self.clients_per_round, 1)

    # -- set-up -------------------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        if not fed.class_counts:
            raise FedriskError(f"{self.name}: needs integer relevance labels 0, 1, ... (graded)")
        relevant = [sum(c[1:]) for c in fed.class_counts]
        if sum(relevant) == 0:
            raise FedriskError(f"{self.name}: the federation has no relevant item (every relevance is 0)")

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        for k, d in enumerate(data):
            q = queries_of(d)[: int(d.size)]
            if q.numel() and (int(q.min()) < 0 or int(q.max()) >= self.num_queries):
                raise FedriskError(
                    f"{self.name}: client {k} has query id {int(q.max()) if int(q.min()) >= 0 else int(q.min())}; "
                    f"allowed: 0 .. num_queries - 1 = {self.num_queries - 1} (raise num_queries)"
                )
        if data and hasattr(self.model, "init_params"):  # a multi-output scorer is refused at set-up, not mid-run
            x = data[0].x[:1]
            with torch.no_grad():
                single_output(self.model.apply(self.model.init_params(0, dtype=x.dtype, device=x.device), x), self.name)
        qs, rels = [queries_of(d)[: int(d.size)] for d in data], [d.y[: int(d.size)] for d in data]
        queries, relevance = torch.cat(qs), torch.cat(rels)
        if torch.any(relevance < 0):
            check_queries(relevance, queries, f"{self.name}: the federation")  # names the negative label
        for q in torch.unique(queries).tolist():
            if not bool((relevance[queries == q] > 0).any()):
                holders = ", ".join(str(k) for k, c in enumerate(qs) if bool((c == q).any()))
                raise FedriskError(
                    f"{self.name}: the federation: query {q} has no relevant item (every relevance is 0; held by "
                    f"client {holders}); NDCG is undefined for it. Drop the query or give it a relevant item"
                )
        for k, r in enumerate(rels):
            if not bool((r > 0).any()):
                self.no_relevant_item(k, int(r.numel()))

    def no_relevant_item(self, client: int, n: int) -> None:
        """A client holding no relevant item: FeDXL2 warns (its items still serve as G2's active
        items and as other clients' passive partners); Local Pair refuses (nothing to train on)."""
        warnings.warn(
            f"{self.name}: client {client} holds no query with a relevant item ({n} items): it has no anchor, "
            "so its G1 term is 0; its items still train through G2 and serve as other clients' partners",
            SingleClassClientWarning,
            stacklevel=3,
        )

    def scores(self, params: Tree, x: Tensor) -> Tensor:
        out = single_output(self.model.apply(params, x), self.name)
        return torch.sigmoid(out) if self.score == "sigmoid" else out

    def predict(self, params: Tree, x: Tensor) -> Tensor:
        return self.scores(params, x)

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["params"]

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"params": params, "momentum": tree_zeros_like(params)}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        dtype = next(iter(params.values())).dtype if isinstance(params, dict) and params else torch.get_default_dtype()
        rows = max([sum(c[1:]) for c in ctx.fed.class_counts] + [1])  # the client's relevant rows only
        return {"u": torch.full((rows,), UNSET, dtype=dtype)}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        broadcast = {"params": server_state["params"]}
        if self.federated_pairs and ctx.round == 0:
            return RoundPlan(list(range(ctx.fed.num_clients)), broadcast, kind=BOOTSTRAP)
        broadcast["momentum"] = server_state["momentum"]
        if self.federated_pairs:
            for key in ("query_size", "query_relevant", "query_ideal", "anchor_coef"):
                broadcast[key] = server_state[key]
            for key in ("pool_a", "pool_a_q", "pool_a_r", "pool_a_u", "pool_b", "pool_b_q"):
                broadcast[key] = server_state[key]
        return RoundPlan(sample_clients(gen, ctx.fed.num_clients, self.clients_per_round), broadcast, kind=TRAIN)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        K, B1, B2, P, f64 = self.local_steps, self.batch_pos, self.batch_neg, self.batch_partners, torch.float64
        out = {"pos": rng.uniform((K, B1), f64), "items": rng.uniform((K, B2), f64)}
        out["partners"] = rng.uniform((K, B1, P), f64)
        if self.federated_pairs:
            out["anchors"] = rng.uniform((K, B2, P), f64)
        return out

    # -- the client's rows -------------------------------------------------------------------------
    def rows(self, data: LocalData, draws: Tree) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``[K, B1]`` relevant rows and their ranks (u-table rows), ``[K, B2]`` item rows, the
        client's row validity mask and whether it has a relevant row."""
        valid = torch.arange(data.y.shape[0], device=data.y.device) < data.size
        relevant = (data.y > 0) & valid
        order = torch.argsort(torch.where(relevant, 0, torch.where(valid, 1, 2)), stable=True)
        n_rel, n = relevant.sum(), valid.sum()
        rank = torch.floor(draws["pos"] * n_rel.to(torch.float64)).to(torch.int64)
        rank = torch.minimum(rank, (n_rel - 1).clamp(min=0))
        items = torch.floor(draws["items"] * n.to(torch.float64)).to(torch.int64)
        items = torch.minimum(items, (n - 1).clamp(min=0))
        return order[rank], rank, items, valid, (n_rel > 0)

    def local_hist(self, data: LocalData, valid: Tensor, grades: int) -> Tensor:
        """The client's ``[Q, G]`` (query, grade) counts (``G`` = the federation's number of grades)."""
        q = queries_of(data)
        onehot_q = (q[:, None] == torch.arange(self.num_queries, device=q.device)[None, :]) & valid[:, None]
        onehot_g = data.y[:, None] == torch.arange(grades, device=q.device)[None, :]
        return (onehot_q[:, :, None] & onehot_g[:, None, :]).sum(0).to(torch.float64)

    # -- one round ---------------------------------------------------------------------------
    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        rows_a, rank, rows_b, valid, has_rel = self.rows(data, draws)
        q_all = queries_of(data)
        if ctx.kind == BOOTSTRAP:
            with torch.no_grad():
                a = self.scores(payload["params"], data.x[rows_a.reshape(-1)])
                b = self.scores(payload["params"], data.x[rows_b.reshape(-1)])
            reply = {
                "hist": self.local_hist(data, valid, ctx.fed.num_classes),
                "h_a": a,
                "q_a": q_all[rows_a.reshape(-1)],
                "r_a": data.y[rows_a.reshape(-1)],
                "u_a": state["u"][rank.reshape(-1)],
                "h_b": b,
                "q_b": q_all[rows_b.reshape(-1)],
                "has_rel": has_rel.to(torch.int64),
            }
            return ClientResult(reply, state, {})
        if self.federated_pairs:
            size, rel, ideal = payload["query_size"], payload["query_relevant"], payload["query_ideal"]
        else:  # Local Pair / centralised: the client's own view of its queries
            size, rel, ideal = query_stats(self.local_hist(data, valid, ctx.fed.num_classes), data.y.shape[0])
        params, G, u = payload["params"], payload["momentum"], state["u"]
        dtype = next(iter(params.values())).dtype
        size, rel, ideal = size.to(dtype), rel.to(dtype), ideal.to(dtype)
        names, beta, gamma, lr, Q = list(params), self.beta, self.gamma, self.lr, self.num_queries
        loss_fn = PAIRWISE_LOSSES[self.surrogate]
        out_a, out_b, out_u, out_qa, out_qb, out_r, losses = [], [], [], [], [], [], []
        for k in range(self.local_steps):
            ra, rb = rows_a[k], rows_b[k]
            qa, qb = q_all[ra], q_all[rb]
            u_rows = u[rank[k]]
            if self.federated_pairs:
                # passive anchors: relevant, with an estimated u (module docstring: never ∇f(u^0))
                pa_valid = (payload["pool_a_r"] > 0) & (payload["pool_a_u"] >= 0)
                pb_valid = torch.ones_like(payload["pool_b_q"], dtype=torch.bool)
                ip, mask_p = _pick_in_query(payload["pool_b_q"], pb_valid, qa[:, None], draws["partners"][k], Q)
                ia, mask_a = _pick_in_query(payload["pool_a_q"], pa_valid, qb[:, None], draws["anchors"][k], Q)
                partner_rows = None
            else:
                partner_rows, mask_p = _pick_in_query(q_all, valid, qa[:, None], draws["partners"][k], Q)
                ip = ia = mask_a = None
            bound = {"ra": ra, "rb": rb, "qa": qa, "qb": qb, "u_rows": u_rows, "partner_rows": partner_rows,
                     "ip": ip, "ia": ia, "mask_p": mask_p, "mask_a": mask_a}  # fmt: skip

            def objective(p: dict[str, Tensor], bound: dict[str, Any] = bound) -> Any:
                ra, rb, qa, qb, u_rows = bound["ra"], bound["rb"], bound["qa"], bound["qb"], bound["u_rows"]
                partner_rows, ip, ia = bound["partner_rows"], bound["ip"], bound["ia"]
                mask_p, mask_a = bound["mask_p"], bound["mask_a"]
                a = self.scores(p, data.x[ra])
                if partner_rows is not None:  # local: own items of the query, active on both sides
                    hp = self.scores(p, data.x[partner_rows.reshape(-1)]).reshape(partner_rows.shape)
                else:
                    hp = payload["pool_b"][ip].to(a.dtype)
                L1 = loss_fn(a[:, None], hp if partner_rows is not None else hp.detach(), self.margin)
                m1 = mask_p.to(a.dtype)
                has_p = m1.sum(1) > 0  # no entry of the query in the pool: no update, no term
                g = (L1.detach() * m1).sum(1) / m1.sum(1).clamp(min=1)
                u_old = u_rows.clamp(min=0)  # an unset u reads u^0 = 0 (SONG)
                u_new = torch.where(has_p, (1 - gamma) * u_old + gamma * g, u_rows)
                # the rank of a relevant item is >= 1 (itself): N u is floored at 1, so ∇f stays finite
                u_w = torch.maximum(u_new, 1 / size[qa].clamp(min=1))
                w1 = ndcg_grad_weight(u_w, data.y[ra], size[qa], ideal[qa]).detach() * (has_p & has_rel).to(a.dtype)
                term1 = (w1[:, None] * L1 * m1).sum(1) / m1.sum(1).clamp(min=1)
                total = term1.mean()
                rank_est = torch.clamp(size[qa] * g, min=1)
                value = -((2.0 ** data.y[ra].to(a.dtype) - 1) / (ideal[qa] * torch.log2(1 + rank_est))).mean()
                if partner_rows is None:  # G2: passive anchors of each active item's query
                    b = self.scores(p, data.x[rb])
                    ha, ua, rr = payload["pool_a"][ia].to(a.dtype), payload["pool_a_u"][ia], payload["pool_a_r"][ia]
                    qb_rows = qb[:, None].expand_as(ia)
                    ua = torch.maximum(ua.to(a.dtype), 1 / size[qb_rows].clamp(min=1))
                    w2 = ndcg_grad_weight(ua, rr, size[qb_rows], ideal[qb_rows]).detach()
                    m2 = mask_a.to(a.dtype)
                    L2 = loss_fn(ha.detach(), b[:, None], self.margin)
                    coef = payload["anchor_coef"].to(a.dtype)[qb]  # c_q = |D| |S_q^+| / (|S| |S_q|)
                    total = total + (coef * (w2 * L2 * m2).sum(1) / m2.sum(1).clamp(min=1)).mean()
                    return total, (a.detach(), b.detach(), u_new.detach(), value)
                return total, (a.detach(), a.detach(), u_new.detach(), value)

            (_, (a, b, u_new, value)), grads = value_and_grad(objective, has_aux=True)(params)
            u = scatter_last(u, rank[k], torch.where(has_rel, u_new, u_rows))
            G = {n: (1 - beta) * G[n] + beta * grads[n] for n in names}
            params = {n: params[n] - lr * G[n] for n in names}
            out_a.append(a)
            out_b.append(b)
            out_u.append(u_new)
            out_qa.append(qa)
            out_qb.append(qb)
            out_r.append(data.y[ra])
            losses.append(value)
        reply: dict[str, Any] = {"params": params, "momentum": G}
        if self.federated_pairs:
            reply.update(
                {
                    "h_a": torch.cat(out_a),
                    "q_a": torch.cat(out_qa),
                    "r_a": torch.cat(out_r),
                    "u_a": torch.cat(out_u),
                    "h_b": torch.cat(out_b),
                    "q_b": torch.cat(out_qb),
                    "has_rel": has_rel.to(torch.int64),
                }
            )
        return ClientResult(reply, {"u": u}, {"loss": torch.stack(losses).mean()})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        new = dict(server_state)
        if ctx.kind == BOOTSTRAP:
            size, rel, ideal = query_stats(replies.sum("hist"))
            total_items, total_rel = size.sum(), rel.sum()
            new["query_size"], new["query_relevant"], new["query_ideal"] = size, rel, ideal.clamp(min=1e-12)
            new["anchor_coef"] = total_items * rel / (total_rel * size.clamp(min=1))
        else:
            new["params"] = replies.mean("params")
            new["momentum"] = replies.mean("momentum")
        if not self.federated_pairs:
            return new
        keep = [i for i, r in enumerate(replies.gather("has_rel")) if int(r) > 0]
        if keep:  # anchors only from clients with a relevant row
            for key, name in (("h_a", "pool_a"), ("q_a", "pool_a_q"), ("r_a", "pool_a_r"), ("u_a", "pool_a_u")):
                parts = replies.gather(key)
                new[name] = torch.cat([parts[i] for i in keep])
        new["pool_b"] = torch.cat(list(replies.gather("h_b")))
        new["pool_b_q"] = torch.cat(list(replies.gather("q_b")))
        return new

    # -- evaluation -----------------------------------------------------------------------------
    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        """Test NDCG@``eval_k`` of the global model over the test queries."""
        test = getattr(federation, "test", None)
        if test is None or not len(test):
            return {}
        from fedrisk.metrics.ranking import ndcg_at_k

        params = server_state["params"]
        with torch.no_grad():
            s = self.scores(params, test.x.to(next(iter(params.values())).dtype))
        try:
            return {f"test_ndcg@{self.eval_k}": ndcg_at_k(s, test.y, queries_of(test), k=self.eval_k)}
        except FedriskError:  # a test query without a relevant item: no NDCG to report
            return {}


@dataclass(frozen=True)
class LocalNDCG(FeDXL2NDCG):
    """Local Pair for NDCG: SONG on each client's own items of each query (module docstring)."""

    name: ClassVar[str] = "local_ndcg"
    federated_pairs: ClassVar[bool] = False

    def no_relevant_item(self, client: int, n: int) -> None:
        raise FedriskError(
            f"{self.name}: client {client} holds no query with a relevant item ({n} items): Local Pair has no anchor "
            "there and the client cannot train; allowed: a partition that gives every client a relevant item, or "
            "fedxl2_ndcg (its cross-client pairs use such a client's items)"
        )


@dataclass(frozen=True)
class CentralizedNDCG(LocalNDCG):
    """SONG on pooled data (one client): per-query ``N = |S_q|`` and ``Z_q`` from all the data."""

    name: ClassVar[str] = "centralized_ndcg"
    requires_pooled_data: ClassVar[bool] = True

    def check(self, fed: FedInfo) -> None:
        if fed.num_clients != 1:
            raise FedriskError(
                f"algorithm 'centralized_ndcg' trains on pooled data and needs a federation with exactly 1 client, "
                f"got num_clients = {fed.num_clients}"
            )
        super().check(fed)
