"""CODA / CODA+ / NPA / CODASCA (spec 000_codasca.md §7.1 items 4-7, §7.2, a stochastic
class-split run, the options of the official code and the bad-input contract).

The deterministic checks run in float64 and pin equalities to 1e-12.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms import ALGORITHMS
from fedrisk.algorithms.base import FedInfo, LocalData, RoundContext
from fedrisk.algorithms.codasca import CODA, CODASCA, NPA, CODAPlus, SingleClassClientWarning
from fedrisk.algorithms.primal_dual import control_variate_difference, control_variate_mean, local_sgda
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.sources.synthetic import class_split_auc_federation
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.auc import (
    auc_dual_closed_form_direction,
    auc_label_weights,
    auc_margin_minmax,
    auc_minmax_weighted,
    auc_square_minmax,
    optimal_dual,
)
from fedrisk.rng import client_generator, generator, server_generator
from fedrisk.runtime.evaluation import score_split
from fedrisk.runtime.simulation import Simulation, fed_info, local_data
from fedrisk.tree import tree_flatten_vector, tree_map

F64 = torch.float64
TOL = 1e-12


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_fed(num_clients: int = 4, seed: int = 0, dim: int = 6) -> Federation:
    """A class-split AUC federation: client k holds one negative and one positive cluster."""
    return class_split_auc_federation(
        num_clients,
        seed=seed,
        num_neg_classes=num_clients,
        num_pos_classes=num_clients,
        dim=dim,
        neg_per_class=30,
        test_per_class=20,
    )


def mlp(dim: int = 6, hidden: int = 5, activation: str | None = "sigmoid") -> FunctionalModel:
    return FunctionalModel(build_model("mlp", (dim,), 1, hidden=[hidden], output_activation=activation))


def sim_of(alg: Any, fed: Federation | None = None, seed: int = 0, **kw: Any) -> Simulation:
    return Simulation(alg, fed if fed is not None else small_fed(), seed=seed, dtype=F64, **kw)


def flat(state: dict) -> Tensor:
    """The server iterate (v, α) as one vector."""
    return torch.cat([tree_flatten_vector(state["v"]), state["alpha"].reshape(1)])


def max_diff(a: Any, b: Any) -> float:
    return float((tree_flatten_vector(a) - tree_flatten_vector(b)).abs().max())


def directions_on_trees(alg: CODAPlus, state: dict, data: LocalData, draws: dict, v: dict, alpha: Tensor) -> tuple:
    """One step's (loss, ∇_v F as a tree like v, ∇_α F) from the algorithm's objective hook."""
    leaves, spec = pytree.tree_flatten(v)
    value, g_v, g_a = alg.objective_directions(state, data, draws, v, alpha)(0, leaves, [alpha])
    return value, pytree.tree_unflatten(g_v, spec), g_a[0]


# --------------------------------------------------------------------------------------------
# registration, schedule, the objective in the local loop
# --------------------------------------------------------------------------------------------


def test_registered() -> None:
    assert ALGORITHMS.get("coda") is CODA
    assert ALGORITHMS.get("codaplus") is CODAPlus
    assert ALGORITHMS.get("npa") is NPA
    assert ALGORITHMS.get("codasca") is CODASCA
    assert CODASCA(model=None).stage_output == "random" and CODAPlus(model=None).stage_output == "average"


def test_schedule_fixed_window_and_lr_decay() -> None:
    alg = CODAPlus(model=None, lr=0.3, window=2, stage_iters=5)  # R = ceil(5 / 2) = 3 windows per stage
    slots = [alg.schedule(r) for r in range(7)]
    assert [s.stage for s in slots] == [0, 0, 0, 1, 1, 1, 2]
    assert [s.index for s in slots] == [0, 1, 2, 0, 1, 2, 0]
    assert [s.kind for s in slots] == ["train", "train", "stage_end"] * 2 + ["train"]
    assert {s.steps for s in slots} == {2}
    assert [s.lr for s in slots] == [0.3] * 3 + [0.3 / 3] * 3 + [0.3 / 9]


def test_schedule_growing_window_keeps_rounds_per_stage() -> None:
    """Theorem 2's schedule: R fixed, I_s = I_0 g^s, η_s = η / d^s."""
    alg = CODASCA(model=None, lr=0.8, window=2, window_growth=2.0, lr_decay=2.0, stage_iters=4)
    assert alg.rounds_per_stage() == 2
    assert [alg.schedule(r).steps for r in range(6)] == [2, 2, 4, 4, 8, 8]
    assert [alg.schedule(r).lr for r in range(6)] == [0.8, 0.8, 0.4, 0.4, 0.2, 0.2]
    endless = CODAPlus(model=None, window=3, stage_iters=None)
    assert endless.schedule(1000) == (0, 1000, 3, 0.1, "train")


def test_schedule_coda_adds_a_dual_reset_round_per_stage() -> None:
    alg = CODA(model=None, window=2, stage_iters=4)
    assert [alg.schedule(r).kind for r in range(7)] == [
        "train", "stage_end", "dual_reset", "train", "stage_end", "dual_reset", "train",
    ]  # fmt: skip
    assert alg.schedule(2).steps == 0 and alg.schedule(3).stage == 1


