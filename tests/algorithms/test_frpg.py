"""FRPG / LFRPG / RSA / RobustSGD (paper 002): schedules, each update against its argmin,
the server's projection, attack-magnitude invariance, short behavioural runs, bad input."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from fedrisk.aggregators import InMemoryReplies, Krum
from fedrisk.algorithms import FRPG, LFRPG, RSA, RobustSGD
from fedrisk.algorithms.base import FedInfo, LocalData, RoundContext
from fedrisk.algorithms.frpg import frpg_schedule, frpg_server_post, frpg_server_pre, frpg_worker_slot
from fedrisk.attacks import GaussianAttack, LabelFlipAttack
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.penalties import huber_l2
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import VectorizedExecutor
from fedrisk.tree import tree_flatten_vector

F64 = torch.float64
FEATURES, CLASSES = 6, 3


def model() -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (FEATURES,), CLASSES))


def federation(num_clients: int = 8, n: int = 30, seed: int = 0) -> Federation:
    """Clients in pairs by class (reading H1): well-separated Gaussian blobs per class."""
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(CLASSES, FEATURES, generator=g, dtype=F64)

    def samples(c: int, m: int) -> Samples:
        y = torch.full((m,), c) if c >= 0 else torch.randint(0, CLASSES, (m,), generator=g)
        return Samples(centres[y] + torch.randn(m, FEATURES, generator=g, dtype=F64), y)

    clients = [samples(k * CLASSES // num_clients, n) for k in range(num_clients)]
    return Federation("blobs", clients, num_classes=CLASSES, test=samples(-1, 300))


def frpg(**kw) -> FRPG:
    return FRPG(model=model(), loss=cross_entropy, **{"lipschitz": 10.0, **kw})


def rvec(seed: int, d: int = 5, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=F64)


# ----------------------------------------------------------------------------- schedules (7.1.3)
def test_schedules_match_16_17() -> None:
    d0, d, L0, L = 0.003, 0.005, 2.0, 7.0
    beta, a0, an = frpg_schedule(1, d0, d, L0, L)
    assert beta == pytest.approx(2 / 3) and a0 == pytest.approx(9 * d0 / 14 + 1.5 * L0)
    assert an == pytest.approx(27 * d / 14 + L)
    for k in (2, 10, 400):
        beta, a0, an = frpg_schedule(k, d0, d, L0, L)
        expected = (2 / (k + 2), d0 / 14 * (k + 2) ** 2 + 1.5 * L0, 3 * d / 14 * (k + 2) ** 2 + L)
        assert (beta, a0, an) == pytest.approx(expected)
    # L_0 defaults to L_n (spec A4)
    assert frpg().schedule(3) == frpg_schedule(3, 0.003, 0.003, 10.0, 10.0)
    assert frpg(lipschitz_server=0.003).schedule(3)[1] == pytest.approx(0.003 / 14 * 25 + 1.5 * 0.003)
    with pytest.raises(FedriskError):
        frpg_schedule(0, d0, d, L0, L)


def test_lfrpg_uses_the_frame_index_constant_across_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedrisk.algorithms.frpg as mod

    seen = []
    original = mod.frpg_worker_slot

    def spy(u, v, w0, s, alpha, beta, *rest):
        seen.append((alpha, beta))
        return original(u, v, w0, s, alpha, beta, *rest)

    monkeypatch.setattr(mod, "frpg_worker_slot", spy)
    alg = LFRPG(model=model(), loss=cross_entropy, lipschitz=10.0, local_slots_per_round=4)
    sim = Simulation(alg, federation(2), dtype=F64)
    sim.step()
    sim.step()
    assert len(seen) == 2 * 2 * 4
    frame2 = alg.schedule(2)
    assert all(s == (frame2[2], frame2[0]) for s in seen[8:])
    assert seen[0] == (alg.schedule(1)[2], alg.schedule(1)[0])


# ----------------------------------------------------------------------------- updates = argmins (7.1.2)
@pytest.mark.parametrize("scale", [1e-5, 1e-2, 3.0])
def test_worker_update_is_the_argmin_of_32(scale: float) -> None:
    lam, mu, alpha, beta, delta = 1.6, 1e-3, 12.0, 0.4, 0.003
    u, v, s = rvec(0), rvec(1), rvec(2)
    w0 = u + rvec(3, scale=scale)
    w, g, v_new = frpg_worker_slot(u, v, w0, s, alpha, beta, delta, lam, mu)
    assert torch.allclose(alpha * (u - w), s - g, atol=1e-10)  # (33)
    assert float(torch.linalg.vector_norm(g)) <= lam + 1e-12
    obj = lambda x: s @ (x - u) + alpha / 2 * ((x - u) ** 2).sum() + lam * huber_l2(w0 - x, mu)  # noqa: E731 (32)
    for seed in range(10):
        assert obj(w) <= obj(w + rvec(10 + seed, scale=1e-5)) + 1e-13
    # (8c): the gradient of <h, x - u> + delta/2 ||x - u||^2 + alpha beta/2 ||x - v||^2 vanishes at v_new
    h = s - g
    assert torch.allclose(h + delta * (v_new - u) + alpha * beta * (v_new - v), torch.zeros(5, dtype=F64), atol=1e-10)


def test_server_updates_and_closed_forms() -> None:
    d0, a0, beta = 0.003, 9.0, 0.5
    w0, v0, g_sum = rvec(0), rvec(1), rvec(2)
    u0, w0k = frpg_server_pre(w0, v0, beta, a0, d0)
    assert torch.allclose(u0, (1 - beta) * w0 + beta * v0)  # (6a)
    assert torch.allclose(w0k, (1 - d0 / a0) * u0)  # (6b) with grad f_0 = delta_0 u
    assert torch.allclose(a0 * (u0 - w0k), d0 * u0)  # h_0 = grad f_0(u_0) (38)
    v0_new = frpg_server_post(v0, u0, g_sum, a0, beta, d0)  # (6c)
    grad = d0 * u0 + g_sum + d0 * (v0_new - u0) + a0 * beta * (v0_new - v0)
    assert torch.allclose(grad, torch.zeros(5, dtype=F64), atol=1e-12)
    assert torch.allclose(v0_new, (a0 * beta * v0 - g_sum) / (d0 + a0 * beta))  # the quadratic-f_0 closed form


def test_client_update_reproduces_the_slot_by_hand() -> None:
    alg, fed = frpg(batch_size=4), federation(2)
    info = FedInfo(2, (30, 30), CLASSES)
    ctx = RoundContext(2, info)  # slot k = 3
    params = {
        k: torch.randn(v.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        for k, v in alg.init_params(torch.Generator()).items()
    }
    state = {"w": params, "v": {k: 2 * v for k, v in params.items()}}
    payload = {"w0": {k: -v for k, v in params.items()}}
    data = LocalData(fed.clients[0].x, fed.clients[0].y, torch.tensor(30))
    draws = alg.draw(ctx, 0, 30, client_generator(0, round=2, client=0))
    out = alg.client_update(ctx, payload, state, data, draws)
    beta, _, alpha = alg.schedule(3)
    w, v, w0 = (tree_flatten_vector(t) for t in (state["w"], state["v"], payload["w0"]))
    u = (1 - beta) * w + beta * v
    idx = draws["batches"][0]
    leaves = {
        k: t.detach().clone().requires_grad_(True)
        for k, t in zip(params, torch.split(u, [p.numel() for p in params.values()]))
    }
    leaves = {k: t.reshape(params[k].shape) for k, t in leaves.items()}
    loss = cross_entropy(alg.model.apply(leaves, data.x[idx]), data.y[idx])
    grads = torch.autograd.grad(loss, list(leaves.values()))
    s = torch.cat([g.reshape(-1) for g in grads]) + alg.delta * u
    w_ref, g_ref, v_ref = frpg_worker_slot(u, v, w0, s, alpha, beta, alg.delta, alg.lam, alg.mu)
    assert torch.allclose(out.reply["g"], g_ref, atol=1e-12)
    assert torch.allclose(tree_flatten_vector(out.state["w"]), w_ref, atol=1e-12)
    assert torch.allclose(tree_flatten_vector(out.state["v"]), v_ref, atol=1e-12)


# ----------------------------------------------------------------------------- projection (7.1.4)
def test_server_projects_every_received_g_onto_the_lambda_ball(monkeypatch: pytest.MonkeyPatch) -> None:
    import fedrisk.algorithms.frpg as mod

    alg = frpg()
    sim = Simulation(alg, federation(), dtype=F64, attack=GaussianAttack(1e4), byzantine=[6, 7])
    norms: list[float] = []
    original = mod.frpg_server_post

    def spy(v0, u0, g_sum, *rest):
        return original(v0, u0, g_sum, *rest)

    received = []
    real_clip = mod.clip_rows

    def project(x, radius):
        out = real_clip(x, radius)
        received.extend(torch.linalg.vector_norm(x, dim=1).tolist())
        norms.extend(torch.linalg.vector_norm(out, dim=1).tolist())
        return out

    monkeypatch.setattr(mod, "clip_rows", project)
    monkeypatch.setattr(mod, "frpg_server_post", spy)
    for _ in range(3):
        sim.step()
    assert len(norms) == 3 * 8
    assert max(norms) <= alg.lam + 1e-12
    assert max(received) > 1e4  # the attack's raw messages were huge
    # honest messages are untouched: lambda grad p has norm <= lambda already
    honest = [n for n, r in zip(norms, received) if r < 1e3]
    assert len(honest) == 3 * 6 and all(abs(n - r) < 1e-15 for n, r in zip(honest, [r for r in received if r < 1e3]))


def test_aggregate_uses_the_projected_sum() -> None:
    alg = frpg()
    params = alg.init_params(torch.Generator())
    state = alg.init_server(RoundContext(0, FedInfo(2, (1, 1), 3)), {k: v.double() for k, v in params.items()}, None)
    d = sum(p.numel() for p in params.values())
    big = torch.zeros(d, dtype=F64)
    big[0] = 1e6
    small = torch.zeros(d, dtype=F64)
    small[1] = 0.5
    ctx = RoundContext(0, FedInfo(2, (1, 1), 3))
    new = alg.aggregate(ctx, state, None, InMemoryReplies({0: {"g": big}, 1: {"g": small}}), None)
    beta, a0, _ = alg.schedule(1)
    expected = -(alg.lam * big / 1e6 + small) / (alg.delta_server + a0 * beta)  # v_0 = 0 initially
    assert torch.allclose(tree_flatten_vector(new["v"]), expected)


def _run(alg, attack=None, byz=(), rounds=20, seed=0, executor="sequential"):
    sim = Simulation(alg, federation(), dtype=F64, attack=attack, byzantine=byz, seed=seed, executor=executor)
    for _ in range(rounds):
        sim.step()
    return sim


def test_gaussian_scale_1e4_and_1e8_give_identical_trajectories() -> None:  # check 7.1.5
    a = _run(frpg(), GaussianAttack(1e4), [6, 7])
    b = _run(frpg(), GaussianAttack(1e8), [6, 7])
    wa, wb = tree_flatten_vector(a.server_state["w"]), tree_flatten_vector(b.server_state["w"])
    assert float(torch.linalg.vector_norm(wa - wb) / torch.linalg.vector_norm(wa)) < 1e-9
    # without the projection (pitfall P1) the attack's magnitude reaches the server model
    c = _run(frpg(project=False), GaussianAttack(1e4), [6, 7], rounds=5)
    assert float(torch.linalg.vector_norm(tree_flatten_vector(c.server_state["v"]))) > 100 * float(
        torch.linalg.vector_norm(tree_flatten_vector(a.server_state["v"]))
    )


def _accuracy(sim: Simulation) -> float:
    test = sim.federation.test
    logits = sim.algorithm.predict(sim.algorithm.global_params(sim.server_state), test.x)
    return float((logits.argmax(1) == test.y).double().mean())


def test_frpg_and_lfrpg_learn_under_the_gaussian_attack_where_sgd_fails() -> None:
    byz = [6, 7]  # they hold class 2: reliable workers see classes 0, 1 (and a bit of 2 on worker 5)
    acc_frpg = _accuracy(_run(frpg(), GaussianAttack(1e4), byz, rounds=30))
    lfrpg = LFRPG(model=model(), loss=cross_entropy, lipschitz=10.0, local_slots_per_round=4)
    acc_lfrpg = _accuracy(_run(lfrpg, GaussianAttack(1e4), byz, rounds=8))
    acc_sgd = _accuracy(_run(RobustSGD(model=model(), loss=cross_entropy, lr=1.0), GaussianAttack(1e4), byz, rounds=20))
    assert acc_frpg > 0.55 and acc_lfrpg > 0.55
    assert acc_sgd < 0.5


def test_robust_sgd_with_krum_and_rsa_run() -> None:
    krum = _run(RobustSGD(model=model(), loss=cross_entropy, lr=1.0, aggregator=Krum(f=2)), GaussianAttack(1e4), [6, 7])
    assert _accuracy(krum) > 0.4
    rsa = _run(RSA(model=model(), loss=cross_entropy, lam=0.1, lr=0.5), GaussianAttack(1e4), [6, 7])
    assert _accuracy(rsa) > 0.5
    assert float(tree_flatten_vector(rsa.server_state["w"]).abs().max()) < 50  # the sign bounds each step


def test_lfrpg_lit_and_seq_agree_when_T_is_1() -> None:
    lit_alg = LFRPG(model=model(), loss=cross_entropy, lipschitz=10.0, local_slots_per_round=1, variant="lit")
    lit = _run(lit_alg, rounds=5)
    seq = _run(LFRPG(model=model(), loss=cross_entropy, lipschitz=10.0, local_slots_per_round=1), rounds=5)
    one = _run(frpg(), rounds=5)
    for sim in (lit, seq):
        assert torch.allclose(tree_flatten_vector(sim.server_state["w"]), tree_flatten_vector(one.server_state["w"]))


@pytest.mark.parametrize("variant", ["seq", "lit"])
def test_lfrpg_vectorized_equals_sequential(variant: str) -> None:
    def make() -> LFRPG:
        return LFRPG(model=model(), loss=cross_entropy, lipschitz=10.0, local_slots_per_round=3, variant=variant)

    a = _run(make(), GaussianAttack(1e4), [7], rounds=3)
    b = _run(make(), GaussianAttack(1e4), [7], rounds=3, executor="vectorized")
    for key in ("w", "v"):
        assert torch.allclose(
            tree_flatten_vector(a.server_state[key]), tree_flatten_vector(b.server_state[key]), rtol=1e-9, atol=1e-12
        )


def test_label_flip_attack_flips_only_the_byzantine_clients() -> None:
    fed = federation()
    sim = Simulation(frpg(), fed, dtype=F64, attack=LabelFlipAttack(), byzantine=[0, 7])
    assert torch.equal(sim.federation.clients[0].y, CLASSES - 1 - fed.clients[0].y)
    assert torch.equal(sim.federation.clients[7].y, CLASSES - 1 - fed.clients[7].y)
    assert all(torch.equal(sim.federation.clients[k].y, fed.clients[k].y) for k in range(1, 7))
    assert torch.equal(sim.federation.test.y, fed.test.y)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("field", ["lam", "mu", "delta", "delta_server", "lipschitz"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_nonpositive_hyper_parameters_raise(field: str, value: float) -> None:
    with pytest.raises(FedriskError, match=field):
        frpg(**{field: value})


def test_other_bad_input() -> None:
    with pytest.raises(FedriskError, match="variant"):
        LFRPG(model=model(), loss=cross_entropy, variant="literal")
    with pytest.raises(FedriskError, match="local_slots_per_round"):
        LFRPG(model=model(), loss=cross_entropy, local_slots_per_round=0)
    with pytest.raises(FedriskError, match="lam"):
        RSA(model=model(), loss=cross_entropy, lam=0.0)
    with pytest.raises(FedriskError, match="lr_decay"):
        RobustSGD(model=model(), loss=cross_entropy, lr_decay="cosine")
    with pytest.raises(FedriskError, match="lipschitz_server"):
        frpg(lipschitz_server=-1.0)
    assert dataclasses.replace(frpg(), lam=2.0).lam == 2.0


NOT_POSITIVE = "is not allowed; it must be a number > 0"
BAD_INPUT = [  # (class, keys, the whole message): pinned by mutation testing (frpg scope)
    (FRPG, {"lam": 0.0}, f"lam = 0.0 {NOT_POSITIVE}"),
    (FRPG, {"mu": -1.0}, f"mu = -1.0 {NOT_POSITIVE}"),
    (FRPG, {"delta": 0.0}, f"delta = 0.0 {NOT_POSITIVE}"),
    (FRPG, {"delta_server": float("nan")}, f"delta_server = nan {NOT_POSITIVE}"),
    (FRPG, {"lipschitz": float("inf")}, "lipschitz = inf is not allowed; it must be a finite number > 0"),
    (FRPG, {"lipschitz_server": 0.0}, f"lipschitz_server = 0.0 {NOT_POSITIVE}"),
    (FRPG, {"lam_decay": 0.0}, f"lam_decay = 0.0 {NOT_POSITIVE}"),
    (FRPG, {"batch_size": 0}, "batch_size = 0 is out of range; allowed: [1, inf)"),
    (FRPG, {"sampling": "bootstrap"}, "unknown sampling 'bootstrap'. Valid choices: shuffle, with_replacement"),
    (
        FRPG,
        {"pre": "median"},
        "unknown pre-aggregation (algorithm.pre) 'median'. Valid choices: arc, bucketing, nnm, none",
    ),
    (FRPG, {"pre": "nnm", "pre_f": -1}, "pre_f = -1 is out of range; allowed: [0, inf)"),
    (FRPG, {"pre": "bucketing", "bucket_size": 0}, "bucket_size = 0 is out of range; allowed: [1, inf)"),
    (
        FRPG,
        {"pre": "bucketing", "pre_f": 1},
        "algorithm.pre_f = 1 is used only with pre = 'nnm' or 'arc' (pre = 'bucketing')",
    ),
    (FRPG, {"lam_schedule": "cosine"}, "unknown lam_schedule 'cosine'. Valid choices: constant, geometric, list, sqrt"),
    (
        FRPG,
        {"lam_decay": 0.5, "lam_schedule": "sqrt"},
        "algorithm.lam_decay = 0.5 is used only with lam_schedule = 'geometric' (lam_schedule = 'sqrt')",
    ),
    (
        FRPG,
        {"lam_schedule": "list"},
        "algorithm.lam_values (one lambda per round) is needed with lam_schedule = 'list' "
        "and only then (lam_schedule = 'list', lam_values = [])",
    ),
    (
        FRPG,
        {"lam_values": (1.0,)},
        "algorithm.lam_values (one lambda per round) is needed with lam_schedule = 'list' "
        "and only then (lam_schedule = 'constant', lam_values = [1.0])",
    ),
    (
        FRPG,
        {"lam_schedule": "list", "lam_values": (1.0, 0.0)},
        "algorithm.lam_values[1] = 0.0 is not allowed; every lambda must be > 0",
    ),
    (
        FRPG,
        {"lam_schedule": "list", "lam_values": (2.0, float("inf"))},
        "algorithm.lam_values[1] = inf is not allowed; every lambda must be > 0",
    ),
    (
        FRPG,
        {"lam_schedule": "list", "lam_values": ("1",)},
        "algorithm.lam_values[0] = '1' is not allowed; every lambda must be > 0",
    ),
    (FRPG, {"nonfinite": "skip"}, "algorithm.nonfinite = 'skip' is not allowed; valid choices: raise, exclude"),
    (LFRPG, {"local_slots_per_round": 0}, "local_slots_per_round = 0 is out of range; allowed: [1, inf)"),
    (LFRPG, {"variant": "literal"}, "unknown LFRPG variant 'literal'. Did you mean 'lit'? Valid choices: lit, seq"),
    (LFRPG, {"mu": 0.0}, f"mu = 0.0 {NOT_POSITIVE}"),
    (RSA, {"lam": 0.0}, f"lam = 0.0 {NOT_POSITIVE}"),
    (RSA, {"lr": -1.0}, f"lr = -1.0 {NOT_POSITIVE}"),
    (RSA, {"delta": -0.1}, "delta = -0.1 is out of range; allowed: [0.0, inf)"),
    (RSA, {"delta_server": -0.1}, "delta_server = -0.1 is out of range; allowed: [0.0, inf)"),
    (RSA, {"batch_size": 0}, "batch_size = 0 is out of range; allowed: [1, inf)"),
    (RSA, {"sampling": "x"}, "unknown sampling 'x'. Valid choices: shuffle, with_replacement"),
    (RobustSGD, {"lr": 0.0}, f"lr = 0.0 {NOT_POSITIVE}"),
    (RobustSGD, {"delta": -1.0}, "delta = -1.0 is out of range; allowed: [0.0, inf)"),
    (RobustSGD, {"batch_size": 0}, "batch_size = 0 is out of range; allowed: [1, inf)"),
    (RobustSGD, {"sampling": "x"}, "unknown sampling 'x'. Valid choices: shuffle, with_replacement"),
    (RobustSGD, {"lr_decay": "cosine"}, "unknown lr_decay 'cosine'. Valid choices: constant, sqrt"),
]


@pytest.mark.parametrize(("cls", "kw", "message"), BAD_INPUT, ids=lambda v: getattr(v, "__name__", None))
def test_each_bad_key_gets_its_own_message(cls, kw, message) -> None:
    """Each check names the key and what is allowed: the whole one-line message."""
    with pytest.raises(FedriskError, match=f"^{re.escape(message)}$"):
        cls(model=model(), loss=cross_entropy, **kw)


def test_the_boundary_values_are_allowed() -> None:
    """The edges of each range are accepted (a check one step too strict fails here)."""
    for cls in (RSA, RobustSGD):
        assert cls(model=model(), loss=cross_entropy, delta=0.0, batch_size=1).delta == 0.0
    assert RSA(model=model(), loss=cross_entropy, delta_server=0.0).delta_server == 0.0
    assert frpg(batch_size=1, pre="nnm", pre_f=0, lam_schedule="geometric", lam_decay=1.0).batch_size == 1
    assert frpg(pre="bucketing", bucket_size=1).bucket_size == 1
    assert frpg(pre="arc", pre_f=1).pre_f == frpg(pre="nnm", pre_f=1).pre_f == 1
    assert LFRPG(model=model(), loss=cross_entropy, local_slots_per_round=1).slots_per_round == 1


def test_frpg_from_a_config_with_an_attack() -> None:
    from fedrisk.experiment.config import resolve_config
    from fedrisk.experiment.runner import build_simulation

    raw = {
        "data": {"dataset": "digits", "partition": "class_groups", "num_clients": 20},
        "model": {"name": "logreg"},
        "algorithm": {"name": "lfrpg", "lipschitz": 24.1, "variant": "lit", "local_slots_per_round": 2},
        "attack": {"name": "alie", "byzantine": [16, 17, 18, 19]},
        "run": {"dtype": "float64"},
    }
    sim = build_simulation(resolve_config(raw)).simulation
    assert sim.byzantine == [16, 17, 18, 19] and sim.attack.name == "alie"
    assert {int(c) for c in sim.federation.clients[19].y.unique()} == {9}
    sim.step()
    with pytest.raises(FedriskError, match="mu"):
        resolve_config({**raw, "algorithm": {"name": "frpg", "mu": 0.0}})


def test_robust_sgd_with_bucketing_is_executor_independent() -> None:
    from fedrisk.aggregators import CoordinateMedian

    def make() -> RobustSGD:
        return RobustSGD(model=model(), loss=cross_entropy, lr=1.0, aggregator=CoordinateMedian(pre="bucketing"))

    a = _run(make(), GaussianAttack(1e4), [7], rounds=4)
    b = _run(make(), GaussianAttack(1e4), [7], rounds=4, executor="vectorized")
    wa, wb = tree_flatten_vector(a.server_state["w"]), tree_flatten_vector(b.server_state["w"])
    assert torch.allclose(wa, wb, atol=1e-12)


def test_nonfinite_messages_are_raised_on_or_excluded() -> None:
    """``nonfinite = "raise"`` names the workers; ``"exclude"`` sums the finite ones and, with
    nothing finite left, says so (pinned by mutation testing, frpg scope)."""
    nan, inf = float("nan"), float("inf")
    rows = {0: [1.0, 2.0, 0.5], 1: [nan, 0.0, 0.0], 2: [0.5, -1.0, 0.0], 3: [0.0, inf, 1.0]}
    replies = InMemoryReplies({k: {"g": torch.tensor(v, dtype=F64)} for k, v in rows.items()})
    with pytest.raises(FedriskError, match=re.escape("frpg: the messages g of workers [1, 3] contain NaN/inf")):
        frpg().message_sum(replies, 10.0, None)
    total = frpg(nonfinite="exclude").message_sum(replies, 10.0, None)
    assert total.tolist() == [1.5, 1.0, 0.5]  # workers 0 and 2, unprojected (norms < 10)
    one = InMemoryReplies(
        {0: {"g": torch.tensor([3.0, 4.0], dtype=F64)}, 1: {"g": torch.tensor([nan, 0.0], dtype=F64)}}
    )
    assert frpg(nonfinite="exclude").message_sum(one, 1.0, None).tolist() == pytest.approx([0.6, 0.8])  # projected
    none = InMemoryReplies({k: {"g": torch.tensor([nan, inf], dtype=F64)} for k in range(2)})
    with pytest.raises(FedriskError, match=r"^frpg: every message contains NaN/inf; nothing left to aggregate$"):
        frpg(nonfinite="exclude").message_sum(none, 1.0, None)


def test_lipschitz_warning_reads_the_data_bound() -> None:
    """The warning's bound is ``1 + max_i ||x_i||^2`` over every client's real rows (padding
    excluded), quoted in the message; silent at exactly a tenth of it and without data (pinned by
    mutation testing, frpg scope)."""
    import warnings

    rows = LocalData(
        torch.tensor([[1.0, 2.0], [0.5, 0.5], [9.0, 9.0]], dtype=F64), torch.tensor([0, 1, 0]), torch.tensor(2)
    )
    other = LocalData(torch.tensor([[0.0, 1.5]], dtype=F64), torch.tensor([1]), torch.tensor(1))
    fed = FedInfo(2, (2, 1), CLASSES)
    bound = 1.0 + 5.0  # ||(1, 2)||^2 = 5; the padded row (9, 9) does not count
    with pytest.warns(UserWarning) as record:
        frpg(lipschitz=0.5).check_data(fed, [rows, other])
    assert str(record[0].message) == (
        "frpg: lipschitz = 0.5 is below a tenth of max_i ||x_i||^2 + 1 = 6 of the training data (the paper's L_n "
        "for softmax regression); the worker steps 1/alpha_n of eq. (17) may be too long"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frpg(lipschitz=0.1 * bound).check_data(fed, [rows, other])  # at the limit
        empty = LocalData(torch.zeros(1, 2, dtype=F64), torch.tensor([0]), torch.tensor(0))
        frpg(lipschitz=0.15).check_data(FedInfo(1, (0,), CLASSES), [empty])  # no rows: the bound is 1


def test_the_pre_aggregation_f_bound_is_checked_against_the_workers() -> None:
    """``2 pre_f < n`` for both ``nnm`` and ``arc``; the bound itself is allowed."""
    data = [LocalData(torch.zeros(1, FEATURES, dtype=F64), torch.tensor([0]), torch.tensor(1))] * 5
    frpg(pre="nnm", pre_f=2).check_data(FedInfo(5, (1,) * 5, CLASSES), data)  # 4 < 5
    with pytest.raises(
        FedriskError,
        match=r"^algorithm.pre_f = 2 is not allowed with 4 workers: pre = 'arc' needs 2 pre_f < the number of workers$",
    ):
        frpg(pre="arc", pre_f=2).check_data(FedInfo(4, (1,) * 4, CLASSES), data[:4])


@pytest.mark.parametrize("cls", [FRPG, RSA, RobustSGD])
def test_zero_init_off_starts_from_the_models_init(cls) -> None:
    alg = cls(model=model(), loss=cross_entropy)
    assert all(float(p.abs().sum()) == 0 for p in alg.init_params(torch.Generator().manual_seed(0)).values())
    own = dataclasses.replace(alg, zero_init=False).init_params(torch.Generator().manual_seed(0))
    want = model().init_params(torch.Generator().manual_seed(0))
    assert all(torch.equal(own[k], want[k]) for k in want) and any(float(p.abs().sum()) > 0 for p in own.values())


def test_lambda_schedule_defaults_and_the_slot_numbering() -> None:
    from fedrisk.algorithms.frpg import frpg_lam

    assert frpg_lam(3, 2.0) == 2.0  # "constant" by default
    assert frpg_lam(3, 2.0, "geometric") == 2.0  # decay 1 by default
    with pytest.raises(FedriskError, match=r"^unknown lam_schedule 'sqrtt'. Did you mean 'sqrt'\? Valid choices: "):
        frpg_lam(1, 1.0, "sqrtt")
    with pytest.raises(FedriskError, match=r"^FRPG slots are numbered from 1; got k = 0$"):
        frpg_schedule(0, 0.1, 0.1, 1.0, 1.0)


def test_robust_sgd_buckets_with_the_rounds_generator() -> None:
    """``w_0 ← w_0 − η_k median(bucket means)``, the buckets drawn from the generator the round
    hands to ``aggregate`` (the aggregator's fixed fallback seed would bucket alike every round;
    pinned by mutation testing, frpg scope)."""
    from fedrisk.aggregators import CoordinateMedian

    alg = RobustSGD(model=model(), loss=cross_entropy, lr=0.5, aggregator=CoordinateMedian(pre="bucketing"))
    grads = [torch.tensor([float(k * k), float((-1) ** k * k), 1.0 / (k + 1)], dtype=F64) for k in range(6)]
    replies = InMemoryReplies({k: {"grad": {"w": g}} for k, g in enumerate(grads)})
    w = torch.tensor([0.3, -0.2, 1.0], dtype=F64)
    ctx = RoundContext(3, FedInfo(6, (10,) * 6, CLASSES))  # k = 4: η = 0.5 / 2
    results = []
    for seed in (1, 2):
        got = alg.aggregate(ctx, {"w": {"w": w}}, None, replies, torch.Generator().manual_seed(seed))["w"]["w"]
        perm = torch.randperm(6, generator=torch.Generator().manual_seed(seed)).tolist()
        means = torch.stack([(grads[perm[i]] + grads[perm[i + 1]]) / 2 for i in (0, 2, 4)])
        torch.testing.assert_close(got, w - 0.25 * means.sort(dim=0).values[1], rtol=1e-12, atol=1e-12)
        results.append(got)
    assert not torch.equal(results[0], results[1])  # the buckets (and the step) depend on the generator


@pytest.mark.parametrize("cls", [RSA, RobustSGD, FRPG, LFRPG])
def test_one_minibatch_per_slot_in_the_configured_sampling(cls) -> None:
    """RSA, RobustSGD and FRPG draw one minibatch a round, LFRPG one per slot (T = 2 here);
    ``shuffle`` draws distinct rows within an epoch."""
    ctx = RoundContext(0, FedInfo(2, (5, 5), CLASSES))
    slots = {"local_slots_per_round": 2} if cls is LFRPG else {}
    for sampling in ("shuffle", "with_replacement"):
        alg = cls(model=model(), loss=cross_entropy, batch_size=5, sampling=sampling, **slots)
        batches = alg.draw(ctx, 0, 5, client_generator(0, round=0, client=0))["batches"]
        assert batches.shape == (2 if slots else 1, 5)
        if sampling == "shuffle":
            assert all(sorted(b.tolist()) == [0, 1, 2, 3, 4] for b in batches)
    repeated = [
        len(
            set(
                cls(model=model(), loss=cross_entropy, batch_size=5)
                .draw(ctx, 0, 5, client_generator(s, round=0, client=0))["batches"][0]
                .tolist()
            )
        )
        < 5
        for s in range(5)
    ]
    assert any(repeated)  # with replacement repeats rows (the check above can tell the two apart)


# ----------------------------------------------------------------------------- full-batch mode (7.2.6-7.2.8)
def uneven_federation() -> Federation:
    """The blob federation with clients of 7..30 rows (the vectorised executor pads the smaller ones)."""
    fed = federation()
    clients = [Samples(c.x[: 30 - 3 * k], c.y[: 30 - 3 * k]) for k, c in enumerate(fed.clients)]
    return Federation("uneven", clients, num_classes=CLASSES, test=fed.test)


def test_full_batch_slot_uses_the_whole_local_objective() -> None:
    alg, fed = frpg(full_batch=True), federation(2)
    ctx = RoundContext(4, FedInfo(2, (30, 30), CLASSES))  # slot k = 5
    params = {
        k: torch.randn(v.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        for k, v in alg.init_params(torch.Generator()).items()
    }
    state = {"w": params, "v": {k: 0.5 * v for k, v in params.items()}}
    payload = {"w0": {k: 0.1 - v for k, v in params.items()}}
    data = LocalData(fed.clients[1].x, fed.clients[1].y, torch.tensor(30))
    draws = alg.draw(ctx, 1, 30, client_generator(0, round=4, client=1))
    assert draws == {}  # nothing random in a full-batch slot
    out = alg.client_update(ctx, payload, state, data, draws)
    beta, _, alpha = alg.schedule(5)
    w, v, w0 = (tree_flatten_vector(t) for t in (state["w"], state["v"], payload["w0"]))
    u = (1 - beta) * w + beta * v
    sizes = [p.numel() for p in params.values()]
    pieces = zip(params, torch.split(u, sizes))
    leaves = {k: t.reshape(params[k].shape).detach().requires_grad_(True) for k, t in pieces}
    loss = cross_entropy(alg.model.apply(leaves, data.x), data.y)  # mean over all 30 rows
    s = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(leaves.values()))]) + alg.delta * u
    w_ref, g_ref, v_ref = frpg_worker_slot(u, v, w0, s, alpha, beta, alg.delta, alg.lam, alg.mu)
    assert torch.allclose(out.reply["g"], g_ref, atol=1e-12)
    assert torch.allclose(tree_flatten_vector(out.state["w"]), w_ref, atol=1e-12)
    assert torch.allclose(tree_flatten_vector(out.state["v"]), v_ref, atol=1e-12)
    assert float(out.metrics["loss"]) == pytest.approx(float(loss.detach()), abs=1e-12)


def _run_uneven(alg, executor, seed: int = 0, rounds: int = 4) -> Simulation:
    sim = Simulation(alg, uneven_federation(), dtype=F64, seed=seed, executor=executor)
    for _ in range(rounds):
        sim.step()
    return sim


@pytest.mark.parametrize("variant", ["frpg", "lfrpg-seq", "lfrpg-lit"])
def test_full_batch_vectorized_equals_sequential_on_unequal_clients(variant: str) -> None:
    def make():
        if variant == "frpg":
            return frpg(full_batch=True)
        return LFRPG(
            model=model(),
            loss=cross_entropy,
            lipschitz=10.0,
            local_slots_per_round=3,
            variant=variant.split("-")[1],
            full_batch=True,
        )

    a = _run_uneven(make(), "sequential")
    for block in (None, 3):
        b = _run_uneven(make(), VectorizedExecutor(block_size=block))
        for key in ("w", "v"):
            assert torch.allclose(
                tree_flatten_vector(a.server_state[key]),
                tree_flatten_vector(b.server_state[key]),
                rtol=1e-9,
                atol=1e-12,
            )
        for k in range(8):
            assert torch.allclose(
                tree_flatten_vector(a.client_states[k]["v"]),
                tree_flatten_vector(b.client_states[k]["v"]),
                rtol=1e-9,
                atol=1e-12,
            )


def test_full_batch_is_deterministic_and_differs_from_minibatches() -> None:
    a = _run_uneven(frpg(full_batch=True), "sequential", seed=0)
    b = _run_uneven(frpg(full_batch=True), "sequential", seed=5)
    c = _run_uneven(frpg(batch_size=4), "sequential", seed=0)
    wa, wb, wc = (tree_flatten_vector(s.server_state["v"]) for s in (a, b, c))
    assert torch.equal(wa, wb)  # no draw: the seed does not matter without an attack
    assert float(torch.linalg.vector_norm(wa - wc)) > 1e-3


def test_a_lipschitz_far_below_the_data_bound_is_warned_about() -> None:
    fed = federation()  # blobs: max ||x||^2 + 1 is far above 1
    with pytest.warns(UserWarning, match=r"lipschitz = 1 is below a tenth of max_i \|\|x_i\|\|\^2 \+ 1"):
        Simulation(frpg(lipschitz=1.0), fed, dtype=F64)
    bound = 1 + max(float((c.x**2).sum(1).max()) for c in fed.clients)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Simulation(frpg(lipschitz=bound), fed, dtype=F64)


@pytest.mark.parametrize("name", ["digits", "mnist5k", "mnist5k_omniscient", "fmnist", "fmnist_short"])
def test_byzantine_configs_set_lipschitz_in_every_frpg_variant(name: str) -> None:
    from pathlib import Path

    from fedrisk.experiment.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "byzantine" / f"{name}.toml")
    variants = {k: v for k, v in cfg["sweep.variants"].items() if v.get("algorithm.name") in ("frpg", "lfrpg")}
    assert set(variants) == {"frpg", "lfrpg"}
    for v in variants.values():
        assert v["algorithm.lipschitz"] > 10  # max ||x||^2 + 1 of the data, not the default 1.0


def test_robust_sgd_step_size_decays_as_lr_over_sqrt_k() -> None:
    # pinned by mutation testing (frpg scope): the decay's form, its offset and its switch survived
    info = FedInfo(2, (1, 1), 3)
    sqrt_decay = RobustSGD(model=model(), loss=cross_entropy, lr=3.0)
    constant = RobustSGD(model=model(), loss=cross_entropy, lr=3.0, lr_decay="constant")
    for r in (0, 3, 8):
        k = r + 1  # the paper's iteration k starts at 1
        assert sqrt_decay.step_size(RoundContext(r, info)) == pytest.approx(3.0 / k**0.5, abs=1e-12)
        assert constant.step_size(RoundContext(r, info)) == 3.0
