"""The vectorised executor gives the sequential executor's numbers, for every registered algorithm.

A tiny binary federation with unequal client sizes; every algorithm of ``ALGORITHMS`` that can be
built generically (a small MLP, cross-entropy where the algorithm takes a ``loss``, a one-output
scorer otherwise) runs a few rounds under both executors, with several block sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms import ALGORITHMS
from fedrisk.algorithms.base import Algorithm, ClientResult, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local_only import centralized
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime import EXECUTORS, ClientFailure, vectorized
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import DATA_COPIES, PARAM_COPIES, StackedReplies, VectorizedExecutor
from fedrisk.tree import Tree

D = 4
SIZES = (6, 11, 4, 9, 7)
F64 = torch.float64
TOL = 1e-9


def make_federation() -> Federation:
    """Unequal clients, both classes on every client (alternating labels), shifted features."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for k, n in enumerate(SIZES):
        y = torch.arange(n) % 2
        x = torch.randn(n, D, generator=g) + 0.3 * k + y[:, None].float()
        clients.append(Samples(x, y))
    xt = torch.randn(20, D, generator=g)
    return Federation("tiny", clients, num_classes=2, test=Samples(xt, (xt[:, 0] > 0).long()))


FED = make_federation()

# small hyper-parameters, applied to the fields an algorithm has
OVERRIDES: dict[str, Any] = {
    "lr": 0.05,
    "local_steps": 3,
    "batch_size": 3,
    "clients_per_round": 3,
    "window": 2,
    "stage_iters": 4,
    "reset_batch_size": 4,
}


def build_algorithm(name: str) -> Algorithm:
    """``name`` built from a small MLP (skips, with the reason, what cannot be built generically)."""
    cls = ALGORITHMS.get(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in OVERRIDES.items() if k in fields}
    if getattr(cls, "requires_pooled_data", False):  # one client: no partial participation
        kwargs.pop("clients_per_round", None)
    takes_loss = "loss" in fields
    kwargs["model"] = FunctionalModel(build_model("mlp", (D,), 2 if takes_loss else 1, hidden=[5]))
    if takes_loss:
        kwargs["loss"] = cross_entropy
    missing = [
        f.name
        for f in fields.values()
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        pytest.skip(f"{name}: cannot build generically, needs {missing}")
    try:
        return cls(**kwargs)
    except FedriskError as exc:  # an override the algorithm rejects (NPA: window must be 1)
        kwargs = {k: v for k, v in kwargs.items() if k not in OVERRIDES or k not in str(exc)}
    try:
        return cls(**kwargs)
    except (FedriskError, TypeError) as exc:
        pytest.skip(f"{name}: cannot build generically: {exc}")


def federation_for(alg: Algorithm) -> Federation:
    return centralized(FED) if getattr(alg, "requires_pooled_data", False) else FED


def run(alg: Algorithm, executor: Any, rounds: int = 4, fed: Federation | None = None, **kw: Any):
    sim = Simulation(alg, fed or federation_for(alg), seed=3, dtype=kw.pop("dtype", F64), executor=executor, **kw)
    return sim, [sim.step() for _ in range(rounds)]


def assert_close(a: Tree, b: Tree, what: str, rtol: float = TOL, atol: float = TOL) -> None:
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    assert sa == sb, f"{what}: structures differ"
    for x, y in zip(la, lb):
        if isinstance(x, Tensor):
            assert x.shape == y.shape and x.dtype == y.dtype, what
            assert torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True), f"{what}: {x} vs {y}"
        else:
            assert x == y, what


def assert_same_run(got, want, rtol: float = TOL, atol: float = TOL) -> None:
    (sim, reports), (ref, ref_reports) = got, want
    for r, s in zip(reports, ref_reports):
        assert (r.round, r.kind, r.clients, r.failed.keys()) == (s.round, s.kind, s.clients, s.failed.keys())
        assert (r.bytes_down, r.bytes_up) == (s.bytes_down, s.bytes_up)
        assert r.train_metrics.keys() == s.train_metrics.keys()
        for key, value in s.train_metrics.items():
            assert r.train_metrics[key] == pytest.approx(value, rel=rtol, abs=atol), key
    assert_close(sim.server_state, ref.server_state, "server state", rtol, atol)
    assert_close(sim.client_states, ref.client_states, "client states", rtol, atol)
    assert sim.ledger.total == ref.ledger.total