@pytest.mark.parametrize("margin", [None, 0.7])
def test_weighted_objective_equals_the_auc_module(margin: float | None) -> None:
    """The local loop's form of eq. (2) / AUCM has the values and gradients of fedrisk.objectives.auc."""
    g = torch.Generator().manual_seed(3)
    h = torch.rand(12, generator=g, dtype=F64)
    y = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0])
    p = torch.tensor(0.3, dtype=F64)
    w = auc_label_weights(y, p)
    x0 = torch.cat([h, torch.tensor([0.4, 0.2, 0.3], dtype=F64)])

    def mine(z: Tensor) -> Tensor:
        return auc_minmax_weighted(z[:12], z[12], z[13], z[14], w, margin)

    def theirs(z: Tensor) -> Tensor:
        if margin is None:
            return auc_square_minmax(z[:12], y, z[12], z[13], z[14], p)
        return auc_margin_minmax(z[:12], y, z[12], z[13], z[14], p, margin)

    assert abs(float(mine(x0) - theirs(x0))) < TOL
    assert float((torch.func.grad(mine)(x0) - torch.func.grad(theirs)(x0)).abs().max()) < TOL


def test_saddle_point_directions_vanish() -> None:
    """§1.4 / §7.1-2 through the algorithm's own directions: with p = the batch's positive
    ratio, ∇_a, ∇_b, ∇_α vanish at a* = mean(h|+), b* = mean(h|−), α* = b* − a*, and the value
    is p(1−p)(mean over (+, −) pairs of (1 − h⁺ + h⁻)² − 1)."""
    fed = small_fed()
    alg = CODAPlus(model=mlp(), positive_ratio="client", prox_coef=0.0)
    sim = sim_of(alg, fed)
    data, state = sim.data[0], sim.client_states[0]
    n = int(data.size)
    params = sim.server_state["v"]["model"]
    h = alg.scores(params, data.x)
    pos = data.y == 1
    a, b = h[pos].mean(), h[~pos].mean()
    alpha = optimal_dual(h, data.y)
    assert abs(float(alpha - (b - a))) < TOL
    rows = {"batches": torch.arange(n)[None, :]}  # the whole client as one batch
    value, g_v, g_a = directions_on_trees(alg, state, data, rows, {"model": params, "a": a, "b": b}, alpha)
    assert max(abs(float(g_v["a"])), abs(float(g_v["b"])), abs(float(g_a))) < TOL
    p = float(state["p"])
    pairs = (1 - h[pos][:, None] + h[~pos][None, :]) ** 2
    assert abs(float(value) - p * (1 - p) * (float(pairs.mean()) - 1)) < TOL


# --------------------------------------------------------------------------------------------
# §7.1-4 and 5: control variates
# --------------------------------------------------------------------------------------------


