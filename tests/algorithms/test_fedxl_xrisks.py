"""FeDXL2 / Local Pair / centralised with the X-risks beyond AUROC (AP, two-way KL pAUC, CVaR pAUC):
a hand transcription of one client round, executors, communication, the global v, bad input."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedrisk.algorithms.base import FedInfo, LocalData, RoundContext
from fedrisk.algorithms.fedxl import FeDXL2, SingleClassClientWarning
from fedrisk.algorithms.local_only import centralized
from fedrisk.algorithms.local_pair import CentralizedPair, LocalPair
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.metrics.classification import auprc
from fedrisk.models import FunctionalModel, build_model
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import VectorizedExecutor

F64 = torch.float64
D = 3
KINDS = ("ap", "tpauc", "pauc_cvar")


def linear() -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (D,), 1))


def fed_of(num_clients: int = 3, pos: int = 3, neg: int = 4, seed: int = 0) -> Federation:
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k in range(num_clients):
        y = torch.tensor([1] * pos + [0] * neg)
        clients.append(Samples(torch.randn(pos + neg, D, generator=g, dtype=F64) + 0.5 * y[:, None] + 0.3 * k, y))
    return Federation("small", clients, 2)


def info(fed: Federation) -> FedInfo:
    counts = tuple(tuple(int((c.y == j).sum()) for j in range(2)) for c in fed.clients)
    return FedInfo(fed.num_clients, tuple(len(c.y) for c in fed.clients), 2, counts)


def flat(tree: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in tree.values()])


def test_fedxl2_ap_round_against_a_plain_loop() -> None:
    """K = 3 steps, B1 = B2 = 2, momentum β = 0.5, lr 0.3, γ = 0.4, passive draws with replacement:
    the client's reply (w, G, scores, u) and its u-table equal a loop written from eqs. (12)–(13),
    (18)–(19) with SOAP's weights."""
    K, B1, B2, lr, beta, gamma, m = 3, 2, 2, 0.3, 0.5, 0.4, 0.7
    fed = fed_of(num_clients=1)
    data = fed.clients[0]
    alg = FeDXL2(
        model=linear(), xrisk="ap", lr=lr, local_steps=K, batch_pos=B1, batch_neg=B2, beta=beta, gamma=gamma,
        margin=m, passive_sampling="with_replacement",
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    params = {"linear.weight": torch.randn(1, D, generator=g, dtype=F64), "linear.bias": torch.zeros(1, dtype=F64)}
    momentum = {k: 0.1 * torch.ones_like(v) for k, v in params.items()}
    pool_pos, pool_neg = torch.rand(5, generator=g, dtype=F64), torch.rand(6, generator=g, dtype=F64)
    pool_u = torch.rand(5, 2, generator=g, dtype=F64) + 0.5
    payload = {"params": params, "momentum": momentum, "pool_pos": pool_pos, "pool_neg": pool_neg, "pool_u": pool_u}
    draws = {key: torch.rand(K, n, generator=g, dtype=F64) for key, n in
             (("pos", B1), ("neg", B2), ("keys_pos", B1), ("keys_neg", B2))}  # fmt: skip
    ctx = RoundContext(1, info(fed))
    state0 = alg.init_client(ctx, 0, params)
    state0["u"] = state0["u"] + torch.arange(3, dtype=F64)[:, None] * 0.1  # distinct start values
    result = alg.client_update(ctx, payload, dict(state0), LocalData(data.x, data.y, torch.tensor(7)), draws)

    # --- the plain loop ------------------------------------------------------------------------
    w, bias = params["linear.weight"].clone(), params["linear.bias"].clone()
    Gw, Gb = momentum["linear.weight"].clone(), momentum["linear.bias"].clone()
    u = state0["u"].clone()
    stored_a, stored_u = [], []
    for k in range(K):
        rank = [min(int(x * 3), 2) for x in draws["pos"][k].tolist()]
        neg_rows = [3 + min(int(x * 4), 3) for x in draws["neg"][k].tolist()]
        ip = [min(int(x * 5), 4) for x in draws["keys_pos"][k].tolist()]
        i_n = [min(int(x * 6), 5) for x in draws["keys_neg"][k].tolist()]
        hp, hn, up = pool_pos[ip], pool_neg[i_n], pool_u[ip]
        wv, bv = w.clone().requires_grad_(), bias.clone().requires_grad_()
        a = torch.sigmoid(data.x[rank] @ wv[0] + bv)
        b = torch.sigmoid(data.x[neg_rows] @ wv[0] + bv)
        partners, is_pos = torch.cat([hp, hn]), torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64)
        L1 = torch.clamp(m - (a[:, None] - partners[None, :]), min=0) ** 2
        ghat = torch.stack([(L1.detach() * is_pos).mean(1), L1.detach().mean(1)], 1)
        u_rows = (1 - gamma) * u[rank] + gamma * ghat
        P1 = (u_rows[:, :1] - u_rows[:, 1:] * is_pos) / u_rows[:, 1:] ** 2
        cols = torch.cat([a, b])
        L2 = torch.clamp(m - (hp[:, None] - cols[None, :]), min=0) ** 2
        P2 = (up[:, :1] - up[:, 1:] * is_pos) / up[:, 1:] ** 2
        loss = (P1 * L1).mean() + (P2 * L2).mean()
        gw, gb = torch.autograd.grad(loss, (wv, bv))
        Gw, Gb = (1 - beta) * Gw + beta * gw, (1 - beta) * Gb + beta * gb
        for i, r in enumerate(rank):
            u[r] = u_rows[i]
        w, bias = w - lr * Gw, bias - lr * Gb
        stored_a.append(a.detach())
        stored_u.append(u_rows.detach())
    reply = result.reply
    assert torch.allclose(reply["params"]["linear.weight"], w, atol=1e-12)
    assert torch.allclose(reply["params"]["linear.bias"], bias, atol=1e-12)
    assert torch.allclose(reply["momentum"]["linear.weight"], Gw, atol=1e-12)
    assert torch.allclose(reply["h_pos"], torch.cat(stored_a), atol=1e-12)
    assert torch.allclose(reply["u_pos"], torch.cat(stored_u), atol=1e-12)
    assert reply["u_pos"].shape == (K * B1, 2)
    assert torch.allclose(result.state["u"], u, atol=1e-12)
    assert result.state["u"].shape == (3, 2)  # one row per positive of the client, not per example