# -- the invariant: every registered algorithm, every block size ------------------------------


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_algorithm_matches_sequential_in_float64(name: str) -> None:
    alg = build_algorithm(name)
    if not alg.vectorizable:
        with pytest.raises(FedriskError, match=alg.not_vectorizable_reason):
            run(alg, VectorizedExecutor())
        return
    want = run(alg, "sequential")
    for block in (1, 2, None):
        got = run(alg, VectorizedExecutor(block_size=block))
        assert_same_run(got, want)


# the AUC family through stage ends (OVERRIDES: window 2, stage_iters 4, so rounds 1, 3, 5 end
# stages) with the options the generic build leaves at their defaults
AUC_STAGE_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "codasca-reset-random-margin": (
        "codasca",
        {"stage_output": "random", "reset_control_variates": True, "auc_loss": "margin", "global_lr": 1.5},
    ),
    "codasca-code-rule-growing": (
        "codasca",
        {"stage_output": "last_local_average_ref", "window_growth": 2.0, "lr_decay": 2.0, "rounds_growth": 1.5},
    ),
    "codaplus-average": ("codaplus", {"stage_output": "average", "weight_decay": 0.01}),
    "coda-dual-reset": ("coda", {"auc_loss": "margin"}),
}


@pytest.mark.parametrize("variant", sorted(AUC_STAGE_VARIANTS))
def test_auc_family_across_stage_boundaries(variant: str) -> None:
    name, extra = AUC_STAGE_VARIANTS[variant]
    alg = dataclasses.replace(build_algorithm(name), **extra)
    want = run(alg, "sequential", rounds=7)
    kinds = {r.kind for r in want[1]}
    assert "stage_end" in kinds and (name != "coda" or "dual_reset" in kinds)
    for block in (2, None):
        assert_same_run(run(alg, VectorizedExecutor(block_size=block), rounds=7), want)


def test_fedavg_float32_within_relative_tolerance() -> None:
    alg = FedAvg(
        model=FunctionalModel(build_model("mlp", (D,), 2, hidden=[32])),
        loss=cross_entropy,
        lr=0.1,
        local_steps=5,
        batch_size=4,
    )
    assert_same_run(
        run(alg, "vectorized", 5, dtype=torch.float32),
        run(alg, "sequential", 5, dtype=torch.float32),
        rtol=1e-5,
        atol=1e-6,
    )


def test_registered_and_built_by_name() -> None:
    assert "vectorized" in EXECUTORS
    alg = build_algorithm("fedavg")
    sim = Simulation(alg, FED, executor="vectorized")
    assert isinstance(sim.executor, VectorizedExecutor)


def test_stacked_replies_reach_aggregate() -> None:
    """Replies stay stacked (one tensor per leaf) and nbytes matches the sequential ledger."""
    seen: list[Replies] = []

    @dataclass(frozen=True)
    class Spy(FedAvg):
        def aggregate(self, ctx, server_state, plan, replies, gen):
            seen.append(replies)
            return super().aggregate(ctx, server_state, plan, replies, gen)

    alg = Spy(model=FunctionalModel(build_model("logreg", (D,), 2)), loss=cross_entropy, batch_size=2)
    run(alg, VectorizedExecutor(block_size=2), rounds=1)
    (replies,) = seen
    assert isinstance(replies, StackedReplies)
    assert replies.clients == [0, 1, 2, 3, 4]
    assert replies.stacked("params")["linear.weight"].shape == (5, 2, D)
    assert replies.nbytes() == {k: (2 * D + 2) * 8 for k in range(5)}


# -- StackedReplies against InMemoryReplies ----------------------------------------------------


