"""Vectorised-executor cases written for the mutants that the mutation run of the ``vectorized``
scope found alive (docs/reliability.md, "Mutation testing"); each turned red on its mutant (tried).

* Clients whose states hold different Python constants (not tensors) are vmapped in separate
  groups, each with its own constants (``_signature``).
* The client-by-client re-run of a block whose ``vmap`` raised gives ``client_update`` the
  round's context (``_run_sequentially``).
* The fast paths are the ones taken: a batched-draw algorithm draws once per block with the
  block's generator (a draw without the block dimension is refused), FedAvg's blocks run its
  fused ``block_update``, not ``vmap``, and data attributes reach vmapped clients.
* A block split into vmap groups (states with different keys) selects each group's rows of the
  block's stacked draws, keeps each group's keys, and its client-by-client re-run passes each
  client its own payload.
* NaN in one reply leaf or in a new state fails only that client (a finite reply whose sum
  overflows does not), vmapped or re-run; under ``raise`` the first failure in client order
  stops the round.
* The block-size memory estimates, ``StackedReplies``' and the client store's input checks, and
  ``run_round``'s defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local import fast_paths
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.rng import client_generator
from fedrisk.runtime import ClientFailure, vectorized
from fedrisk.runtime.executor import SequentialExecutor
from fedrisk.runtime.simulation import Simulation
from fedrisk.runtime.vectorized import VectorizedExecutor

N = 4
F64 = torch.float64


class Tagged(Algorithm):
    """Client ``k`` keeps ``{"w": tensor, "tag": k % 2}`` (a Python int) and replies
    ``w + tag + ctx.round``; ``fail`` makes that client's ``client_update`` raise, under ``vmap``
    too (the Cholesky factor of a matrix that is not positive definite)."""

    name = "tagged"

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: Any) -> dict:
        return {"bad": torch.tensor(1.0 if client == self.fail else 0.0, dtype=F64)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Any, data: LocalData, draws: Any
    ) -> ClientResult:
        sign = 1.0 - 2.0 * draws["bad"]
        check = torch.linalg.cholesky(sign * torch.eye(2, dtype=F64)).sum() * 0.0
        w = state["w"] + state["tag"] + ctx.round + check
        return ClientResult({"w": w}, {"w": w, "tag": state["tag"]}, {})


def _round(executor: Any, alg: Algorithm) -> Any:
    data = [LocalData(torch.zeros(2, 1, dtype=F64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * N
    states = {k: {"w": torch.full((1,), float(k), dtype=F64), "tag": k % 2} for k in range(N)}
    ctx = RoundContext(3, FedInfo(N, (2,) * N, 2))
    return executor.run_round(alg, ctx, RoundPlan(list(range(N))), states, data, 0, on_failure="skip")


@pytest.mark.parametrize("fail", [None, 1])
def test_constants_in_states_and_the_fallback_context(fail: int | None) -> None:
    want = _round(SequentialExecutor(), Tagged(fail))
    got = _round(VectorizedExecutor(), Tagged(fail))
    assert got.failed.keys() == want.failed.keys() == ({fail} if fail is not None else set())
    assert got.replies.clients == want.replies.clients
    for k in want.replies.clients:
        assert got.states[k]["tag"] == want.states[k]["tag"] == k % 2
        assert torch.equal(got.states[k]["w"], want.states[k]["w"])
        assert torch.equal(got.states[k]["w"], torch.full((1,), float(k) + k % 2 + 3, dtype=F64))


# ----------------------------------------------------------------------------- the fast paths
# The executor falls back silently (client-by-client draws, vmap instead of a block_update) when a
# fast path raises, so a broken fast path keeps every number right and only costs speed.
SIZES = (5, 9, 4, 7, 6, 8)


def _federation() -> Federation:
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randn(n, 3, generator=g, dtype=F64), torch.randint(0, 2, (n,), generator=g)) for n in SIZES]
    clients = [Samples(x, y) for x, y in rows]
    return Federation("toy", clients, num_classes=2)


CALLS: list[tuple[Any, ...]] = []


@dataclass(frozen=True)
class _DrawSpy(FedAvg):
    def draw(self, ctx, client, num_samples, rng):  # type: ignore[no-untyped-def]
        out = super().draw(ctx, client, num_samples, rng)
        CALLS.append((ctx.round, client.tolist() if isinstance(client, torch.Tensor) else client, num_samples))
        return out


def _fedavg(cls: type[FedAvg] = FedAvg) -> FedAvg:
    model = FunctionalModel(build_model("logreg", (3,), 2))
    return cls(model=model, loss=cross_entropy, lr=0.1, local_steps=2, batch_size=3)


def test_batched_draw_is_one_call_per_block_with_the_blocks_generator() -> None:
    CALLS.clear()
    sim = Simulation(_fedavg(_DrawSpy), _federation(), seed=5, dtype=F64, executor=VectorizedExecutor(block_size=4))
    sim.step()
    sim.step()
    assert [(r, ids) for r, ids, _ in CALLS] == [(0, [0, 1, 2, 3]), (0, [4, 5]), (1, [0, 1, 2, 3]), (1, [4, 5])]
    assert [n.tolist() for _, _, n in CALLS] == [list(SIZES[:4]), list(SIZES[4:])] * 2
    # the block's generator: row i is client i's own draw in that round
    alg, block = _fedavg(), torch.tensor([4, 5])
    stacked = alg.draw(None, block, torch.tensor(SIZES[4:]), client_generator(5, 1, [4, 5]))["batches"]
    for i, k in enumerate((4, 5)):
        assert torch.equal(stacked[i], alg.draw(None, k, SIZES[k], client_generator(5, 1, k))["batches"])


@dataclass(frozen=True)
class _UnbatchedDraw(FedAvg):
    leaf: str = "shape"

    def draw(self, ctx, client, num_samples, rng):  # type: ignore[no-untyped-def]
        out = super().draw(ctx, client, num_samples, rng)
        if isinstance(client, torch.Tensor):  # a block: return a leaf without the block dimension
            return {"batches": out["batches"][0]} if self.leaf == "shape" else {**out, "steps": 2}
        return out


@pytest.mark.parametrize(("leaf", "described"), [("shape", r"Tensor \(2, 3\)"), ("int", r"int \(\)")])
def test_a_batched_draw_of_the_wrong_shape_is_refused(leaf: str, described: str) -> None:
    alg = _UnbatchedDraw(model=FunctionalModel(build_model("logreg", (3,), 2)), loss=cross_entropy, leaf=leaf,
                         lr=0.1, local_steps=2, batch_size=3)  # fmt: skip
    sim = Simulation(alg, _federation(), seed=0, dtype=F64, executor=VectorizedExecutor(block_size=4))
    expected = r"^algorithm 'fedavg' sets batched_draw = True but its draw for a block of 4 clients returned "
    with pytest.raises(FedriskError, match=expected + rf"a leaf that is not a tensor \[4, \.\.\.\] \({described}\)"):
        sim.step()


def test_fedavg_blocks_run_the_fused_program_not_vmap(monkeypatch: pytest.MonkeyPatch) -> None:
    vmapped: list[int] = []
    original = vectorized.vmap
    monkeypatch.setattr(vectorized, "vmap", lambda *a, **kw: vmapped.append(1) or original(*a, **kw))
    sim = Simulation(_fedavg(), _federation(), seed=0, dtype=F64, executor=VectorizedExecutor(block_size=4))
    sim.step()
    assert vmapped == []  # both blocks: FedAvg.block_update
    with fast_paths(fused=False):
        sim.step()
    assert vmapped == [1, 1]


def test_memory_estimates_read_the_first_client_and_the_largest_participant() -> None:
    """``bytes_per_client`` and ``largest_leaf_per_client`` (the block-size heuristics): the
    payload and state of the round's first client, the rows of its largest participant."""
    data = [
        LocalData(torch.zeros(n, 3, dtype=F64), torch.zeros(n, dtype=torch.long), torch.tensor(n)) for n in (4, 9, 6)
    ]
    states = {0: {"c": torch.zeros(5, 7, dtype=F64)}, 1: {}, 2: {}}  # the first client, 0, has a state
    plan = RoundPlan([0, 2], broadcast={"w": torch.zeros(3, dtype=F64)})
    ex = VectorizedExecutor()
    row = ex._store_of(data).row_bytes
    assert row == 3 * 8 + 8
    assert (
        ex.bytes_per_client(plan, states, data)
        == vectorized.PARAM_COPIES * (3 * 8 + 35 * 8) + vectorized.DATA_COPIES * 6 * row
    )
    assert ex.largest_leaf_per_client(plan, states, data) == 35 * 8  # the state's 5 x 7 leaf, above 6 rows
    wide = RoundPlan([0, 1], broadcast={"w": torch.zeros(3, dtype=F64)})
    assert ex.largest_leaf_per_client(wide, states, data) == 9 * row  # client 1's 9 padded rows
    assert (
        ex.bytes_per_client(RoundPlan([]), states, data) == ex.largest_leaf_per_client(RoundPlan([]), states, data) == 1
    )
    bare = RoundPlan([1])  # no tensor in the payload or the state: the rows decide
    assert ex.largest_leaf_per_client(bare, states, data) == 9 * row