@pytest.mark.parametrize("kind", KINDS)
def test_vectorized_executor_matches_sequential(kind: str) -> None:
    """Partial participation, unequal clients, a client without positives (float64)."""
    fed = fed_of(num_clients=4, pos=3, neg=4)
    no_pos = fed.clients[2].subset(torch.nonzero(fed.clients[2].y == 0).flatten())
    fed = Federation("mixed", [fed.clients[0], fed.clients[1], no_pos, fed.clients[3]], 2)
    alg = FeDXL2(model=linear(), xrisk=kind, local_steps=3, batch_pos=2, batch_neg=2, clients_per_round=3, lr=0.5)
    runs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClassClientWarning)
        for executor in ("sequential", VectorizedExecutor(block_size=None)):
            sim = Simulation(alg, fed, seed=5, dtype=F64, executor=executor)
            runs.append((sim, [sim.step() for _ in range(4)]))
    (a, ra), (b, rb) = runs
    assert [(r.bytes_down, r.bytes_up) for r in ra] == [(r.bytes_down, r.bytes_up) for r in rb]
    assert torch.allclose(flat(a.server_state["params"]), flat(b.server_state["params"]), rtol=1e-9, atol=1e-12)
    assert torch.allclose(a.server_state["pool_u"], b.server_state["pool_u"], rtol=1e-9, atol=1e-12)
    for k in range(4):
        assert torch.allclose(a.client_states[k]["u"], b.client_states[k]["u"], rtol=1e-9, atol=1e-12)
    assert torch.equal(a.client_states[2]["u"], alg.init_client(RoundContext(0, info(fed)), 2, {})["u"])  # no anchors
    if kind == "tpauc":
        assert torch.allclose(a.server_state["v"], b.server_state["v"], rtol=1e-9)


