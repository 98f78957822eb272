"""Unit checks of the algorithm contract (``fedrisk.algorithms.base``) and of the sequential
executor's failure handling (``fedrisk.runtime.executor``), written for the mutants that the
mutation run of the ``contract`` scope found alive (docs/reliability.md, "Mutation testing").
Each test turned red on its mutant (tried)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.errors import FedriskError
from fedrisk.runtime.executor import (
    ClientFailure,
    SequentialExecutor,
    _provably_finite,
    check_reply,
    nonfinite_paths,
)

NAN = float("nan")


def test_size_weights_are_sample_fractions() -> None:
    fed = FedInfo(num_clients=3, client_sizes=(1, 2, 5), num_classes=2)
    assert fed.total_size == 8
    assert fed.size_weights([0, 2]) == {0: 1 / 6, 2: 5 / 6}  # n_k / sum over the given clients


def test_round_plan_checks_its_clients_and_payloads() -> None:
    plan = RoundPlan([3, 1], broadcast={"w": 0}, per_client={1: {"v": 1}, 3: {"v": 3}})
    assert plan.clients == [1, 3] and plan.payload(3) == {"w": 0, "v": 3}
    with pytest.raises(ValueError, match=r"^RoundPlan.clients contains duplicates$"):
        RoundPlan([1, 2, 1])
    with pytest.raises(ValueError, match=r"^RoundPlan.per_client has no payload for clients \[2, 5\]$"):
        RoundPlan([1, 2, 5], per_client={1: {}})


def test_valid_is_a_float_mask_of_the_real_rows() -> None:
    data = LocalData(torch.zeros(4, 1, dtype=torch.float64), torch.zeros(4), torch.tensor(2))
    mask = data.valid()
    assert mask.dtype == torch.float64 and mask.tolist() == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("per_round", [None, 5, 9])
def test_sampling_every_client_draws_nothing(per_round: int | None) -> None:
    """``clients_per_round >= N`` is full participation, the same run as None: the server's
    generator is not advanced (later server draws are those of a full-participation run)."""
    gen = torch.Generator().manual_seed(3)
    before = gen.get_state()
    assert sample_clients(gen, 5, per_round) == [0, 1, 2, 3, 4]
    assert torch.equal(gen.get_state(), before)


def test_sampling_some_clients() -> None:
    gen, ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    got = sample_clients(gen, 10, 4)
    assert got == sorted(torch.randperm(10, generator=ref)[:4].tolist()) and len(set(got)) == 4


def test_nonfinite_paths_name_dict_keys_and_fields() -> None:
    nan, ok = torch.tensor([NAN]), torch.ones(1)
    tree = {
        "a": {"b": nan},
        "c": [ok, torch.tensor([float("inf")])],  # sequence positions are left out of the path
        "i": torch.tensor([1]),  # integer leaves cannot be NaN
        "s": 3,  # nor can non-tensor leaves
        "d": ok,
    }
    assert nonfinite_paths(tree) == ["a.b", "c"]
    assert nonfinite_paths(tree, limit=1) == ["a.b"]
    assert nonfinite_paths(ClientResult({"w": nan}, {}, {})) == ["reply.w"]  # a named field
    assert nonfinite_paths(nan) == ["?"]  # a bare tensor has no path
    assert nonfinite_paths({"a": ok}) == []
    assert nonfinite_paths({f"k{i}": nan for i in range(6)}) == ["k0", "k1", "k2", "k3"]  # 4 by default


def test_finiteness_proof_over_mixed_dtypes() -> None:
    """One sum per dtype: float32 and float64 leaves in one round are proved finite together."""
    mixed = [{"a": torch.ones(3, dtype=torch.float32), "b": torch.ones(2, dtype=torch.float64)}] * 3
    assert _provably_finite(mixed)
    assert not _provably_finite([*mixed, {"b": torch.tensor([1.0, NAN], dtype=torch.float64)}])
    assert not _provably_finite([{"a": torch.full((2,), 3e38)}])  # a finite overflow: not proved, checked one by one


def test_check_reply_names_the_client_round_and_leaf() -> None:
    bad = {"w": {"v": torch.tensor([1.0, NAN])}}
    reason = "client 3 replied with NaN/inf values in round 7 (reply or new client state; first non-finite leaf: w.v)"
    assert check_reply(3, 7, bad, "skip") == reason
    assert check_reply(3, 7, {"w": torch.ones(2)}, "skip") is None
    with pytest.raises(ClientFailure) as info:
        check_reply(3, 7, bad, "raise")
    assert str(info.value) == reason + " (set on_client_failure='skip' to drop such replies)"


# -- the sequential executor's failure handling ------------------------------------------------


class Scripted(Algorithm):
    """Each client replies ``{"w": [k]}``; ``faults[k]`` makes client ``k`` reply NaN (``"nan"``),
    raise a RuntimeError (``"raise"``) or a FedriskError (``"user"``, a user error)."""

    name = "scripted"

    def __init__(self, faults: Mapping[int, str]) -> None:
        self.faults = dict(faults)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: Any) -> dict:
        return {"k": torch.tensor(float(client), dtype=torch.float64)}

    def client_update(self, ctx, payload, state, data, draws) -> ClientResult:  # type: ignore[no-untyped-def]
        k = int(draws["k"])
        fault = self.faults.get(k)
        if fault == "raise":
            raise RuntimeError(f"client {k} crashed")
        if fault == "user":
            raise FedriskError(f"client {k}: a user error")
        w = torch.full((1,), NAN if fault == "nan" else float(k), dtype=torch.float64)
        return ClientResult({"w": w}, state, {})


def _round(faults: Mapping[int, str], **kw: Any) -> Any:
    n = 4
    data = [LocalData(torch.zeros(2, 1, dtype=torch.float64), torch.zeros(2, dtype=torch.long), torch.tensor(2))] * n
    ctx = RoundContext(5, FedInfo(n, (2,) * n, 2))
    states = {k: {} for k in range(n)}
    return SequentialExecutor().run_round(Scripted(faults), ctx, RoundPlan(list(range(n))), states, data, 0, **kw)


def test_the_default_policy_raises() -> None:
    with pytest.raises(ClientFailure, match=r"client 2 failed in round 5: RuntimeError\('client 2 crashed'\)"):
        _round({2: "raise"})


def test_an_earlier_nan_reply_is_named_before_a_later_failure() -> None:
    """Under ``raise`` the clients are checked in order: client 0's NaN stops the round before
    client 2's FedriskError or crash; under ``skip`` a user error is never skipped."""
    with pytest.raises(ClientFailure, match=r"client 0 replied with NaN/inf values in round 5"):
        _round({0: "nan", 2: "user"}, on_failure="raise")
    with pytest.raises(FedriskError, match=r"client 2: a user error"):
        _round({0: "nan", 2: "user"}, on_failure="skip")
    with pytest.raises(ClientFailure, match=r"client 0 replied with NaN/inf values in round 5"):
        _round({0: "nan", 2: "raise"}, on_failure="raise")


def test_skip_keeps_the_others_and_reports_failures_in_client_order() -> None:
    out = _round({3: "raise", 0: "nan"}, on_failure="skip")
    assert out.replies.clients == [1, 2] and sorted(out.states) == [1, 2]
    assert list(out.failed) == [0, 3]
    assert out.failed[3] == "RuntimeError('client 3 crashed')" and "client 0 replied with NaN/inf" in out.failed[0]
    with pytest.raises(ClientFailure, match=r"every client failed in round 5"):
        _round(dict.fromkeys(range(4), "raise"), on_failure="skip")