def test_stacked_replies_equal_in_memory_replies() -> None:
    g = torch.Generator().manual_seed(1)
    rows = {k: {"a": {"w": torch.randn(2, 3, generator=g, dtype=F64)}, "n": torch.tensor(k)} for k in (1, 4, 6)}
    mem = InMemoryReplies(rows)
    stacked = StackedReplies(
        [1, 4, 6], {"a": {"w": torch.stack([rows[k]["a"]["w"] for k in (1, 4, 6)])}, "n": torch.tensor([1, 4, 6])}
    )
    w = {1: 0.5, 4: 2.0, 6: 1.5}
    for key in ("a", "n"):
        assert_close(stacked.sum(key), mem.sum(key), key, 1e-12, 1e-12)
        assert_close(stacked.sum(key, w), mem.sum(key, w), key, 1e-12, 1e-12)
        assert_close(stacked.mean(key), mem.mean(key), key, 1e-12, 1e-12)
        assert_close(stacked.mean(key, w), mem.mean(key, w), key, 1e-12, 1e-12)
        assert_close(stacked.gather(key), mem.gather(key), key, 0, 0)
        assert_close(stacked.stacked(key), mem.stacked(key), key, 0, 0)
    assert_close(stacked.as_dict(), mem.as_dict(), "as_dict", 0, 0)
    assert stacked.nbytes() == mem.nbytes() == {1: 56, 4: 56, 6: 56}
    assert stacked.sum("n", w).dtype == mem.sum("n", w).dtype == torch.float32  # python float * int tensor


def test_stacked_replies_reject_bad_layouts() -> None:
    with pytest.raises(ValueError, match="sorted"):
        StackedReplies([2, 1], {"p": torch.zeros(2, 1)})
    with pytest.raises(ValueError, match=r"\[2, \.\.\.\]"):
        StackedReplies([1, 2], {"p": torch.zeros(3, 1)})
    with pytest.raises(ValueError, match="no replies"):
        StackedReplies([], {}).sum("p")


# -- block size ---------------------------------------------------------------------------------


def test_automatic_block_size_from_the_memory_budget() -> None:
    alg = FedAvg(model=FunctionalModel(build_model("logreg", (D,), 2)), loss=cross_entropy)
    sim = Simulation(alg, FED, seed=0, dtype=F64, executor=VectorizedExecutor(memory_budget_mb=1.0))
    ex = sim.executor
    plan = alg.configure(RoundContext(0, sim.info), sim.server_state, torch.Generator())
    payload = (2 * D + 2) * 8  # the model, float64
    row = D * 8 + 8  # x (float64) + y (int64)
    per_client = PARAM_COPIES * payload + DATA_COPIES * max(SIZES) * row
    assert ex.bytes_per_client(plan, sim.client_states, sim.data) == per_client
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 5  # 1 MiB holds every client
    ex.memory_budget_mb = 3 * per_client / 2**20
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 3
    ex.memory_budget_mb = 1e-6
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 1  # never below one client
    assert VectorizedExecutor(block_size=2).block_size_for(plan, sim.client_states, sim.data) == 2
    assert VectorizedExecutor(block_size=50).block_size_for(plan, sim.client_states, sim.data) == 5


def test_automatic_block_size_keeps_stacked_leaves_within_the_cpu_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    alg = FedAvg(model=FunctionalModel(build_model("mlp", (D,), 2, hidden=[32])), loss=cross_entropy)
    sim = Simulation(alg, FED, seed=0, dtype=F64, executor=VectorizedExecutor(memory_budget_mb=1024.0))
    ex = sim.executor
    plan = alg.configure(RoundContext(0, sim.info), sim.server_state, torch.Generator())
    leaf = 32 * D * 8  # the first layer's weight [32, D] in float64: larger than a client's padded rows
    assert max(SIZES) * (D * 8 + 8) < leaf
    assert ex.largest_leaf_per_client(plan, sim.client_states, sim.data) == leaf
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 5  # the real 32 MiB: no cap
    monkeypatch.setattr(vectorized, "CPU_STACKED_LEAF_BYTES", 2 * leaf + 1)
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 2
    monkeypatch.setattr(vectorized, "CPU_STACKED_LEAF_BYTES", 2 * leaf - 1)  # one client's leaf is above half
    assert ex.block_size_for(plan, sim.client_states, sim.data) == 5
    monkeypatch.setattr(vectorized, "CPU_STACKED_LEAF_BYTES", 3 * leaf)
    assert VectorizedExecutor(block_size=4).block_size_for(plan, sim.client_states, sim.data) == 4  # explicit wins
    reference = Simulation(alg, FED, seed=0, dtype=F64)
    capped = Simulation(alg, FED, seed=0, dtype=F64, executor=VectorizedExecutor())
    for _ in range(2):
        reference.step()
        capped.step()
    for name, value in reference.server_state["params"].items():
        torch.testing.assert_close(capped.server_state["params"][name], value, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 0}, r"block_size = 0 is out of range; allowed: \[1, inf\)"),
        ({"block_size": 2.5}, "block_size must be a positive integer or None"),
        ({"memory_budget_mb": 0}, r"memory_budget_mb = 0 is out of range; allowed: \(0.0, inf\)"),
    ],
)
def test_bad_settings_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(FedriskError, match=message):
        VectorizedExecutor(**kwargs)


