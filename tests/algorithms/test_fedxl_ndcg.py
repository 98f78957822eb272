"""Federated NDCG (FeDXL2 with SONG) and its Local Pair / centralised baselines: query statistics,
unbiasedness at zero latency against the exact risk's gradient, executors, bad input, learning."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.algorithms.base import FedInfo, LocalData, RoundContext
from fedrisk.algorithms.fedxl_ndcg import UNSET, CentralizedNDCG, FeDXL2NDCG, LocalNDCG, query_stats
from fedrisk.algorithms.local_only import centralized
from fedrisk.algorithms.pairwise import SingleClassClientWarning
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.sources.ranking import synthetic_ranking_data, synthetic_ranking_federation
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.ndcg import ideal_dcg, ndcg_grad_weight, ndcg_risk
from fedrisk.objectives.xrisk import pairwise_loss
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import VectorizedExecutor

F64 = torch.float64


def linear(dim: int = 3, outputs: int = 1) -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (dim,), outputs))


def test_query_stats_against_direct_computation() -> None:
    g = torch.Generator().manual_seed(0)
    hist = torch.randint(0, 4, (5, 4), generator=g).to(F64)
    hist[:, 1] += 1  # every query has a relevant item
    size, rel, z = query_stats(hist)
    for q in range(5):
        grades = torch.cat([torch.full((int(hist[q, c]),), c) for c in range(4)])
        assert float(size[q]) == len(grades) and float(rel[q]) == int((grades > 0).sum())
        assert float(z[q]) == pytest.approx(float(ideal_dcg(grades)), abs=1e-12)


@pytest.mark.parametrize(
    ("weights", "draws", "tol"),
    [
        ("trained", 300, 0.3),
        pytest.param("init", 1500, 0.15, marks=pytest.mark.slow),
        pytest.param("trained", 1500, 0.15, marks=pytest.mark.slow),
    ],
)
def test_zero_latency_step_is_the_exact_gradient_in_expectation(weights: str, draws: int, tol: float) -> None:
    """One client, K = 1, β = 1, pools = the current scores of every item, u = the exact inner
    means: the mean step over many draws equals ∇R of the exact NDCG surrogate risk (G1 and G2
    separately, to ``tol`` of the largest G1 entry), i.e. the decomposition and its importance
    weight c_q are unbiased (a partner mean over the wrong count was off by |S_q| = 6 here)."""
    tr, _, _ = synthetic_ranking_data(
        num_clients=1, queries_per_client=3, items_per_query=6, dim=3, seed=0, test_queries_per_client=0
    )
    x, y, q = tr.x.to(F64), tr.y, tr.attrs["query"]
    model = linear()
    if weights == "init":
        params = {k: v.to(F64) for k, v in model.init_params(1).items()}
    else:
        params = {"linear.weight": torch.tensor([[2.0, -1.5, 0.7]]), "linear.bias": torch.tensor([0.3])}
        params = {k: v.to(F64) for k, v in params.items()}
    alg = FeDXL2NDCG(
        model=model, num_queries=3, local_steps=1, batch_pos=4, batch_neg=4, batch_partners=6, lr=1.0, beta=1.0,
        gamma=1e-12,
    )  # fmt: skip
    with torch.no_grad():
        h = alg.scores(params, x)
    rel = y > 0
    anchors = torch.nonzero(rel).flatten()
    g = torch.stack([pairwise_loss("squared_hinge", h[i : i + 1], h[q == q[i]]).mean() for i in anchors])
    hist = torch.zeros(3, 4, dtype=F64)
    for qq, yy in zip(q.tolist(), y.tolist()):
        hist[qq, yy] += 1
    size, nrel, ideal = query_stats(hist)
    payload = {
        "params": params,
        "momentum": {k: torch.zeros_like(v) for k, v in params.items()},
        "query_size": size,
        "query_relevant": nrel,
        "query_ideal": ideal,
        "anchor_coef": size.sum() * nrel / (nrel.sum() * size),
        "pool_a": h[rel],
        "pool_a_q": q[rel],
        "pool_a_r": y[rel],
        "pool_a_u": g,
        "pool_b": h,
        "pool_b_q": q,
    }
    ctx = RoundContext(1, FedInfo(1, (len(y),), 4, (tuple(int((y == c).sum()) for c in range(4)),)))
    data = LocalData(x, y, torch.tensor(len(y)), {"query": q})
    gen = torch.Generator().manual_seed(0)

    def mean_step(coef_on: bool) -> torch.Tensor:
        pay = dict(payload, anchor_coef=payload["anchor_coef"] * float(coef_on))
        total = torch.zeros(4, dtype=F64)
        for _ in range(draws):
            d = {
                "pos": torch.rand(1, 4, generator=gen, dtype=F64),
                "items": torch.rand(1, 4, generator=gen, dtype=F64),
                "partners": torch.rand(1, 4, 6, generator=gen, dtype=F64),
                "anchors": torch.rand(1, 4, 6, generator=gen, dtype=F64),
            }
            reply = alg.client_update(ctx, pay, {"u": g.clone()}, data, d).reply
            total += torch.cat([(params[k] - reply["params"][k]).reshape(-1) for k in params])
        return total / draws

    est_a, est_all = mean_step(False), mean_step(True)
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    hp = alg.scores(p, x)
    w = ndcg_grad_weight(g, y[rel], size[q[rel]], ideal[q[rel]])
    terms = [
        w[t] * pairwise_loss("squared_hinge", hp[i : i + 1], hp[q == q[i]].detach()).mean()
        for t, i in enumerate(anchors)
    ]
    exact_a = torch.cat([t.reshape(-1) for t in torch.autograd.grad(sum(terms) / len(anchors), list(p.values()))])
    risk = ndcg_risk(alg.scores(p, x), y, q, num_items=6)
    exact = torch.cat([t.reshape(-1) for t in torch.autograd.grad(risk, list(p.values()))])
    scale = float(exact_a.abs().max())
    assert torch.allclose(est_a, exact_a, atol=tol * scale), (est_a, exact_a)
    assert torch.allclose(est_all - est_a, exact - exact_a, atol=tol * scale), (est_all - est_a, exact - exact_a)


@pytest.mark.slow
def test_vectorized_executor_matches_sequential() -> None:
    fed = synthetic_ranking_federation(3, queries_per_client=2, items_per_query=6, dim=3, split="items", seed=1)
    for cls in (FeDXL2NDCG, LocalNDCG):
        alg = cls(model=linear(), num_queries=fed.info["num_queries"], local_steps=2, batch_pos=2, batch_neg=3,
                  batch_partners=3, lr=0.5, clients_per_round=2)  # fmt: skip
        sims = []
        for executor in ("sequential", VectorizedExecutor(block_size=None)):
            sim = Simulation(alg, fed, seed=2, dtype=F64, executor=executor)
            for _ in range(3):
                sim.step()
            sims.append(sim)
        a, b = sims
        for key in a.server_state["params"]:
            assert torch.allclose(a.server_state["params"][key], b.server_state["params"][key], rtol=1e-9, atol=1e-12)
        for k in range(3):
            assert torch.allclose(a.client_states[k]["u"], b.client_states[k]["u"], rtol=1e-9, atol=1e-12)


def test_query_statistics_and_pools_are_exchanged_and_counted() -> None:
    fed = synthetic_ranking_federation(2, queries_per_client=2, items_per_query=6, dim=3, split="items", seed=0)
    Q = fed.info["num_queries"]
    K, B1, B2 = 2, 2, 3
    alg = FeDXL2NDCG(model=linear(), num_queries=Q, local_steps=K, batch_pos=B1, batch_neg=B2, batch_partners=2)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    boot = sim.step()
    pooled = centralized(fed).clients[0]
    for q in range(4):  # the 4 training queries: |S_q|, |S_q^+|, Z_q of all clients' rows
        rows = pooled.attrs["query"] == q
        assert float(sim.server_state["query_size"][q]) == int(rows.sum())
        assert float(sim.server_state["query_ideal"][q]) == pytest.approx(float(ideal_dcg(pooled.y[rows])))
    d = 4 * 8
    # bootstrap upload: the [Q, G] histogram, K·B1 anchors (score, query, relevance, u), K·B2 items (score, query), flag
    assert boot.bytes_up == 2 * (8 * Q * 4 + 8 * K * B1 * 4 + 8 * K * B2 * 2 + 8)
    train = sim.step()
    pool = 8 * 2 * (K * B1 * 4 + K * B2 * 2)
    assert train.bytes_down == 2 * (2 * d + 8 * 4 * Q + pool)  # w, G, the 4 per-query statistics, the pools


def test_bad_input_is_named() -> None:
    fed = synthetic_ranking_federation(2, queries_per_client=2, items_per_query=6, dim=3, seed=0)
    with pytest.raises(FedriskError, match=r"client 1 has query id 3; allowed: 0 \.\. num_queries - 1 = 2"):
        Simulation(FeDXL2NDCG(model=linear(), num_queries=3), fed, seed=0)
    with pytest.raises(FedriskError, match="needs a one-output scorer; the model returns 2 outputs"):
        Simulation(FeDXL2NDCG(model=linear(outputs=2), num_queries=8), fed, seed=0)
    c = fed.clients[0]
    no_rel = Samples(c.x, torch.where(c.attrs["query"] == 0, 0, c.y), c.attrs)
    bad = Federation("r", [no_rel, fed.clients[1]], 4)
    with pytest.raises(FedriskError, match="the federation: query 0 has no relevant item"):
        Simulation(LocalNDCG(model=linear(), num_queries=8), bad, seed=0)
    with pytest.raises(FedriskError, match="batch_partners = 0 is out of range"):
        FeDXL2NDCG(model=None, batch_partners=0)
    with pytest.raises(FedriskError, match="needs a federation with exactly 1 client"):
        Simulation(CentralizedNDCG(model=linear(), num_queries=8), fed, seed=0)


def test_local_and_centralised_ndcg_learn_to_rank() -> None:
    fed = synthetic_ranking_federation(2, queries_per_client=8, items_per_query=10, dim=4, seed=3, shift=0.0)
    Q = fed.info["num_queries"]
    for alg, f in (
        (LocalNDCG(model=linear(4), num_queries=Q, local_steps=4, batch_pos=8, batch_neg=8, batch_partners=8, lr=0.5,
                   eval_k=5, gamma=0.9), fed),
        (CentralizedNDCG(model=linear(4), num_queries=Q, local_steps=4, batch_pos=8, batch_neg=8, batch_partners=8,
                         lr=0.5, eval_k=5, gamma=0.9), centralized(fed)),
    ):  # fmt: skip
        sim = Simulation(alg, f, seed=0, dtype=F64)
        start = alg.state_metrics(sim.server_state, f)["test_ndcg@5"]
        for _ in range(15):
            sim.step()
        end = alg.state_metrics(sim.server_state, f)["test_ndcg@5"]
        assert end > start + 0.15 and not math.isnan(end), (alg.name, start, end)


def test_unset_u_never_weights_a_passive_anchor() -> None:
    """u starts unset; the bootstrap round ships unset u's, and a passive anchor with an unset u is
    not drawn into G2: a step whose anchor pool is all unset equals the step with G2 switched off
    (c_q = 0).  Shipped as u = 0 they weighted G2 by ∇f(1/N), ~100× a typical ∇f (round 1 of the
    ranking federation: test NDCG@5 collapsed to 0.08)."""
    fed = synthetic_ranking_federation(2, queries_per_client=2, items_per_query=6, dim=3, split="items", seed=0)
    Q = fed.info["num_queries"]
    alg = FeDXL2NDCG(model=linear(), num_queries=Q, local_steps=3, batch_pos=2, batch_neg=3, batch_partners=2,
                     lr=0.7, beta=0.5, gamma=0.3)  # fmt: skip
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    assert torch.all(sim.client_states[0]["u"] == UNSET)
    sim.step()  # bootstrap
    assert torch.all(sim.server_state["pool_a_u"] == UNSET) and sim.server_state["pool_a"].numel() > 0
    ctx = RoundContext(1, FedInfo(2, tuple(len(c) for c in fed.clients), 4, tuple(
        tuple(int((c.y == g).sum()) for g in range(4)) for c in fed.clients)), kind="train")  # fmt: skip
    payload = alg.configure(ctx, sim.server_state, torch.Generator().manual_seed(0)).broadcast
    c = fed.clients[0]
    data = LocalData(c.x.to(F64), c.y, torch.tensor(len(c)), {"query": c.attrs["query"]})
    gen = torch.Generator().manual_seed(3)
    draws = {"pos": torch.rand(3, 2, generator=gen, dtype=F64), "items": torch.rand(3, 3, generator=gen, dtype=F64),
             "partners": torch.rand(3, 2, 2, generator=gen, dtype=F64),
             "anchors": torch.rand(3, 3, 2, generator=gen, dtype=F64)}  # fmt: skip
    state = sim.client_states[0]
    step = alg.client_update(ctx, payload, state, data, draws).reply["params"]
    g1_only = dict(payload, anchor_coef=torch.zeros_like(payload["anchor_coef"]))
    ref = alg.client_update(ctx, g1_only, state, data, draws).reply["params"]
    moved = sum(float((step[k] - payload["params"][k]).abs().sum()) for k in step)
    assert moved > 1e-3  # G1 moved the model
    for k in step:
        assert torch.allclose(step[k], ref[k], atol=1e-12), k
    # with estimated u's the same pool does feed G2
    estimated = dict(payload, pool_a_u=torch.full_like(payload["pool_a_u"], 0.5))
    with_g2 = alg.client_update(ctx, estimated, state, data, draws).reply["params"]
    assert any(not torch.allclose(with_g2[k], ref[k], atol=1e-9) for k in step)


def test_federated_ndcg_learns_across_clients() -> None:
    """Four clients each holding part of every query (client-shifted features): FeDXL2 with NDCG
    learns to rank, as Local Pair does (before the unset-u fix: NDCG@5 fell below its start)."""
    fed = synthetic_ranking_federation(4, queries_per_client=5, items_per_query=20, test_queries_per_client=5,
                                       dim=8, shift=0.5, split="items", seed=1)  # fmt: skip
    alg = FeDXL2NDCG(model=linear(8), num_queries=fed.info["num_queries"], local_steps=8, batch_pos=8, batch_neg=8,
                     batch_partners=8, lr=0.5, gamma=0.9, eval_k=5)  # fmt: skip
    sim = Simulation(alg, fed, seed=1, dtype=F64)
    start = alg.state_metrics(sim.server_state, fed)["test_ndcg@5"]
    for _ in range(16):
        sim.step()
    end = alg.state_metrics(sim.server_state, fed)["test_ndcg@5"]
    assert end > start + 0.3 and end > 0.55, (start, end)


def test_a_client_without_a_relevant_item_is_named() -> None:
    """Client 0 (its share of every query) loses its relevant items.  Local Pair refuses it (one line naming
    the client); FeDXL2 warns and trains (its items still serve G2).  A query with no relevant item
    anywhere names the clients holding it."""
    fed = synthetic_ranking_federation(2, queries_per_client=2, items_per_query=6, dim=3, split="items", seed=0)
    c0 = fed.clients[0]
    gone = Samples(c0.x, torch.zeros_like(c0.y), c0.attrs)
    pooled = centralized(fed).clients[0]  # every query, with its relevant items
    moved = Federation("r", [gone, pooled], 4)
    with pytest.raises(FedriskError, match=r"^local_ndcg: client 0 holds no query with a relevant item \(12 items\)"):
        Simulation(LocalNDCG(model=linear(), num_queries=4), moved, seed=0)
    with pytest.warns(SingleClassClientWarning, match="fedxl2_ndcg: client 0 holds no query with a relevant item"):
        sim = Simulation(FeDXL2NDCG(model=linear(), num_queries=4, local_steps=2, batch_pos=2, batch_neg=2), moved)
    for _ in range(2):
        sim.step()
    no_rel = Samples(pooled.x, torch.where(pooled.attrs["query"] == 2, 0, pooled.y), pooled.attrs)
    both = Federation("r", [gone, no_rel], 4)
    with pytest.raises(
        FedriskError, match=r"query 2 has no relevant item \(every relevance is 0; held by client 0, 1\)"
    ):
        Simulation(FeDXL2NDCG(model=linear(), num_queries=4), both, seed=0)
