"""The contract conformance suite: every registered executor against hand-computed values.

Each test takes the ``executor_name`` fixture, parametrised over ``EXECUTORS.names()``, so an
executor registered in :mod:`fedrisk.runtime` is checked automatically.  For every toy of
``toy_algorithms`` a test (a) recomputes the expected server / client states by hand, in a
plain loop that does not call the toy, and (b) compares the executor's whole run (server
state, client states, round reports, ledger) with the sequential executor's.
"""

from __future__ import annotations

import io
import math
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import InMemoryReplies
from fedrisk.algorithms.base import Algorithm, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.api import run_simulation
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.rng import client_generator, server_generator
from fedrisk.runtime import EXECUTORS, ClientFailure
from fedrisk.runtime.executor import Executor, RoundOutput, check_reply
from fedrisk.runtime.simulation import RoundReport, Simulation
from fedrisk.tree import Tree

# the toys live next to this file; pytest runs with --import-mode=importlib (no sys.path change)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from toy_algorithms import (
    ControlCounter,
    D,
    Faulty,
    Kinds,
    NegativeMean,
    Robust,
    ScorePool,
    Shuffle,
    Silent,
)

SEED = 11
SIZES = (3, 4, 5, 6, 7)
N = len(SIZES)
F64 = torch.float64
TOL = 1e-10