# -- algorithms that cannot be vectorised ------------------------------------------------------


@dataclass(frozen=True)
class NotVectorizable(FedAvg):
    vectorizable: ClassVar[bool] = False
    not_vectorizable_reason: ClassVar[str] = "its local solver calls scipy"


@dataclass(frozen=True)
class UsesItem(FedAvg):
    """Claims to be vectorisable but branches on a tensor value in client_update."""

    def client_update(self, ctx, payload, state, data, draws):
        result = super().client_update(ctx, payload, state, data, draws)
        scale = 1.0 if float(data.size) > 0 else 0.0
        return ClientResult({"params": {k: scale * v for k, v in result.reply["params"].items()}}, state, {})


def tiny_fedavg(cls: type[FedAvg] = FedAvg, **kw: Any) -> FedAvg:
    return cls(model=FunctionalModel(build_model("logreg", (D,), 2)), loss=cross_entropy, lr=0.1, batch_size=2, **kw)


@dataclass(frozen=True)
class NotVectorizableUnexplained(FedAvg):
    vectorizable: ClassVar[bool] = False


def test_not_vectorizable_algorithm_is_refused_with_its_reason() -> None:
    msg = "algorithm 'fedavg' cannot run under executor='vectorized': its local solver calls scipy"
    with pytest.raises(FedriskError, match=f"^{msg}. Use executor='sequential' \\(or 'distributed'\\)$"):
        Simulation(tiny_fedavg(NotVectorizable), FED, executor="vectorized")
    with pytest.raises(FedriskError, match=r"executor='vectorized': no reason given\. Use"):
        Simulation(tiny_fedavg(NotVectorizableUnexplained), FED, executor="vectorized")
    assert VectorizedExecutor().memory_budget_mb == 1024.0  # the default: 1 GiB per block
    with pytest.raises(FedriskError, match=msg):
        VectorizedExecutor().prepare(tiny_fedavg(NotVectorizable), [])


def test_client_update_that_fails_only_under_vmap_is_reported() -> None:
    sim = Simulation(tiny_fedavg(UsesItem), FED, executor="vectorized")
    with pytest.raises(FedriskError, match=r"client_update fails under torch.func.vmap \(RuntimeError.*item"):
        sim.step()
    advice = (
        "although it runs client by client, so it cannot use executor='vectorized'. Its client_update must not "
        "call .item()/float() on tensors, branch in Python on tensor values or draw random numbers (see "
        "fedrisk.runtime.vectorized); fix it, or set vectorizable = False with a not_vectorizable_reason and use "
        "executor='sequential'"
    )
    for policy in ("raise", "skip"):  # not a client failure: the policy does not hide it
        sim = Simulation(tiny_fedavg(UsesItem), FED, executor="vectorized", on_client_failure=policy)
        with pytest.raises(FedriskError) as info:
            sim.step()
        assert str(info.value).endswith(advice)


@dataclass(frozen=True)
class PythonNumberReply(FedAvg):
    def client_update(self, ctx, payload, state, data, draws):
        result = super().client_update(ctx, payload, state, data, draws)
        return ClientResult({**result.reply, "steps": 3}, state, result.metrics)