def test_eq6_equals_eq7_for_any_gradient_sequence() -> None:
    """Eq. (6) ≡ eq. (7): the difference form equals the mean of the directions used."""
    g = torch.Generator().manual_seed(0)
    steps, lr = 7, 0.03
    grads = torch.randn(steps, 5, generator=g, dtype=F64)
    dual_grads = torch.randn(steps, generator=g, dtype=F64)
    v0, a0 = torch.randn(5, generator=g, dtype=F64), torch.tensor(0.2, dtype=F64)
    ref = torch.randn(5, generator=g, dtype=F64)
    c_k, c = torch.randn(5, generator=g, dtype=F64), torch.randn(5, generator=g, dtype=F64)
    ca_k, ca = torch.tensor(0.3, dtype=F64), torch.tensor(-0.1, dtype=F64)

    def directions(t: int, v: list[Tensor], alpha: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        x, a = v[0], alpha[0]
        return x.sum(), [grads[t] + 0.1 * x * a], [dual_grads[t] - x.sum()]  # any sequence

    kw: dict[str, Any] = {
        "prox_coef": 0.05,
        "ref": ref,
        "weight_decay": 0.01,
        "shift_v": c - c_k,
        "shift_alpha": ca - ca_k,
    }
    run = local_sgda(directions, v0, a0, steps, lr, sum_directions=True, **kw)
    eq6_v = control_variate_difference(c_k, c, v0, run.v, steps, lr)
    eq6_a = control_variate_difference(ca_k, ca, a0, run.alpha, steps, lr, ascent=True)
    assert run.direction_sum is not None
    assert float((eq6_v - control_variate_mean(run.direction_sum[0], steps)).abs().max()) < TOL
    assert abs(float(eq6_a - control_variate_mean(run.direction_sum[1], steps))) < TOL
    fused = local_sgda(directions, v0, a0, steps, lr, **kw)  # the fused form: the same iterates
    assert float((fused.v - run.v).abs().max()) < TOL and abs(float(fused.alpha - run.alpha)) < TOL


def test_eq6_equals_eq7_in_codasca_runs() -> None:
    fed = small_fed()
    common = {
        "model": mlp(),
        "lr": 0.2,
        "window": 3,
        "stage_iters": 9,
        "batch_size": 8,
        "reset_control_variates": False,
    }
    a = sim_of(CODASCA(control_variate="difference", **common), fed)
    b = sim_of(CODASCA(control_variate="gradient_mean", **common), fed)
    for _ in range(7):  # across a stage boundary (lr decay, new prox reference)
        a.step(), b.step()
        for k in range(fed.num_clients):
            assert max_diff(a.client_states[k]["c_v"], b.client_states[k]["c_v"]) < TOL
            assert abs(float(a.client_states[k]["c_alpha"] - b.client_states[k]["c_alpha"])) < TOL
        assert float((flat(a.server_state) - flat(b.server_state)).abs().max()) < TOL


@pytest.mark.parametrize("reset", [True, False])
def test_corrections_have_zero_mean_after_every_communication(reset: bool) -> None:
    """Σ_k (c − c^k) = 0: the server's c is the mean of the clients' c^k after every round."""
    fed = small_fed()
    alg = CODASCA(model=mlp(), lr=0.2, window=2, stage_iters=4, batch_size=8, reset_control_variates=reset)
    sim = sim_of(alg, fed)
    saw_nonzero = False
    for _ in range(6):
        report = sim.step()
        for key in ("c_v", "c_alpha"):
            c = tree_flatten_vector(sim.server_state[key]) if key == "c_v" else sim.server_state[key].reshape(1)
            total = sum(
                c - (tree_flatten_vector(s[key]) if key == "c_v" else s[key].reshape(1))
                for s in sim.client_states.values()
            )
            assert float(total.abs().max()) < TOL
        nonzero = float(tree_flatten_vector(sim.server_state["c_v"]).abs().max()) > 0
        saw_nonzero |= nonzero
        if report.kind == "stage_end":  # Alg. 4 restarts the next stage with c = c^k = 0
            assert nonzero is not reset
    assert saw_nonzero


# --------------------------------------------------------------------------------------------
# §7.1-6 and 7: equivalences and degenerate cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage_output", ["average", "random"])
def test_codasca_with_window_one_equals_codaplus(stage_output: str) -> None:
    """CODASCA(I = 1, η_g = 1) and CODA+(I = 1): identical global iterates (to float64
    rounding) through three stages, and the same AUROC."""
    fed = small_fed()
    common = {"model": mlp(), "lr": 0.3, "window": 1, "stage_iters": 4, "batch_size": 8, "stage_output": stage_output}
    a, b = sim_of(CODASCA(global_lr=1.0, **common), fed), sim_of(CODAPlus(**common), fed)
    for _ in range(12):
        a.step(), b.step()
        assert float((flat(a.server_state) - flat(b.server_state)).abs().max()) < TOL
    assert float(tree_flatten_vector(a.server_state["c_v"]).abs().max()) > 0  # kept across stages
    test = a.federation.test
    auc_a = score_split(a.algorithm, a.algorithm.global_params(a.server_state), test, ["auroc"])["auroc"]
    auc_b = score_split(b.algorithm, b.algorithm.global_params(b.server_state), test, ["auroc"])["auroc"]
    assert auc_a == auc_b


def reference_dsg_plus(alg: CODAPlus, fed: Federation, seed: int, stages: int) -> tuple[dict, Tensor]:
    """Alg. 1 + Alg. 2 transcribed step by step (t = 0..T−1, averaging when (t+1) mod I = 0,
    output = the time-and-client average), with eq. (2) from fedrisk.objectives.auc and
    torch.autograd, on the minibatches the algorithm draws in the matching rounds."""
    fed64 = fed.to(F64)
    data = [local_data(c) for c in fed64.clients]
    K, I = fed.num_clients, alg.window
    params = tree_map(lambda x: x.to(F64), alg.init_params(generator(seed, "init")))
    zero = torch.zeros((), dtype=F64)
    v0: dict[str, Any] = {"model": params, "a": zero, "b": zero}
    alpha0 = zero
    p = sum(float((d.y == 1).double().mean()) for d in data) / K
    rnd = 0
    for s in range(stages):
        lr = alg.lr / alg.lr_decay**s
        T = alg.rounds_per_stage() * I
        vk, ak = [v0] * K, [alpha0] * K
        sum_v, sum_a = tree_map(torch.zeros_like, v0), zero
        idx: list[Tensor] = []
        for t in range(T):
            if t % I == 0:
                ctx = RoundContext(rnd, fed_info(fed64))
                idx = [alg.draw(ctx, k, int(data[k].size), client_generator(seed, rnd, k))["batches"] for k in range(K)]
            for k in range(K):
                rows = idx[k][t % I]
                leaves = {**vk[k], "alpha": ak[k]}
                leaves = tree_map(lambda x: x.detach().requires_grad_(True), leaves)
                h = alg.model.apply(leaves["model"], data[k].x[rows])[:, 0]
                F = auc_square_minmax(h, data[k].y[rows], leaves["a"], leaves["b"], leaves["alpha"], p)
                flat_leaves = [*leaves["model"].values(), leaves["a"], leaves["b"], leaves["alpha"]]
                grads = torch.autograd.grad(F, flat_leaves)
                gm = dict(zip(leaves["model"], grads[:-3]))
                gv = {"model": gm, "a": grads[-3], "b": grads[-2]}
                vk[k] = tree_map(
                    lambda x, gx, r, lr=lr: (x - lr * (gx + alg.prox_coef * (x - r))).detach(), vk[k], gv, v0
                )
                ak[k] = (ak[k] + lr * grads[-1]).detach()
            if (t + 1) % I == 0:
                mean_v = tree_map(lambda *xs: sum(xs) / K, *vk)
                mean_a = sum(ak) / K
                vk, ak = [mean_v] * K, [mean_a] * K
                rnd += 1
            sum_v = tree_map(lambda acc, *xs: acc + sum(xs) / K, sum_v, *vk)
            sum_a = sum_a + sum(ak) / K
        v0, alpha0 = tree_map(lambda x, T=T: x / T, sum_v), sum_a / T
    return v0, alpha0


@pytest.mark.parametrize(("num_clients", "window", "stage_iters"), [(1, 1, 3), (1, 3, 6), (3, 4, 4)])
def test_codaplus_matches_algorithm_two(num_clients: int, window: int, stage_iters: int) -> None:
    """K = 1: CODA+ is single-machine PPD-SG for any I; K = 3 with I = T: one averaging at the
    end of each stage.  Both against the step-by-step transcription, through two stages."""
    fed = small_fed(num_clients=max(num_clients, 2))
    fed = Federation("sub", fed.clients[:num_clients], 2, test=fed.test)
    alg = CODAPlus(model=mlp(), lr=0.3, window=window, stage_iters=stage_iters, batch_size=8)
    sim = sim_of(alg, fed)
    for _ in range(2 * alg.rounds_per_stage()):
        sim.step()
    v, alpha = reference_dsg_plus(alg, fed, seed=0, stages=2)
    assert max_diff(sim.server_state["v"], v) < TOL
    assert abs(float(sim.server_state["alpha"] - alpha)) < TOL


def test_global_lr_one_is_the_plain_mean_and_otherwise_extrapolates() -> None:
    fed = small_fed()
    info = fed_info(fed)
    for eta in (1.0, 1.5):
        alg = CODASCA(model=mlp(), global_lr=eta, stage_iters=None)
        sim = sim_of(alg, fed)
        state = sim.server_state
        ctx = RoundContext(0, info)
        plan = alg.configure(ctx, state, torch.Generator())
        g = torch.Generator().manual_seed(1)
        replies = {
            k: {
                "v": tree_map(lambda x, g=g: x + torch.randn(x.shape, generator=g, dtype=F64), state["v"]),
                "alpha": torch.randn((), generator=g, dtype=F64),
                "c_v": tree_map(torch.zeros_like, state["v"]),
                "c_alpha": torch.zeros((), dtype=F64),
            }
            for k in range(fed.num_clients)
        }
        new = alg.aggregate(ctx, state, plan, InMemoryReplies(replies), torch.Generator())
        mean = InMemoryReplies(replies).mean("v")
        expected = tree_map(lambda prev, m, eta=eta: prev + eta * (m - prev), state["v"], mean)
        if eta == 1.0:
            assert all(torch.equal(x, y) for x, y in zip(tree_flatten_vector(new["v"]), tree_flatten_vector(mean)))
        assert max_diff(new["v"], expected) < TOL


def test_npa_is_codaplus_with_window_one() -> None:
    fed = small_fed()
    kw = {"model": mlp(), "lr": 0.3, "stage_iters": 3, "batch_size": 16}
    a, b = sim_of(NPA(**kw), fed), sim_of(CODAPlus(window=1, **kw), fed)
    for _ in range(4):
        a.step(), b.step()
    assert torch.equal(flat(a.server_state), flat(b.server_state))
    with pytest.raises(FedriskError, match="window must be 1"):
        NPA(model=None, window=2)


# --------------------------------------------------------------------------------------------
# communication, stage outputs, CODA's dual reset, the code's options
# --------------------------------------------------------------------------------------------


def test_codasca_moves_twice_the_bytes_of_codaplus() -> None:
    fed = small_fed()
    kw = {"model": mlp(), "window": 2, "stage_iters": 6, "batch_size": 8}
    a, b = sim_of(CODASCA(stage_output="last", **kw), fed), sim_of(CODAPlus(stage_output="last", **kw), fed)
    for _ in range(2):
        a.step(), b.step()
    n = sum(x.numel() for x in a.algorithm.init_params(torch.Generator()).values()) + 3  # w, a, b, α
    for r in range(2):
        for k in range(fed.num_clients):
            assert b.ledger.rounds[r]["down"][k] == b.ledger.rounds[r]["up"][k] == 8 * n
            assert a.ledger.rounds[r]["down"][k] == a.ledger.rounds[r]["up"][k] == 16 * n


def test_codaplus_stage_end_uploads_the_iterate_sums_once() -> None:
    fed = small_fed()
    sim = sim_of(CODAPlus(model=mlp(), window=2, stage_iters=4, batch_size=8), fed)
    ups = [sim.step().bytes_up for _ in range(4)]
    assert ups[1] == ups[3] == 2 * ups[0] and ups[2] == ups[0]


def test_stage_output_random_is_an_iterate_of_the_stage() -> None:
    """Alg. 4's output: the server iterate after a uniformly drawn window r̃ of the stage; it
    restarts the next stage and is its prox reference."""
    fed = small_fed()
    picks = set()
    for seed in range(4):
        sim = sim_of(CODASCA(model=mlp(), lr=0.2, window=2, stage_iters=8, batch_size=8), fed, seed=seed)
        iterates = []
        for _ in range(4):  # R = 4 windows
            sim.step()
            iterates.append(flat(sim.server_state))
        pick = int(sim.server_state["pick"])
        picks.add(pick)
        if pick < 3:  # (the last window's own iterate is replaced by the output at the stage end)
            assert torch.equal(flat(sim.server_state), iterates[pick])
        start = flat(sim.server_state)
        assert torch.equal(start, flat(sim.server_state["candidate"]))
        sim.step()
        assert torch.equal(tree_flatten_vector(sim.client_states[0]["ref"]), start[:-1])
    assert len(picks) > 1


def test_stage_outputs_restart_points() -> None:
    """average: Alg. 2's output; last: the last server iterate; last_global_average_ref: continue
    from the last iterate with the prox reference on the cross-client stage average."""
    fed = small_fed()
    kw = {"model": mlp(), "lr": 0.2, "window": 2, "stage_iters": 4, "batch_size": 8}
    outputs = ("average", "last", "last_global_average_ref")
    runs = {out: sim_of(CODAPlus(stage_output=out, **kw), fed) for out in outputs}
    for s in runs.values():
        for _ in range(2):
            s.step()
    avg, last = runs["average"].server_state, runs["last"].server_state
    mixed = runs["last_global_average_ref"].server_state
    assert torch.equal(flat(last), flat(mixed))
    assert max_diff(mixed["ref"], avg["v"]) < TOL
    assert max_diff(avg["v"], last["v"]) > 1e-6
    # the next stage's clients take the reference from the broadcast
    runs["last_global_average_ref"].step()
    assert max_diff(runs["last_global_average_ref"].client_states[0]["ref"], avg["v"]) < TOL
    runs["average"].step()
    assert max_diff(runs["average"].client_states[0]["ref"], avg["v"]) < TOL


@pytest.mark.parametrize("auc_loss", ["square", "margin"])
def test_coda_dual_reset_is_the_pooled_optimal_dual(auc_loss: str) -> None:
    fed = small_fed()
    alg = CODA(model=mlp(), lr=0.2, window=2, stage_iters=4, batch_size=8, reset_batch_size=50, auc_loss=auc_loss)
    sim = sim_of(alg, fed)
    sim.step(), sim.step()
    before = {k: v for k, v in sim.server_state.items()}
    report = sim.step()
    assert report.kind == "dual_reset"
    assert torch.equal(flat(sim.server_state)[:-1], flat(before)[:-1])  # only α changes
    ctx = RoundContext(2, sim.info, "dual_reset")
    hs, ys = [], []
    for k in range(fed.num_clients):
        rows = alg.draw(ctx, k, int(sim.data[k].size), client_generator(0, 2, k))["batch"]
        hs.append(alg.scores(before["v"]["model"], sim.data[k].x[rows]))
        ys.append(sim.data[k].y[rows])
    h, y = torch.cat(hs), torch.cat(ys)
    expected = optimal_dual(h, y, margin=alg.margin if auc_loss == "margin" else None)
    assert abs(float(sim.server_state["alpha"] - expected)) < TOL
    assert sim.step().kind == "train"


def test_closed_form_dual_direction_and_clipping() -> None:
    fed = small_fed()
    for auc_loss, m in (("square", 0.0), ("margin", 0.8)):
        alg = CODAPlus(model=mlp(), dual_direction="closed_form", auc_loss=auc_loss, margin=m or 1.0, grad_clip=1e-4)
        sim = sim_of(alg, fed)
        data, state = sim.data[0], sim.client_states[0]
        v = {**sim.server_state["v"], "a": torch.tensor(0.6, dtype=F64), "b": torch.tensor(0.2, dtype=F64)}
        alpha = torch.tensor(0.3, dtype=F64)
        rows = {"batches": torch.arange(int(data.size))[None, :]}  # both classes
        _, g_v, g_a = directions_on_trees(alg, state, data, rows, v, alpha)
        h = alg.scores(v["model"], data.x)
        expected = auc_dual_closed_form_direction(h, data.y, v["a"], v["b"], alpha, m)
        assert abs(float(g_a - expected)) < TOL and abs(float(g_a - (2 * (m + 0.2 - 0.6) - 0.6))) < TOL
        plain = CODAPlus(model=alg.model, auc_loss=auc_loss, margin=m or 1.0)
        unclipped = directions_on_trees(plain, state, data, rows, v, alpha)[1]
        assert max_diff(g_v["model"], tree_map(lambda u: u.clamp(-1e-4, 1e-4), unclipped["model"])) == 0
        assert float(tree_flatten_vector(unclipped["model"]).abs().max()) > 1e-4  # clipping was active
        assert float(g_v["a"]) == float(unclipped["a"]) and abs(float(g_v["a"])) > 1e-4  # a, b: not clipped


def test_weight_decay_and_prox_in_one_step() -> None:
    """v_1 = v_0 − η(∇_v F + λ(v_0 − v_ref) + wd·v_0 + c − c^k), α_1 = α_0 + η(∇_α F + c_α − c_α^k)."""
    v0, a0, ref = (
        torch.tensor([1.0, -2.0], dtype=F64),
        torch.tensor(0.5, dtype=F64),
        torch.tensor([0.5, 0.5], dtype=F64),
    )
    g, ga = torch.tensor([0.3, 0.1], dtype=F64), torch.tensor(-0.2, dtype=F64)
    s, sa = torch.tensor([0.05, -0.02], dtype=F64), torch.tensor(0.01, dtype=F64)
    out = local_sgda(
        lambda t, v, a: (v[0].sum(), [g], [ga]),
        v0,
        a0,
        1,
        0.1,
        prox_coef=0.2,
        ref=ref,
        weight_decay=0.01,
        shift_v=s,
        shift_alpha=sa,
    )
    expected = v0 - 0.1 * (g + 0.2 * (v0 - ref) + 0.01 * v0 + s)
    assert float((out.v - expected).abs().max()) < 1e-15
    assert abs(float(out.alpha - (a0 + 0.1 * (ga + sa)))) < 1e-15


def test_margin_loss_keeps_the_dual_nonnegative() -> None:
    fed = small_fed()
    sim = sim_of(CODASCA(model=mlp(), auc_loss="margin", lr=0.5, window=4, stage_iters=None, batch_size=8), fed)
    for _ in range(5):
        sim.step()
        assert float(sim.server_state["alpha"]) >= 0


def test_predict_scores_and_the_sigmoid_option() -> None:
    fed = small_fed()
    logits = FunctionalModel(build_model("mlp", (6,), 1, hidden=[5]))
    alg = CODAPlus(model=logits, sigmoid=True)
    sim = sim_of(alg, fed)
    params = alg.global_params(sim.server_state)
    assert sorted(params) == ["a", "alpha", "b", "model"]
    scores = alg.predict(params, fed.test.x.to(F64))
    raw = logits.apply(params["model"], fed.test.x.to(F64))[:, 0]
    assert scores.shape == (len(fed.test),) and torch.equal(scores, torch.sigmoid(raw))
    multi = CODAPlus(model=FunctionalModel(build_model("mlp", (6,), 2, hidden=[5])))
    with pytest.raises(FedriskError, match="one-output scorer"):
        sim_of(multi, fed).step()


def test_vectorized_executor_matches_sequential() -> None:
    vectorized = pytest.importorskip("fedrisk.runtime.vectorized")
    fed = small_fed()
    for alg in (
        CODASCA(model=mlp(), lr=0.2, window=2, stage_iters=4, batch_size=8, control_variate="gradient_mean"),
        CODA(model=mlp(), lr=0.2, window=2, stage_iters=4, batch_size=8, reset_batch_size=20, auc_loss="margin"),
        CODAPlus(model=mlp(), lr=0.2, window=2, stage_iters=4, batch_size=8, dual_direction="closed_form"),
    ):
        seq = sim_of(alg, fed)
        vec = sim_of(alg, fed, executor=vectorized.VectorizedExecutor(block_size=3))
        for _ in range(4):
            assert seq.step().kind == vec.step().kind
            assert float((flat(seq.server_state) - flat(vec.server_state)).abs().max()) < 1e-9


# --------------------------------------------------------------------------------------------
# §7.2: the deterministic heterogeneous saddle-point toy (client drift, exact gradients)
# --------------------------------------------------------------------------------------------

TOY_K, TOY_D, TOY_MU = 8, 10, 0.5


def toy_game(seed: int = 0) -> tuple[Tensor, Tensor]:
    """f_k(v, α) = ½ vᵀA_k v − b_kᵀv + α c_kᵀv − (μ/2)α²; per client the matrix
    M_k = [[A_k, c_k], [c_kᵀ, −μ]] and rhs [b_k; 0] (so ∇f_k = M_k [v; α] − rhs, whose last
    entry is the ascent direction ∂f_k/∂α); and the global saddle point."""
    g = torch.Generator().manual_seed(seed)
    K, d = TOY_K, TOY_D
    Q = torch.randn(K, d, d, generator=g, dtype=F64)
    A = 0.5 * torch.eye(d, dtype=F64) + 0.5 * Q @ Q.transpose(1, 2) / d
    b = 3 * torch.randn(K, d, generator=g, dtype=F64)
    c = torch.randn(K, d, generator=g, dtype=F64)
    M = torch.zeros(K, d + 1, d + 2, dtype=F64)
    M[:, :d, :d], M[:, :d, d], M[:, d, :d], M[:, d, d] = A, c, c, -TOY_MU
    M[:, :d, d + 1] = b
    saddle = torch.linalg.solve(M[:, :, : d + 1].mean(0), M[:, :, d + 1].mean(0))
    return M, saddle


class ToyGame:
    """The §7.2 game through the family's hooks: primal v (a [d] tensor), dual α, the client's
    data row block ``x = [M_k | rhs_k]``; exact gradients (no minibatches)."""

    def check(self, fed: FedInfo) -> None: ...

    def init_primal(self, params: Tensor) -> Tensor:
        return params

    def init_objective_state(self, ctx: RoundContext, client: int, params: Tensor) -> dict:
        return {}

    def draw(self, ctx: RoundContext, client: int, num_samples: int, gen: torch.Generator) -> dict:
        return {}

    def objective_directions(self, state: dict, data: LocalData, draws: dict, v: Tensor, alpha: Tensor) -> Any:
        M, rhs = data.x[..., : TOY_D + 1], data.x[..., TOY_D + 1]
        zero = torch.zeros((), dtype=F64)

        def directions(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
            z = torch.cat([xs[0], ys[0].unsqueeze(-1)], -1)  # v is one [d] leaf, α one scalar leaf
            grad = (M @ z.unsqueeze(-1)).squeeze(-1) - rhs
            return zero, [grad[..., :TOY_D]], [grad[..., TOY_D]]

        return directions


@dataclass(frozen=True)
class ToyCODASCA(ToyGame, CODASCA):
    name: ClassVar[str] = "toy_codasca"


@dataclass(frozen=True)
class ToyCODAPlus(ToyGame, CODAPlus):
    name: ClassVar[str] = "toy_codaplus"


class BatchedReplies(Replies):
    """All K clients' replies in one tree with a leading client dimension."""

    def __init__(self, reply: dict, num_clients: int) -> None:
        self.reply, self.clients = reply, list(range(num_clients))

    def sum(self, key: str, weights: Any = None) -> Any:
        return tree_map(lambda x: x.sum(0), self.reply[key])

    def gather(self, key: str) -> list:
        raise NotImplementedError

    def as_dict(self) -> dict:
        raise NotImplementedError


def run_toy_batched(alg: CODAPlus, M: Tensor, rounds: int, seed: int = 0) -> Tensor:
    """The contract's rounds with every client at once (the clients' tensors carry a leading
    K dimension; the local loop is the family's own code; the server generators are the
    simulation's)."""
    info = FedInfo(TOY_K, (TOY_D + 1,) * TOY_K, 2)
    params = torch.zeros(TOY_D, dtype=F64)
    state = alg.init_server(RoundContext(0, info, "init"), params, server_generator(seed, -1, "init"))
    client_state = alg.init_client(RoundContext(0, info, "init"), 0, params)
    data = LocalData(M, torch.zeros(TOY_K, TOY_D + 1), torch.tensor(TOY_D + 1))
    for r in range(rounds):
        ctx = RoundContext(r, info)
        plan = alg.configure(ctx, state, server_generator(seed, r, "configure"))
        result = alg.client_update(ctx, plan.broadcast, client_state, data, {})
        client_state = result.state
        replies = BatchedReplies(result.reply, TOY_K)
        state = alg.aggregate(ctx, state, plan, replies, server_generator(seed, r, "aggregate"))
    return torch.cat([state["v"], state["alpha"].reshape(1)])


def toy_federation(M: Tensor) -> Federation:
    return Federation("toy", [Samples(M[k], torch.zeros(TOY_D + 1, dtype=torch.long)) for k in range(TOY_K)], 2)


def test_toy_batched_rounds_equal_the_simulation() -> None:
    M, _ = toy_game()
    for cls in (ToyCODASCA, ToyCODAPlus):
        alg = cls(model=None, lr=0.05, window=4, stage_iters=8, prox_coef=0.01)
        sim = Simulation(alg, toy_federation(M), dtype=F64, init_params=torch.zeros(TOY_D, dtype=F64))
        for _ in range(6):
            sim.step()
        batched = run_toy_batched(alg, M, 6)
        assert float((flat(sim.server_state) - batched).abs().max()) < TOL


def toy_errors(windows: tuple[int, ...], rounds: int = 300) -> dict[str, list[float]]:
    """Distance to the saddle point after ``rounds`` rounds: CODASCA and CODA+ at η̃ = η_l·I = 0.2,
    CODA+ at η_l = 0.02 (exact gradients, no prox, η_g = 1, one endless stage)."""
    M, saddle = toy_game()
    out: dict[str, list[float]] = {"codasca": [], "codaplus": [], "codaplus_fixed_lr": []}
    plain = {"model": None, "stage_iters": None, "prox_coef": 0.0}
    for I in windows:
        for key, alg in (
            ("codasca", ToyCODASCA(lr=0.2 / I, window=I, **plain)),
            ("codaplus", ToyCODAPlus(lr=0.2 / I, window=I, **plain)),
            ("codaplus_fixed_lr", ToyCODAPlus(lr=0.02, window=I, **plain)),
        ):
            out[key].append(float((run_toy_batched(alg, M, rounds) - saddle).norm()))
    return out


def check_toy_acceptance(err: dict[str, list[float]]) -> None:
    """(a) CODASCA error <= 1e-8 for every I; (b) CODA+ error >= 1e-2 for I >= 4 (the drift
    bias); (c) at a fixed η_l, CODA+'s error grows with I."""
    assert max(err["codasca"]) <= 1e-8, err
    assert min(err["codaplus"][1:]) >= 1e-2, err
    assert all(x < y for x, y in itertools.pairwise(err["codaplus_fixed_lr"])), err


def test_toy_codasca_converges_for_every_window_and_codaplus_drifts() -> None:
    """Spec §7.2 acceptance on I in {1, 4, 16, 64} (R = 300); the slow test adds I = 256."""
    err = toy_errors((1, 4, 16, 64))
    check_toy_acceptance(err)
    assert err["codasca"][0] < 1e-12 and err["codaplus"][0] < 1e-12  # I = 1: both exact


@pytest.mark.slow
def test_toy_full_window_grid() -> None:
    """Spec §7.2 on the spec's whole grid I in {1, 4, 16, 64, 256} (about 300k local steps)."""
    check_toy_acceptance(toy_errors((1, 4, 16, 64, 256)))


# --------------------------------------------------------------------------------------------
# a stochastic run on the synthetic class-split data (a small Figure 1 analogue)
# --------------------------------------------------------------------------------------------


def test_codasca_tolerates_a_large_window_on_class_split_data() -> None:
    """K = 8 clients with disjoint Gaussian-cluster classes (spec §7.3 data), I = 100 local
    steps per round, 1,000 iterations: CODASCA >= CODA+ − 0.002 test AUROC and both > 0.8
    (calibrated: seed 1 gives CODA+ 0.849, CODASCA 0.873)."""
    fed = class_split_auc_federation(8, seed=1)
    model = mlp(dim=32, hidden=32)
    kw = {"model": model, "lr": 0.5, "window": 100, "stage_iters": 500, "stage_output": "last"}
    try:
        from fedrisk.runtime.vectorized import VectorizedExecutor

        executor: Any = VectorizedExecutor()
    except ImportError:  # pragma: no cover - the sequential executor gives the same numbers
        executor = "sequential"
    scores = {}
    for alg in (CODAPlus(**kw), CODASCA(**kw)):
        sim = Simulation(alg, fed, seed=1, executor=executor)
        for _ in range(10):
            sim.step()
        scores[alg.name] = score_split(alg, alg.global_params(sim.server_state), fed.test, ["auroc"])["auroc"]
    assert scores["codaplus"] > 0.8 and scores["codasca"] > 0.8, scores
    assert scores["codasca"] >= scores["codaplus"] - 0.002, scores


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"positive_ratio": "given", "p": 0.0}, r"p = 0.0 is out of range; allowed: \(0, 1\)"),
        ({"positive_ratio": "given", "p": 1.5}, r"p = 1.5 is out of range; allowed: \(0, 1\)"),
        ({"positive_ratio": "given"}, "needs p"),
        ({"p": 0.2}, "only used with positive_ratio = 'given'"),
        ({"positive_ratio": "pooled"}, "unknown positive_ratio 'pooled'"),
        ({"window": 600, "stage_iters": 500}, "window = 600 is larger than the stage length stage_iters = 500"),
        ({"window": 0}, "window = 0 is out of range"),
        ({"window": 2.0}, "window must be an integer"),
        ({"prox_coef": 500.0}, "1/500"),
        ({"lr": 0.0}, "lr = 0.0 is out of range"),
        ({"stage_output": "mean"}, "unknown stage_output 'mean'"),
        ({"auc_loss": "hinge"}, "unknown auc_loss 'hinge'"),
        ({"dual_direction": "exact"}, "unknown dual_direction"),
        ({"window_growth": 2.0, "stage_iters": None}, "window_growth = 2.0 needs stages"),
        ({"lr_decay": 0.5}, "lr_decay = 0.5 is out of range"),
        ({"grad_clip": 0.0}, "grad_clip = 0.0 is out of range"),
    ],
)
def test_bad_hyper_parameters(kwargs: dict, needle: str) -> None:
    with pytest.raises(FedriskError, match=needle):
        CODASCA(model=None, **kwargs)