class Grouped(Algorithm):
    """Batched draws and clients in several vmap groups: client ``k``'s state is ``{"w": t}``
    (even ``k``) or ``{"v": t}`` (odd ``k``), so a block splits into two groups whose rows of the
    block's stacked draws must be selected; its payload ``{"p": k}`` is its own; ``fail`` makes
    that client raise under vmap too (as ``Tagged``), so its group re-runs client by client."""

    name = "grouped"
    batched_draw = True

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: Any) -> dict:
        ids = torch.as_tensor(client)
        return {"bad": (ids == (-1 if self.fail is None else self.fail)).to(F64), "id": ids.to(F64)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Any, data: LocalData, draws: Any
    ) -> ClientResult:
        check = torch.linalg.cholesky((1.0 - 2.0 * draws["bad"]) * torch.eye(2, dtype=F64)).sum() * 0.0
        key = "w" if "w" in state else "v"
        new = state[key] + payload["p"] + 10.0 * draws["id"] + check
        return ClientResult({"d": new}, {key: new}, {})


@pytest.mark.parametrize("fail", [None, 2])
def test_groups_select_their_rows_of_the_blocks_draws_and_keep_their_own_keys(fail: int | None) -> None:
    data = [LocalData(torch.zeros(2, 1, dtype=F64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * 6
    states = {k: {("w" if k % 2 == 0 else "v"): torch.full((1,), float(k), dtype=F64)} for k in range(6)}
    plan = RoundPlan(list(range(6)), per_client={k: {"p": torch.tensor(100.0 * k, dtype=F64)} for k in range(6)})
    ctx = RoundContext(0, FedInfo(6, (2,) * 6, 2))
    outs = [
        ex.run_round(Grouped(fail), ctx, plan, states, data, 0, on_failure="skip")
        for ex in (SequentialExecutor(), VectorizedExecutor(block_size=6))
    ]
    for out in outs:
        assert out.failed.keys() == ({fail} if fail is not None else set())
        for k in out.replies.clients:
            key = "w" if k % 2 == 0 else "v"
            assert list(out.states[k]) == [key]
            assert out.states[k][key].tolist() == [k + 100.0 * k + 10.0 * k]
    assert outs[0].replies.clients == outs[1].replies.clients


def test_the_client_store_names_what_does_not_stack() -> None:
    def data(n: int, width: int = 3, label_dtype: torch.dtype = torch.long, **attrs: torch.Tensor) -> LocalData:
        return LocalData(torch.zeros(n, width, dtype=F64), torch.zeros(n, dtype=label_dtype), torch.tensor(n), attrs)

    ex = VectorizedExecutor()
    with pytest.raises(FedriskError, match=r"^executor 'vectorized' needs at least one client$"):
        ex._store_of([])
    tail = r"; make them equal or use executor='sequential'$"
    head = r"^executor 'vectorized' stacks the clients' data: "
    with pytest.raises(FedriskError, match=head + r"client 1's x has rows of shape \(4,\) \(torch.float64, cpu\) "
                       r"but client 0's has \(3,\) \(torch.float64, cpu\)" + tail):  # fmt: skip
        ex._store_of([data(2), data(3, width=4)])
    with pytest.raises(FedriskError, match=r"client 1's y has rows of shape \(\) \(torch.int32, cpu\) but client 0's "
                       r"has \(\) \(torch.int64, cpu\)" + tail):  # fmt: skip
        ex._store_of([data(2), data(3, label_dtype=torch.int32)])
    with pytest.raises(FedriskError, match=r"client 1 has attributes \['g'\] but client 0 has \[\]; give every client "
                       r"the same attributes or use executor='sequential'$"):  # fmt: skip
        ex._store_of([data(2), data(3, g=torch.zeros(3))])
    with pytest.raises(FedriskError, match=r"client 1's attrs\['g'\] has rows of shape \(2,\)"):
        ex._store_of([data(2, g=torch.zeros(2, 1)), data(3, g=torch.zeros(3, 2))])


class Faulty(Algorithm):
    """Client ``k`` behaves by ``codes[k]``: 0 a finite reply, 1 NaN in the first reply leaf
    only, 2 a finite reply but a NaN new state, 3 finite entries whose sum overflows to inf, 4
    raises under vmap too (as ``Tagged``), so its group re-runs client by client."""

    name = "faulty"

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: Any) -> dict:
        return {"code": torch.tensor(float(self.codes[client]), dtype=F64)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Any, data: LocalData, draws: Any
    ) -> ClientResult:
        c = draws["code"]
        check = torch.linalg.cholesky((1.0 - 2.0 * (c == 4).to(F64)) * torch.eye(2, dtype=F64)).sum() * 0.0
        w = state["w"] + 1.0 + check
        nan = torch.tensor(float("nan"), dtype=F64)
        a = torch.where(c == 1, nan, torch.where(c == 3, torch.tensor(1e308, dtype=F64), w))
        new_state = torch.where(c == 2, nan, w)
        return ClientResult({"a": a, "b": w}, {"w": new_state}, {})


@pytest.mark.parametrize("codes", [[0, 1, 2, 3, 0, 1], [0, 1, 4, 2, 3, 0]], ids=["vmapped", "re-run"])
def test_nonfinite_replies_and_states_fail_their_client_only(codes: list[int]) -> None:
    """Under ``skip``: NaN in any reply leaf or in the new state fails the client, a finite reply
    whose sum overflows does not; the same in a vmapped block and in a re-run one.  Under
    ``raise`` the first failure in client order stops the round, the NaN reply of client 1
    before client 2's exception, as the sequential executor does."""
    n = len(codes)
    data = [LocalData(torch.zeros(2, 1, dtype=F64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * n
    states = {k: {"w": torch.zeros(2, dtype=F64)} for k in range(n)}
    ctx = RoundContext(0, FedInfo(n, (2,) * n, 2))
    bad = {k for k, c in enumerate(codes) if c in (1, 2, 4)}
    for ex in (SequentialExecutor(), VectorizedExecutor(block_size=n)):
        out = ex.run_round(Faulty(codes), ctx, RoundPlan(list(range(n))), states, data, 0, on_failure="skip")
        assert set(out.failed) == bad, type(ex).__name__
        assert out.replies.clients == [k for k in range(n) if k not in bad]
        for k in out.replies.clients:
            assert out.states[k]["w"].tolist() == [1.0, 1.0]
        big = [k for k, c in enumerate(codes) if c == 3]
        assert out.replies.gather("a")[out.replies.clients.index(big[0])].tolist() == [1e308, 1e308]
        nan_client = codes.index(1)
        assert out.failed[nan_client].startswith(f"client {nan_client} replied with NaN/inf values in round 0 (")
        with pytest.raises(ClientFailure, match=rf"^client {nan_client} replied with NaN/inf values in round 0 "):
            clean = [0 if c == 2 else c for c in codes]  # the NaN reply is the first failure
            ex.run_round(Faulty(clean), ctx, RoundPlan(list(range(n))), states, data, 0, on_failure="raise")


class Silent(Algorithm):
    """Empty replies (as local training) and a new state that is NaN for client 1."""

    name = "silent"

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Any, data: LocalData, draws: Any
    ) -> ClientResult:
        w = state["w"] + 1.0
        return ClientResult({}, {"w": w / (state["k"] - 1.0) * 0.0 + w}, {})  # 1 / 0 * 0: NaN for client 1


def test_a_nan_state_with_an_empty_reply_fails_its_client() -> None:
    data = [LocalData(torch.zeros(2, 1, dtype=F64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * 3
    states = {k: {"w": torch.full((1,), float(k), dtype=F64), "k": torch.tensor(float(k), dtype=F64)} for k in range(3)}
    ctx = RoundContext(0, FedInfo(3, (2,) * 3, 2))
    for ex in (SequentialExecutor(), VectorizedExecutor()):
        out = ex.run_round(Silent(), ctx, RoundPlan([0, 1, 2]), states, data, 0, on_failure="skip")
        assert set(out.failed) == {1} and out.replies.clients == [0, 2], type(ex).__name__


def test_stacked_replies_check_their_input_and_count_bytes_per_client() -> None:
    from fedrisk.runtime.vectorized import StackedReplies

    r = StackedReplies([0, 3], {"d": torch.zeros(2, 3), "e": {"f": torch.zeros(2, dtype=F64)}})
    sizes = r.nbytes()
    assert sizes == {0: 3 * 4 + 8, 3: 3 * 4 + 8} and all(type(v) is int for v in sizes.values())
    with pytest.raises(ValueError, match=r"^StackedReplies: clients must be sorted and distinct$"):
        StackedReplies([3, 0], {"d": torch.zeros(2, 3)})
    for leaf in (torch.zeros(()), torch.zeros(3, 1), 1.0):
        with pytest.raises(ValueError, match=r"^StackedReplies: every leaf of 'd' must be a tensor \[2, \.\.\.\]$"):
            StackedReplies([0, 3], {"d": leaf})
    with pytest.raises(ValueError, match=r"^no replies to aggregate$"):
        StackedReplies([], {"d": torch.zeros(0, 3)}).sum("d")


class Attributed(Algorithm):
    """Replies the sum of each client's per-row attribute ``g`` over its rows (padding masked)."""

    name = "attributed"

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Any, data: LocalData, draws: Any
    ) -> ClientResult:
        return ClientResult({"s": (data.attrs["g"] * data.valid()).sum()}, {}, {})


def test_data_attributes_reach_the_vmapped_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rerun(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the block was re-run client by client")

    monkeypatch.setattr(vectorized, "_run_sequentially", no_rerun)
    data = [
        LocalData(torch.zeros(n, 1, dtype=F64), torch.zeros(n, dtype=torch.long), torch.tensor(n),
                  {"g": torch.arange(n, dtype=F64)})
        for n in (2, 4, 3)
    ]  # fmt: skip
    ctx = RoundContext(0, FedInfo(3, (2, 4, 3), 2))
    out = VectorizedExecutor().run_round(Attributed(), ctx, RoundPlan([0, 1, 2]), {k: {} for k in range(3)}, data, 0)
    assert [float(x) for x in out.replies.gather("s")] == [1.0, 6.0, 3.0]


def test_run_round_defaults_to_raise_and_checks_the_algorithm_itself() -> None:
    data = [LocalData(torch.zeros(2, 1, dtype=F64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * 2
    states = {k: {"w": torch.zeros(2, dtype=F64)} for k in range(2)}
    ctx = RoundContext(0, FedInfo(2, (2, 2), 2))
    with pytest.raises(ClientFailure, match=r"^client 1 replied with NaN/inf values in round 0"):
        VectorizedExecutor().run_round(Faulty([0, 1]), ctx, RoundPlan([0, 1]), states, data, 0)

    class Scalar(Faulty):
        vectorizable = False
        not_vectorizable_reason = "it calls scipy"

    with pytest.raises(FedriskError, match=r"cannot run under executor='vectorized': it calls scipy"):
        VectorizedExecutor().run_round(Scalar([0, 0]), ctx, RoundPlan([0, 1]), states, data, 0)  # without prepare