def test_python_number_in_a_reply_is_an_error_naming_it() -> None:
    sim = Simulation(tiny_fedavg(PythonNumberReply), FED, executor="vectorized")
    with pytest.raises(FedriskError, match=r"^algorithm 'fedavg': reply\['steps'\] is a int \(3\); the vectorised "
                       r"executor stacks and reduces replies and needs tensor leaves - return torch\.tensor\(\.\.\.\) "
                       r"instead, or use executor='sequential'$"):  # fmt: skip
        sim.step()


def test_clients_with_different_feature_shapes_are_refused() -> None:
    data = [
        LocalData(torch.zeros(3, 2), torch.zeros(3), torch.tensor(3)),
        LocalData(torch.zeros(2, 5), torch.zeros(2), torch.tensor(2)),
    ]
    with pytest.raises(FedriskError, match=r"client 1's x has rows of shape \(5,\).*client 0's has \(2,\)"):
        VectorizedExecutor().prepare(tiny_fedavg(), data)
    data = [
        LocalData(torch.zeros(3, 2), torch.zeros(3), torch.tensor(3), {"g": torch.zeros(3)}),
        LocalData(torch.zeros(2, 2), torch.zeros(2), torch.tensor(2)),
    ]
    with pytest.raises(FedriskError, match=r"client 1 has attributes \[\] but client 0 has \['g'\]"):
        VectorizedExecutor().prepare(tiny_fedavg(), data)


# -- client failures: NaN replies and exceptions -----------------------------------------------


@dataclass(frozen=True)
class NaNOnClient(FedAvg):
    """Client 3 (the one with 9 rows) replies NaN, decided in tensor code (vmap-able)."""

    def client_update(self, ctx, payload, state, data, draws):
        result = super().client_update(ctx, payload, state, data, draws)
        bad = torch.where(data.size == SIZES[3], torch.nan, 1.0)
        return ClientResult({"params": {k: bad * v for k, v in result.reply["params"].items()}}, state, result.metrics)


@dataclass(frozen=True)
class RaisesOnClient(FedAvg):
    """Client 1's draws index past its data, so its client_update raises an IndexError (under
    vmap the whole block containing client 1 fails; the others run).  Its draw branches on
    ``client`` in Python, so the block draw inherited from FedAvg's ``batched_draw`` raises and
    the executor falls back to drawing client by client."""

    def draw(self, ctx, client, num_samples, rng):
        draws = super().draw(ctx, client, num_samples, rng)
        return {"batches": draws["batches"] + 1000} if client == 1 else draws


@dataclass(frozen=True)
class RaisesInDraw(FedAvg):
    def draw(self, ctx, client, num_samples, rng):
        if client == 2:
            raise KeyError("no draws for client 2")
        return super().draw(ctx, client, num_samples, rng)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (NaNOnClient, "client 3 replied with NaN/inf values in round 0"),
        (RaisesOnClient, r"client 1 failed in round 0: IndexError\('index 10\d\d is out of bounds"),
        (RaisesInDraw, r"client 2 failed in round 0: KeyError\('no draws for client 2'\)"),
    ],
)
@pytest.mark.parametrize("block", [1, 2, None])
def test_failing_client_is_named_when_raising(cls: type[FedAvg], message: str, block: int | None) -> None:
    with pytest.raises(ClientFailure, match=r"client \d+ (failed|replied)"):
        Simulation(tiny_fedavg(cls), FED, dtype=F64).step()  # the sequential reference raises too
    sim = Simulation(tiny_fedavg(cls), FED, dtype=F64, executor=VectorizedExecutor(block_size=block))
    with pytest.raises(ClientFailure, match=message):
        sim.step()


@pytest.mark.parametrize("cls", [NaNOnClient, RaisesOnClient, RaisesInDraw])
@pytest.mark.parametrize("block", [1, 2, None])
def test_failing_client_is_dropped_when_skipping(cls: type[FedAvg], block: int | None) -> None:
    alg = tiny_fedavg(cls, clients_per_round=4)
    want = run(alg, "sequential", 3, on_client_failure="skip")
    got = run(alg, VectorizedExecutor(block_size=block), 3, on_client_failure="skip")
    assert any(r.failed for r in want[1])
    assert [r.failed for r in got[1]] == [r.failed for r in want[1]]
    assert_same_run(got, want)