def test_bad_codasca_and_coda_options() -> None:
    with pytest.raises(FedriskError, match=r"global_lr = 0\.0 is out of range"):
        CODASCA(model=None, global_lr=0.0)
    with pytest.raises(FedriskError, match="unknown control_variate 'mean'"):
        CODASCA(model=None, control_variate="mean")
    with pytest.raises(FedriskError, match="reset_batch_size = 0 is out of range"):
        CODA(model=None, reset_batch_size=0)


def test_non_binary_labels_are_rejected() -> None:
    g = torch.Generator().manual_seed(0)
    s = Samples(torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g))
    fed = Federation("three", [s.subset(range(15)), s.subset(range(15, 30))], num_classes=3)
    with pytest.raises(FedriskError, match=r"binary labels .* got num_classes = 3"):
        sim_of(CODASCA(model=mlp()), fed)
    floats = Federation("float", [Samples(s.x, (s.y == 1).double())], num_classes=2)
    with pytest.raises(FedriskError, match="needs integer class labels"):
        sim_of(CODASCA(model=mlp()), floats)
    sim_of(CODASCA(model=mlp(), positive_ratio="given", p=0.3), floats).step()  # a given p needs no counts


def single_class_fed(keep: int = 0) -> Federation:
    """Client 1 keeps only its rows of class ``keep`` (0: no positives, 1: no negatives)."""
    fed = small_fed()
    one = fed.clients[1].subset(torch.nonzero(fed.clients[1].y == keep).flatten())
    return Federation("one-class", [fed.clients[0], one, *fed.clients[2:]], 2, test=fed.test)