def test_communication_of_each_objective() -> None:
    """Per client and round: AP uploads two u columns per positive score (and downloads them in
    the pool), two-way pAUC one u and the scalar v both ways, CVaR one threshold."""
    fed = fed_of(num_clients=3)
    K, B1, B2, N, d = 2, 3, 2, 3, 4
    up, down = {}, {}
    for kind in ("pauc", *KINDS):
        sim = Simulation(FeDXL2(model=linear(), xrisk=kind, local_steps=K, batch_pos=B1, batch_neg=B2), fed, seed=0,
                         dtype=F64)  # fmt: skip
        reports = [sim.step() for _ in range(3)]
        up[kind], down[kind] = reports[-1].bytes_up // N, reports[-1].bytes_down // N
    assert up["pauc"] == 8 * (2 * d + K * (2 * B1 + B2))
    assert up["ap"] == up["pauc"] + 8 * K * B1
    assert down["ap"] == down["pauc"] + 8 * N * K * B1
    assert up["tpauc"] == up["pauc"] + 8 and down["tpauc"] == down["pauc"] + 8
    assert (up["pauc_cvar"], down["pauc_cvar"]) == (up["pauc"], down["pauc"])


def test_server_averages_the_two_way_v() -> None:
    fed = fed_of(num_clients=3)
    alg = FeDXL2(model=linear(), xrisk="tpauc", local_steps=2, batch_pos=2, batch_neg=2, gamma_v=0.5, lam=0.5)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    sim.step()
    assert float(sim.server_state["v"]) == 1.0  # (u_init)^(λ/λ')
    seen = []
    original = alg.aggregate

    def spy(ctx, server_state, plan, replies, gen):
        seen.append(replies.gather("v"))
        return original(ctx, server_state, plan, replies, gen)

    object.__setattr__(alg, "aggregate", spy)
    sim.step()
    vs = torch.stack(list(seen[0]))
    assert vs.shape == (3,) and float(vs.std()) > 0  # each client moved its copy differently
    assert float(sim.server_state["v"]) == pytest.approx(float(vs.mean()), abs=1e-14)


def test_two_way_v_starts_at_u_init_to_the_power_lam_over_lam_pos_in_the_runs_dtype() -> None:
    """``v^0 = (u^0)^(λ/λ')`` with u^0 = 2, λ = 0.5, λ' = 0.25: 4, in float64 like the model
    (pinned by mutation testing, fedxl scope: pairwise.py's init_server)."""
    alg = FeDXL2(
        model=linear(), xrisk="tpauc", u_init=2.0, lam=0.5, lam_pos=0.25, local_steps=2, batch_pos=2, batch_neg=2
    )
    sim = Simulation(alg, fed_of(num_clients=2), seed=0, dtype=F64)
    assert sim.server_state["v"].dtype == F64 and float(sim.server_state["v"]) == 2.0 ** (0.5 / 0.25)
    assert [sim.step().kind for _ in range(3)] == ["bootstrap", "train", "train"]  # FeDXL's round 0 bootstraps


@pytest.mark.parametrize("kind", KINDS)
def test_local_pair_and_centralised_run_each_objective(kind: str) -> None:
    fed = fed_of(num_clients=3)
    for alg, f in (
        (LocalPair(model=linear(), xrisk=kind, local_steps=2, batch_pos=2, batch_neg=2, beta=0.5), fed),
        (CentralizedPair(model=linear(), xrisk=kind, local_steps=2, batch_pos=2, batch_neg=2), centralized(fed)),
    ):
        sim = Simulation(alg, f, seed=0, dtype=F64)
        before = flat(sim.server_state["params"]).clone()
        sim.step()
        assert not torch.equal(before, flat(sim.server_state["params"]))
        assert ("v" in sim.server_state) == (kind == "tpauc")


