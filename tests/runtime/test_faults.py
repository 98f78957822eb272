"""Failing clients (``fedrisk.runtime.faults``): under ``on_client_failure = "skip"`` a run in
which chosen clients raise, miss the deadline or reply NaN / inf in chosen rounds equals the run
in which those clients were absent from those rounds (weights renormalised, their persistent
state untouched), for every registered algorithm under the sequential and the vectorised
executor; no non-finite reply ever reaches ``aggregate``; ``min_replies`` stops a round with too
few replies before anything changes.  The distributed executor runs the same fault cases in
``_distributed_cases.py`` (``faults/*``) and must equal the sequential executor there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk.aggregators import AGGREGATORS
from fedrisk.algorithms import ALGORITHMS
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.errors import FedriskError
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.executor import ClientFailure
from fedrisk.runtime.faults import Absent, Fault, FaultInjected
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import tree_all_finite

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _distributed_cases as C

ROUNDS = 3
# every registered algorithm but centralised training (one pooled client: nothing to drop)
FEDERATED = [n for n in ALGORITHMS.names() if not getattr(ALGORITHMS.get(n), "requires_pooled_data", False)]
KINDS = {
    "raise": [Fault(1, 0, "raise"), Fault(4, 1, "raise")],
    "deadline": [Fault(2, 1, "deadline"), Fault(0, 2, "deadline")],
    "nan": [Fault(1, 0, "nan"), Fault(5, 2, "nan")],
    "inf": [Fault(3, 1, "inf"), Fault(6, 1, "inf")],
    "mixed": [Fault(0, 0, "nan"), Fault(1, 0, "raise"), Fault(2, 1, "deadline"), Fault(3, 1, "inf")],
}


class Guarded(FaultInjected):
    """FaultInjected whose ``aggregate`` first checks that every reply it is given is finite."""

    def aggregate(self, ctx, server_state, plan, replies, gen):
        for k, reply in replies.as_dict().items():
            assert tree_all_finite(reply), f"a non-finite reply of client {k} reached aggregate in round {ctx.round}"
        return super().aggregate(ctx, server_state, plan, replies, gen)


def _run(alg, fed, executor: str, **kwargs) -> Simulation:
    sim = Simulation(alg, fed, seed=C.SEED, dtype=torch.float64, executor=executor, **kwargs)
    for _ in range(ROUNDS):
        sim.step()
    return sim


def _compare(a: Simulation, b: Simulation, exact: bool) -> None:
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-10, "atol": 1e-12}
    C.assert_same(a.server_state, b.server_state, path="server_state", **tol)
    C.assert_same(a.client_states, b.client_states, path="client_states", **tol)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("kind", [k if k == "mixed" else pytest.param(k, marks=pytest.mark.slow) for k in KINDS])
@pytest.mark.parametrize("name", FEDERATED)
def test_skipped_faults_equal_absent_clients(name: str, kind: str, executor: str) -> None:
    alg, fed, _ = C.config_algorithm(name)
    faults = KINDS[kind]
    got = _run(Guarded(alg, faults), fed, executor, on_client_failure="skip")
    want = _run(Absent(alg, faults), fed, executor)
    _compare(got, want, exact=executor == "sequential")


def test_failures_are_reported_per_round() -> None:
    alg, fed, _ = C.config_algorithm("scaffold")
    sim = Simulation(
        FaultInjected(alg, KINDS["mixed"]), fed, seed=C.SEED, dtype=torch.float64, on_client_failure="skip"
    )
    reports = [sim.step() for _ in range(ROUNDS)]
    assert [sorted(r.failed) for r in reports] == [[0, 1], [2, 3], []]
    assert "injected failure of client 1 in round 0" in reports[0].failed[1]
    assert "missed the deadline of round 1" in reports[1].failed[2]
    assert "NaN/inf" in reports[0].failed[0] and "NaN/inf" in reports[1].failed[3]
    assert [r.clients for r in reports] == [[2, 3, 4, 5, 6], [0, 1, 4, 5, 6], list(range(7))]


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
@pytest.mark.parametrize("kind", ["raise", "deadline", "nan", "inf"])
def test_raise_policy_names_the_client(kind: str, executor: str) -> None:
    alg, fed, _ = C.config_algorithm("fedavg")
    sim = Simulation(FaultInjected(alg, [Fault(3, 1, kind)]), fed, seed=C.SEED, dtype=torch.float64, executor=executor)
    sim.step()
    before = sim.server_state
    with pytest.raises(ClientFailure, match=r"client 3 .*in round 1"):
        sim.step()
    assert sim.round == 1 and sim.server_state is before


@pytest.mark.parametrize("aggregator", AGGREGATORS.names())
@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_every_aggregator_sees_only_finite_replies(aggregator: str, executor: str) -> None:
    fed = C.federation()
    opts = {"f": 0} if aggregator == "bulyan" else {}  # Bulyan needs n >= 4f + 3: 5 finite replies of 7 allow f = 0

    def alg() -> FedAvg:  # a fresh aggregator per run (centered_clipping_momentum keeps state between rounds)
        return FedAvg(model=C.model(), loss=cross_entropy, aggregator=AGGREGATORS.get(aggregator)(**opts), **C.SMALL)

    faults = KINDS["nan"] + KINDS["inf"]
    got = _run(Guarded(alg(), faults), fed, executor, on_client_failure="skip")
    want = _run(Absent(alg(), faults), fed, executor)
    _compare(got, want, exact=executor == "sequential")


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_min_replies_stops_a_round_with_too_few(executor: str) -> None:
    alg, fed, _ = C.config_algorithm("scaffold")
    faults = [Fault(k, 1, "raise") for k in range(4)]  # 3 of 7 clients reply in round 1
    sim = Simulation(
        FaultInjected(alg, faults), fed, seed=C.SEED, dtype=torch.float64, executor=executor,
        on_client_failure="skip", min_replies=4,
    )  # fmt: skip
    sim.step()
    server, clients, ledger = sim.server_state, dict(sim.client_states), sim.ledger.state_dict()
    with pytest.raises(
        ClientFailure, match=r"round 1 \(scaffold\): 3 of 7 clients replied, fewer than min_replies = 4"
    ):
        sim.step()
    assert sim.round == 1 and sim.server_state is server and sim.ledger.state_dict() == ledger
    assert all(sim.client_states[k] is clients[k] for k in clients)
    # with min_replies = 3 the same round goes through
    ok = Simulation(FaultInjected(alg, faults), fed, seed=C.SEED, dtype=torch.float64, on_client_failure="skip",
                    min_replies=3)  # fmt: skip
    ok.step(), ok.step()
    assert ok.round == 2


def test_bad_fault_and_min_replies_input() -> None:
    with pytest.raises(FedriskError, match=r"unknown fault kind 'crash'.*Valid choices: deadline, inf, nan, raise"):
        Fault(0, 0, "crash")
    with pytest.raises(FedriskError, match=r"a fault needs client >= 0 and round >= 0"):
        Fault(-1, 0)
    alg, fed, _ = C.config_algorithm("fedavg")
    with pytest.raises(FedriskError, match=r"faults name clients \[9\]; the federation has 7"):
        Simulation(FaultInjected(alg, [Fault(9, 0)]), fed)
    with pytest.raises(FedriskError, match=r"min_replies = 0 is out of range"):
        Simulation(alg, fed, min_replies=0)
