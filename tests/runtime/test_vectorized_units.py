"""Vectorised-executor cases written for the mutants that the mutation run of the ``vectorized``
scope found alive (docs/reliability.md, "Mutation testing"); each turned red on its mutant (tried).

* Clients whose states hold different Python constants (not tensors) are vmapped in separate
  groups, each with its own constants (``_signature``).
* The client-by-client re-run of a block whose ``vmap`` raised gives ``client_update`` the
  round's context (``_run_sequentially``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.runtime.executor import SequentialExecutor
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