def test_fedxl2_ap_raises_training_auprc() -> None:
    """A short federated AP run on shifted, imbalanced clients raises the training AUPRC."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for k in range(4):
        y = (torch.rand(60, generator=g) < 0.1).long()
        y[:2] = 1
        clients.append(Samples(torch.randn(60, D, generator=g, dtype=F64) + 1.5 * y[:, None] + 0.5 * k, y))
    fed = Federation("imb", clients, 2)
    alg = FeDXL2(model=linear(), xrisk="ap", local_steps=8, batch_pos=4, batch_neg=8, lr=1.0)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    x, y = torch.cat([c.x for c in clients]), torch.cat([c.y for c in clients])

    def score() -> float:
        with torch.no_grad():
            return auprc(alg.scores(sim.server_state["params"], x).numpy(), y.numpy())

    start = score()
    for _ in range(11):
        sim.step()
    assert score() > start + 0.1


def test_bad_input_is_named() -> None:
    with pytest.raises(FedriskError, match=r"max_fpr = 1.5 is out of range; allowed: \(0.0, 1.0\]"):
        FeDXL2(model=None, xrisk="pauc_cvar", max_fpr=1.5)
    with pytest.raises(FedriskError, match=r"max_fpr = 0\.0 is out of range"):
        LocalPair(model=None, xrisk="pauc_cvar", max_fpr=0.0)
    with pytest.raises(FedriskError, match=r"lam_pos = -1\.0 is out of range"):
        FeDXL2(model=None, xrisk="tpauc", lam_pos=-1.0)
    with pytest.raises(FedriskError, match="unknown xrisk 'ndcg'"):
        FeDXL2(model=None, xrisk="ndcg")
    fed = fed_of(num_clients=2)
    negatives = Federation("neg", [c.subset(torch.nonzero(c.y == 0).flatten()) for c in fed.clients], 2)
    with pytest.raises(FedriskError, match="the federation has no positive training examples"):
        Simulation(FeDXL2(model=linear(), xrisk="ap", local_steps=1, batch_pos=1, batch_neg=1), negatives, seed=0)
    two = FunctionalModel(build_model("logreg", (D,), 2))
    sim = Simulation(FeDXL2(model=two, xrisk="ap", local_steps=1, batch_pos=1, batch_neg=1), fed, seed=0)
    with pytest.raises(FedriskError, match="needs a one-output scorer; the model returns 2 outputs"):
        sim.step()


@pytest.mark.parametrize("kind", KINDS)
def test_a_single_class_client_ignores_the_pool_it_has_no_partner_for(kind: str) -> None:
    """A client without negatives has no G2 (passive positives × its negatives): its update does
    not move when the passive positive pool does (except under AP), but does when the negative pool
    does; a client without positives never reads the negative pool (pinned by mutation testing, fedxl scope: the class
    weights handed to the compositional step)."""
    g = torch.Generator().manual_seed(1)
    labels = ([1, 0, 1, 0, 0], [1, 1, 1], [0, 0, 0, 0], [1, 0, 1])  # both, positives only, negatives only, one negative
    fed = Federation(
        "one-class", [Samples(torch.randn(len(y), D, generator=g, dtype=F64), torch.tensor(y)) for y in labels], 2
    )
    alg = FeDXL2(model=linear(), xrisk=kind, local_steps=2, batch_pos=2, batch_neg=2, lr=0.5, beta=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClassClientWarning)
        sim = Simulation(alg, fed, seed=0, dtype=F64)
    sim.step()  # the bootstrap round fills the pools
    ctx = RoundContext(1, sim.info)
    base = alg.configure(ctx, sim.server_state, torch.Generator().manual_seed(0)).payload(0)
    moved_pos = {**base, "pool_pos": base["pool_pos"] * 0.5 + 0.2}
    moved_neg = {**base, "pool_neg": base["pool_neg"] * 0.5 + 0.2}
    if "pool_u" in base:
        moved_pos["pool_u"] = base["pool_u"] * 1.7

    def update(k: int, payload: dict) -> torch.Tensor:
        c = fed.clients[k]
        draws = alg.draw(ctx, k, len(c.y), client_generator(0, round=1, client=k))
        data = LocalData(c.x, c.y, torch.tensor(len(c.y)))
        return flat(alg.client_update(ctx, payload, sim.client_states[k], data, draws).reply["params"])

    positives_only, negatives_only = update(1, base), update(2, base)
    if kind != "ap":  # (AP ranks a positive against the passive positives too: it reads both pools)
        assert torch.equal(update(1, moved_pos), positives_only)
    assert not torch.equal(update(1, moved_neg), positives_only)
    assert torch.equal(update(2, moved_neg), negatives_only) and not torch.equal(update(2, moved_pos), negatives_only)
    assert not torch.equal(update(0, moved_pos), update(0, base))  # a two-class client reads both pools
    assert not torch.equal(update(3, moved_pos), update(3, base))  # ... even with a single negative