def test_every_client_failing_raises() -> None:
    @dataclass(frozen=True)
    class AllNaN(FedAvg):
        def client_update(self, ctx, payload, state, data, draws):
            result = super().client_update(ctx, payload, state, data, draws)
            return ClientResult({"params": {k: v * torch.nan for k, v in result.reply["params"].items()}}, state, {})

    sim = Simulation(tiny_fedavg(AllNaN), FED, executor="vectorized", on_client_failure="skip")
    with pytest.raises(ClientFailure, match="every client failed in round 0"):
        sim.step()


# -- states: empty, differing structures, constants ---------------------------------------------


@dataclass(frozen=True)
class Ragged(Algorithm):
    """Client states of different structures and shapes, which also change over the rounds.

    client k starts with ``{}`` (even k) or ``{"h": zeros(k)}`` (odd k); each update keeps
    ``h`` (if any), adds a tensor ``seen`` (the sum of its drawn rows' first feature) and a
    Python ``tag`` constant; the reply is the mean of the drawn rows and a per-client metric.
    """

    name: ClassVar[str] = "ragged"

    def init_server(self, ctx, params, gen):
        return {"m": torch.zeros(D, dtype=F64)}

    def init_client(self, ctx, client, params):
        return {} if client % 2 == 0 else {"h": torch.zeros(client, dtype=F64)}

    def configure(self, ctx, state, gen):
        return RoundPlan(list(range(ctx.fed.num_clients)), broadcast={"m": state["m"]})

    def draw(self, ctx, client, num_samples, rng):
        return {"rows": rng.integers(num_samples, (2,))}

    def client_update(self, ctx, payload, state: Mapping[str, Any], data: LocalData, draws) -> ClientResult:
        rows = data.x[draws["rows"]]
        new_state = dict(state)
        if "h" in state:
            new_state["h"] = state["h"] + rows[:, 0].sum()
        new_state["seen"] = state.get("seen", torch.zeros((), dtype=F64)) + rows[:, 0].sum()
        new_state["tag"] = "visited"
        reply = {"mean": rows.mean(0) + 0.5 * payload["m"]}
        return ClientResult(reply, new_state, {"first": rows[0, 0]})

    def aggregate(self, ctx, state, plan, replies, gen):
        return {"m": replies.mean("mean")}

    def init_params(self, gen):
        return {}


def test_empty_and_differing_client_state_structures() -> None:
    want = run(Ragged(), "sequential", 3)
    for block in (1, 3, None):
        got = run(Ragged(), VectorizedExecutor(block_size=block), 3)
        assert_same_run(got, want)
        states = got[0].client_states
        assert states[1]["h"].shape == (1,) and "h" not in states[2] and states[4]["tag"] == "visited"


def test_per_round_data_gather_is_padded_with_zero_rows() -> None:
    """A masked full-batch mean is the same whatever the padding (block of clients 0..4)."""

    @dataclass(frozen=True)
    class MaskedMean(Ragged):
        def init_client(self, ctx, client, params):
            return {}

        def client_update(self, ctx, payload, state, data, draws):
            valid = data.valid()
            pad_sum = (data.x * (1 - valid)[:, None]).abs().sum()  # the padding rows are zeros
            mean = (data.x * valid[:, None]).sum(0) / data.size
            return ClientResult({"mean": mean}, {}, {"pad": pad_sum})

    sim, reports = run(MaskedMean(), VectorizedExecutor(), 1)
    assert reports[0].train_metrics == {"pad": 0.0}
    pooled = torch.stack([c.x.to(F64).mean(0) for c in FED.clients]).mean(0)
    assert torch.allclose(sim.server_state["m"], pooled, rtol=1e-12, atol=1e-12)


def test_float32_equivalence_holds_on_an_uneven_partial_federation_with_server_momentum() -> None:
    from fedrisk.algorithms.server_opt import server_momentum

    alg = tiny_fedavg(clients_per_round=2, server_opt=server_momentum(0.9))
    assert_same_run(
        run(alg, VectorizedExecutor(block_size=1), 4, dtype=torch.float32),
        run(alg, "sequential", 4, dtype=torch.float32),
        rtol=1e-5,
        atol=1e-6,
    )