@pytest.mark.parametrize(
    ("keep", "needle"),
    [
        (0, r"client 1 has no positive examples \(30 samples\)\. .* gradient in a is 0 .* towards h̄/\(1−p\)"),
        (1, r"client 1 has no negative examples \(3 samples\)\. .* gradient in b is 0 .* towards −h̄/p"),
    ],
)
def test_a_single_class_client_is_reported_and_trains_with_the_global_ratio(keep: int, needle: str) -> None:
    fed = single_class_fed(keep)
    with pytest.warns(SingleClassClientWarning, match=needle):
        sim = sim_of(CODASCA(model=mlp(), window=2, stage_iters=4, batch_size=8), fed)
    expected_p = sum(float((c.y == 1).double().mean()) for c in fed.clients) / fed.num_clients
    assert all(abs(float(s["p"]) - expected_p) < TOL for s in sim.client_states.values())
    for _ in range(3):
        report = sim.step()
        assert math.isfinite(report.train_metrics["loss"])
    assert bool(torch.isfinite(flat(sim.server_state)).all())


def test_a_client_without_positives_is_an_error_with_its_own_ratio() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClassClientWarning)
        with pytest.raises(FedriskError, match=r"client 1 has 0 positives among 30 samples"):
            sim_of(CODASCA(model=mlp(), positive_ratio="client"), single_class_fed())


def test_a_federation_without_positives_is_an_error() -> None:
    fed = small_fed()
    negatives = [c.subset(torch.nonzero(c.y == 0).flatten()) for c in fed.clients]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingleClassClientWarning)
        with pytest.raises(FedriskError, match=r"global positive ratio p = 0.0 is out of range"):
            sim_of(CODAPlus(model=mlp()), Federation("neg", negatives, 2))