@pytest.fixture(params=EXECUTORS.names())
def executor_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every registered executor.  ``distributed`` runs here as a world of one process (gloo,
    created for the test and destroyed after it, so that other tests see no process group);
    equality across several ranks is the business of the torchrun tests in tests/runtime."""
    name = request.param
    own_group = False
    if name == "distributed":
        import torch.distributed as dist

        from fedrisk.runtime.distributed import free_port

        if not dist.is_available():
            pytest.skip("this PyTorch build has no torch.distributed")
        if not dist.is_initialized():
            own_group = True
            env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            for key, value in env.items():
                monkeypatch.setenv(key, value)
    yield name
    if own_group:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    clients = []
    for k, n in enumerate(SIZES):
        x = torch.randn(n, D, generator=g, dtype=F64) + 0.5 * k
        clients.append(Samples(x, (x[:, 0] > 0.5 * k).long()))
    xt = torch.randn(12, D, generator=g, dtype=F64)
    test = Samples(xt, (xt[:, 0] + xt[:, 1] > 0).long())
    return Federation("conformance", clients, num_classes=2, test=test)


FED = federation()


def simulation(alg: Algorithm, executor: Executor | str, **kw: Any) -> Simulation:
    return Simulation(alg, FED, seed=SEED, dtype=F64, executor=executor, **kw)


def run(alg: Algorithm, executor: Executor | str, rounds: int, **kw: Any) -> tuple[Simulation, list[RoundReport]]:
    sim = simulation(alg, executor, **kw)
    return sim, [sim.step() for _ in range(rounds)]


# -- comparisons -------------------------------------------------------------------------------
def assert_tree_close(a: Tree, b: Tree, what: str = "tree") -> None:
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    assert sa == sb, f"{what}: structures differ: {sa} vs {sb}"
    for x, y in zip(la, lb):
        if isinstance(x, Tensor):
            assert isinstance(y, Tensor) and x.shape == y.shape and x.dtype == y.dtype, what
            assert torch.allclose(x, y, rtol=TOL, atol=TOL, equal_nan=True), f"{what}: {x} vs {y}"
        else:
            assert x == y, what


def assert_same_run(
    sim: Simulation, reports: Sequence[RoundReport], ref: Simulation, ref_reports: Sequence[RoundReport]
) -> None:
    """``sim`` (some executor) did exactly what ``ref`` (the sequential executor) did."""
    assert len(reports) == len(ref_reports)
    for got, want in zip(reports, ref_reports):
        assert (got.round, got.kind, got.clients) == (want.round, want.kind, want.clients)
        assert (got.bytes_down, got.bytes_up) == (want.bytes_down, want.bytes_up)
        assert sorted(got.failed) == sorted(want.failed)
        assert got.train_metrics.keys() == want.train_metrics.keys()
        for key, value in want.train_metrics.items():
            assert got.train_metrics[key] == pytest.approx(value, rel=TOL, abs=TOL)
    assert sim.round == ref.round
    assert_tree_close(sim.server_state, ref.server_state, "server state")
    assert sim.client_states.keys() == ref.client_states.keys()
    for k in ref.client_states:
        assert_tree_close(sim.client_states[k], ref.client_states[k], f"client {k} state")
    assert sim.ledger.rounds == ref.ledger.rounds


def check_against_sequential(
    alg: Algorithm, executor_name: str, rounds: int, **kw: Any
) -> tuple[Simulation, list[RoundReport]]:
    sim, reports = run(alg, executor_name, rounds, **kw)
    ref, ref_reports = run(alg, "sequential", rounds, **kw)
    assert_same_run(sim, reports, ref, ref_reports)
    return sim, reports


def close(a: Tensor, b: Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=TOL, atol=TOL))


def init_w() -> Tensor:
    """The initial parameters every toy gets (the simulation's init stream)."""
    return simulation(Robust(), "sequential").server_state["w"]


def rows(r: int, k: int, count: int) -> Tensor:
    """What ``draw`` of client k in round r picks (``count`` uniform rows)."""
    return client_generator(SEED, r, k).integers(SIZES[k], (count,))


def client_mean(k: int) -> Tensor:
    return FED.clients[k].x.mean(0)


# -- (1) persistent client state, (7) partial participation, (8) draws ----------------------
@pytest.mark.parametrize("per_round", [None, 2])
def test_persistent_state_and_partial_participation(executor_name: str, per_round: int | None) -> None:
    alg = ControlCounter(per_round=per_round, lr=0.5, batch=3)
    sim, reports = check_against_sequential(alg, executor_name, 5)
    x, c = init_w(), torch.zeros(D, dtype=F64)
    cs = [torch.zeros(D, dtype=F64) for _ in range(N)]
    counts = [0] * N
    for r, report in enumerate(reports):
        chosen = sample_clients(server_generator(SEED, r, "configure"), N, per_round)
        assert report.clients == chosen and len(chosen) == (per_round or N)
        dcs = []
        for k in chosen:
            c_new = x - FED.clients[k].x[rows(r, k, 3)].mean(0)
            dcs.append(c_new - cs[k])
            cs[k], counts[k] = c_new, counts[k] + 1
        c = c + sum(dcs) / N
        x = x - 0.5 * c
        assert report.train_metrics["count"] == pytest.approx(sum(counts[k] for k in chosen) / len(chosen))
        assert report.bytes_down == report.bytes_up == len(chosen) * D * 8
        assert close(c, sum(cs) / N)  # the invariant the |S|/N rule keeps
    assert close(sim.server_state["x"], x) and close(sim.server_state["c"], c)
    for k in range(N):
        assert close(sim.client_states[k]["c"], cs[k])
        assert float(sim.client_states[k]["count"]) == counts[k]
    if per_round is not None:
        assert len(set(counts)) > 1  # clients really were left out


# -- (2) per-client payloads -----------------------------------------------------------------
def test_per_client_payloads(executor_name: str) -> None:
    sim, reports = check_against_sequential(Shuffle(step=0.5), executor_name, 4)
    models = init_w()[None, :] + torch.arange(N, dtype=F64)[:, None]
    for r in range(4):
        new = models.clone()
        for k in range(N):
            owner = (k + r + 1) % N
            new[owner] = models[owner] + 0.5 * (client_mean(k) - models[owner])
        models = new
    assert close(sim.server_state["models"], models)
    for report in reports:  # model + owner id (int64) + broadcast step; reply model + owner
        assert report.bytes_down == N * (D * 8 + 8 + 8)
        assert report.bytes_up == N * (D * 8 + 8)
    row = sim.ledger.rounds[0]
    assert row["down"] == {k: D * 8 + 16 for k in range(N)}


# -- (3) a server-side pool merged from the replies -------------------------------------------
def test_server_pool_from_gathered_replies(executor_name: str) -> None:
    sim, _ = check_against_sequential(ScorePool(num_scores=2, lr=0.1), executor_name, 4)
    w, pool = init_w(), torch.zeros(2 * N, dtype=F64)
    for r in range(4):
        scores, grads = [], []
        for k in range(N):
            x = FED.clients[k].x[rows(r, k, 2)]
            s = x @ w
            scores.append(s)
            grads.append(x.T @ (s - pool.mean()) / 2)
        w, pool = w - 0.1 * sum(grads) / N, torch.cat(scores)
    assert close(sim.server_state["w"], w) and close(sim.server_state["pool"], pool)
    assert sim.server_state["pool"].shape == (2 * N,)


# -- (4) a gather aggregator ----------------------------------------------------------------
def honest_reply(w: Tensor, r: int, k: int, lr: float = 0.5) -> Tensor:
    return w - lr * (w - FED.clients[k].x[rows(r, k, 2)].mean(0))


def median(values: Sequence[Tensor]) -> Tensor:
    cols = torch.stack(values).T.tolist()
    return torch.tensor([statistics.median(col) for col in cols], dtype=F64)


def test_gather_median_aggregator(executor_name: str) -> None:
    sim, _ = check_against_sequential(Robust("median"), executor_name, 3)
    w = init_w()
    for r in range(3):
        w = median([honest_reply(w, r, k) for k in range(N)])
    assert close(sim.server_state["w"], w)


# -- (5) an attack that sees the honest replies -----------------------------------------------
@pytest.mark.parametrize("aggregator,byzantine", [("mean", [1, 3]), ("median", [2])])
def test_attack_sees_honest_replies(executor_name: str, aggregator: str, byzantine: list[int]) -> None:
    kw = {"attack": NegativeMean(10.0), "byzantine": byzantine}
    sim, _ = check_against_sequential(Robust(aggregator), executor_name, 3, **kw)
    w = init_w()
    for r in range(3):
        honest = {k: honest_reply(w, r, k) for k in range(N) if k not in byzantine}
        forged = -10.0 * sum(honest.values()) / len(honest)
        received = [honest.get(k, forged) for k in range(N)]
        w = sum(received) / N if aggregator == "mean" else median(received)
    assert close(sim.server_state["w"], w)
    assert float(sim.server_state["w"].abs().max()) > 0  # non-degenerate


# -- (6) round kinds chosen by the server state -----------------------------------------------
def test_round_kinds_from_server_state(executor_name: str) -> None:
    sim, reports = check_against_sequential(Kinds(lr=0.5), executor_name, 7)
    assert [r.kind for r in reports] == ["train", "train", "estimate"] * 2 + ["train"]
    w, estimate = init_w(), torch.zeros((), dtype=F64)
    for report in reports:
        if report.kind == "estimate":
            losses = [0.5 * ((FED.clients[k].x - w) ** 2).sum(1).mean() for k in range(N)]
            estimate = sum(losses) / N
            assert report.bytes_up == N * 8  # one float64 scalar per client
            assert report.train_metrics["loss"] == pytest.approx(float(estimate), rel=1e-12)
        else:
            w = sum(w + 0.5 * (client_mean(k) - w) for k in range(N)) / N
            assert report.bytes_up == N * D * 8
    assert close(sim.server_state["w"], w) and close(sim.server_state["estimate"], estimate)
    assert float(sim.server_state["t"]) == 7


# -- no communication ------------------------------------------------------------------------
def test_empty_payloads_and_replies(executor_name: str) -> None:
    sim, reports = check_against_sequential(Silent(lr=0.5), executor_name, 3)
    ws = [init_w()] * N
    for r in range(3):
        ws = [w + 0.5 * (FED.clients[k].x[rows(r, k, 2)].mean(0) - w) for k, w in enumerate(ws)]
    assert sim.server_state == {}
    for k in range(N):
        assert close(sim.client_states[k]["w"], ws[k])
    assert all(r.bytes_down == r.bytes_up == 0 and r.clients == list(range(N)) for r in reports)


# -- (8) results do not depend on the order clients are processed -----------------------------
class ReversedExecutor(Executor):
    """The sequential executor's logic with the clients processed last to first."""

    name = "reversed"

    def run_round(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        seed: int,
        on_failure: str = "raise",
    ) -> RoundOutput:
        replies, new_states, metrics = {}, {}, {}
        for k in reversed(plan.clients):
            draws = algorithm.draw(ctx, k, int(data[k].size), client_generator(seed, ctx.round, k))
            result = algorithm.client_update(ctx, plan.payload(k), states[k], data[k], draws)
            assert check_reply(k, ctx.round, result.reply, "raise") is None
            replies[k], new_states[k], metrics[k] = result
        return RoundOutput(InMemoryReplies(replies), new_states, metrics, {})


TOYS = {
    "control_counter": lambda: ControlCounter(per_round=3),
    "shuffle": Shuffle,
    "score_pool": ScorePool,
    "median": Robust,
    "kinds": Kinds,
    "silent": Silent,
}


@pytest.mark.parametrize("toy", sorted(TOYS))
def test_results_do_not_depend_on_client_order(executor_name: str, toy: str) -> None:
    alg = TOYS[toy]()
    sim, reports = run(alg, executor_name, 4)
    rev, rev_reports = run(alg, ReversedExecutor(), 4)
    assert_same_run(sim, reports, rev, rev_reports)


# -- histories ----------------------------------------------------------------------------------
def test_history_matches_sequential(executor_name: str) -> None:
    histories = []
    for name in (executor_name, "sequential"):
        sim = simulation(ControlCounter(per_round=3), name)
        histories.append(run_simulation(sim, 5, eval_every=2, metrics=["auroc"]))
    got, want = histories
    assert [r["round"] for r in want.records] == [2, 4, 5]
    for a, b in zip(got.records, want.records):
        assert a.keys() == b.keys() and "test_auroc" in a
        for key in b:
            if key != "wall_time":
                assert a[key] == pytest.approx(b[key], rel=TOL, abs=TOL), key
    assert want.records[-1]["bytes_up"] == 5 * 3 * D * 8


# -- failures -------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raise_in_draw", "raise_in_update", "nan_reply"])
def test_failing_client_is_named_when_raising(executor_name: str, mode: str) -> None:
    sim = simulation(Faulty(mode=mode, client=2, round=1), executor_name)
    sim.step()
    with pytest.raises(ClientFailure, match=r"client 2\b.*round 1\b"):
        sim.step()


@pytest.mark.parametrize("mode", ["raise_in_draw", "raise_in_update", "nan_reply"])
def test_failing_client_is_dropped_when_skipping(executor_name: str, mode: str) -> None:
    sim, reports = run(Faulty(mode=mode, client=2, round=1), executor_name, 3, on_client_failure="skip")
    assert [sorted(r.failed) for r in reports] == [[], [2], []]
    assert reports[1].clients == [0, 1, 3, 4]
    assert reports[1].bytes_up == 4 * D * 8
    assert sim.ledger.rounds[1]["up"].keys() == {0, 1, 3, 4}
    w = init_w()
    for r in range(3):
        members = [k for k in range(N) if not (r == 1 and k == 2)]
        w = sum(w + 0.5 * (client_mean(k) - w) for k in members) / len(members)
    assert close(sim.server_state["w"], w)
    assert [float(sim.client_states[k]["count"]) for k in range(N)] == [3, 3, 2, 3, 3]


def test_server_state_nan_raises(executor_name: str) -> None:
    sim = simulation(Faulty(mode="server_nan", round=2), executor_name)
    sim.step()
    sim.step()
    before = sim.server_state
    with pytest.raises(ClientFailure, match=r"server state became NaN/inf in round 2"):
        sim.step()
    assert sim.server_state is before and sim.round == 2  # the bad state was not adopted


# -- checkpoints ----------------------------------------------------------------------------
@pytest.mark.parametrize("toy", sorted(TOYS))
def test_checkpoint_round_trip(executor_name: str, toy: str) -> None:
    alg = TOYS[toy]()
    straight, _ = run(alg, executor_name, 6)
    first, _ = run(alg, executor_name, 3)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = simulation(alg, executor_name)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    assert resumed.round == 3
    for _ in range(3):
        resumed.step()
    for a, b in [(straight.server_state, resumed.server_state)] + [
        (straight.client_states[k], resumed.client_states[k]) for k in range(N)
    ]:
        la, sa = pytree.tree_flatten(a)
        lb, sb = pytree.tree_flatten(b)
        assert sa == sb and all(torch.equal(x, y) for x, y in zip(la, lb))
    assert straight.ledger.rounds == resumed.ledger.rounds
    assert straight.ledger.total == resumed.ledger.total


def test_checkpoint_of_another_seed_is_rejected(executor_name: str) -> None:
    sim, _ = run(Robust(), executor_name, 1)
    other = Simulation(Robust(), FED, seed=SEED + 1, dtype=F64, executor=executor_name)
    with pytest.raises(FedriskError, match=f"seed {SEED}"):
        other.load_state_dict(sim.state_dict())


# -- bad inputs -----------------------------------------------------------------------------
@pytest.mark.parametrize("byzantine", [[N], [-1], [0, 7]])
def test_byzantine_ids_out_of_range(executor_name: str, byzantine: list[int]) -> None:
    with pytest.raises(FedriskError, match=r"byzantine client ids .* out of range \[0, 4\]"):
        simulation(Robust(), executor_name, attack=NegativeMean(), byzantine=byzantine)


def test_unknown_failure_policy(executor_name: str) -> None:
    with pytest.raises(FedriskError, match=r"on_client_failure policy 'ignore'.*raise, skip"):
        simulation(Robust(), executor_name, on_client_failure="ignore")


def test_unknown_executor() -> None:
    with pytest.raises(FedriskError, match=r"unknown executor 'sequentail'.*Did you mean 'sequential'"):
        simulation(Robust(), "sequentail")


def test_toys_are_non_trivial() -> None:
    """Guards the suite itself: the toys move their state, so equalities above can fail."""
    w0 = init_w()
    for alg in (ControlCounter(), ScorePool(), Robust(), Kinds()):
        sim, _ = run(alg, "sequential", 2)
        state = alg.global_params(sim.server_state)
        assert float((state["w"] - w0).abs().max()) > 1e-3
        assert math.isfinite(float(state["w"].sum()))
