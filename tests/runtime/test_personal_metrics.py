"""Personalised evaluation scores every client's own model on that client's own test split.

The expected values are computed here by hand (argmax accuracy, mean and worst over clients)
from ``personal_params(server, client_states[k], k)`` and ``client_tests[k]``; the clients'
models and test splits are made different enough that evaluating every client with client 0's
model, or every model on client 0's split, gives other numbers (checked).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk.algorithms.local_only import LocalOnly
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.evaluation import CLIENT_STATS, evaluate
from fedrisk.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _distributed_cases as C


def _accuracy(alg: LocalOnly, params, split) -> float:
    return float((alg.model.apply(params, split.x).argmax(-1) == split.y).double().mean())


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_each_client_is_scored_with_its_own_model_on_its_own_split(executor: str) -> None:
    alg = LocalOnly(model=C.model(), loss=cross_entropy, lr=0.3, local_steps=3, batch_size=4)
    fed = C.federation()
    sim = Simulation(alg, fed, seed=3, dtype=torch.float64, executor=executor)
    for _ in range(2):
        sim.step()
    got = evaluate(alg, sim.server_state, sim.client_states, sim.federation, ["accuracy", "log_loss"])

    tests = sim.federation.client_tests
    own = [_accuracy(alg, alg.personal_params({}, sim.client_states[k], k), tests[k]) for k in range(fed.num_clients)]
    assert got["personal_accuracy_mean"] == pytest.approx(sum(own) / len(own), rel=1e-12)
    assert got["personal_accuracy_worst"] == pytest.approx(min(own), rel=1e-12)
    assert set(got) == {
        f"personal_{m}_{stat}" for m in ("accuracy", "log_loss") for stat in CLIENT_STATS
    }  # no global model: no test_* metrics

    # the test can tell the right model and split from the wrong ones
    first = alg.personal_params({}, sim.client_states[0], 0)
    with_model_0 = [_accuracy(alg, first, tests[k]) for k in range(fed.num_clients)]
    on_split_0 = [_accuracy(alg, alg.personal_params({}, sim.client_states[k], k), tests[0]) for k in range(7)]
    assert sum(with_model_0) != pytest.approx(sum(own)) or min(with_model_0) != pytest.approx(min(own))
    assert sum(on_split_0) != pytest.approx(sum(own)) or min(on_split_0) != pytest.approx(min(own))

    # log-loss: the worst client has the largest loss
    losses = []
    for k in range(fed.num_clients):
        logits = alg.model.apply(alg.personal_params({}, sim.client_states[k], k), tests[k].x)
        losses.append(float(torch.nn.functional.cross_entropy(logits, tests[k].y)))
    assert got["personal_log_loss_mean"] == pytest.approx(sum(losses) / len(losses), rel=1e-9)
    assert got["personal_log_loss_worst"] == pytest.approx(max(losses), rel=1e-9)
