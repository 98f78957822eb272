"""PERM as its users run it (issue 28): partial participation, the honest training curve
(eq. (3)'s objective), the global model named as such, the lam thresholds, and the per-client
outputs clients.csv / alpha.csv."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedrisk import run_federation
from fedrisk.algorithms import PERM, FedAvg, PERMShuffling, PERMTwoStage
from fedrisk.algorithms.perm_weights import lambda_guide, mixing_weights, partner_thresholds, squared_distances
from fedrisk.api import run_simulation
from fedrisk.data.federation import Federation
from fedrisk.data.sources.synthetic import perm_two_cluster_federation
from fedrisk.errors import FedriskError
from fedrisk.experiment.personal_outputs import (
    ALPHA_CSV,
    CLIENTS_CSV,
    LAMBDA_GUIDE,
    personal_callbacks,
    plot_personal,
    read_alpha,
    read_clients,
)
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy, mean_squared_error
from fedrisk.rng import server_generator
from fedrisk.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _least_squares as _ls
from _least_squares import F64
from _least_squares import ZeroLinear as Linear


def least_squares(N: int, n: int = 10, seed: int = 0) -> Federation:
    """N clients of n rows, client k's shifted by 0.5 k (``_least_squares.least_squares``)."""
    return _ls.least_squares((n,) * N, seed)


def logreg() -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (6,), 2))


def clusters(N: int = 5) -> Federation:
    return perm_two_cluster_federation(N, samples_per_client=24, dim=6, test_per_client=8, seed=1)


# ----------------------------------------------------------------------------- partial participation


@pytest.mark.parametrize("cls", [PERM, PERMShuffling, PERMTwoStage])
def test_m_equal_to_n_is_full_participation_bit_for_bit(cls: type) -> None:
    kw = {"model": logreg(), "loss": cross_entropy, "lr": 0.5, "local_steps": 2, "batch_size": 4}
    if cls is not PERMShuffling:
        kw["lam"] = 0.3
    runs = []
    for m in (None, 5):
        sim = Simulation(cls(**kw, clients_per_round=m), clusters(5), seed=2, dtype=F64)
        reports = [sim.step() for _ in range(12)]  # two epochs
        runs.append((sim, reports))
    (a, ra), (b, rb) = runs
    # the full-participation schedule as it was before partial participation: every client in every
    # round, sigma_0 the first draw of the init generator (nothing drawn for S)
    assert all(r.clients == list(range(5)) for r in rb)
    first = Simulation(cls(**kw, clients_per_round=5), clusters(5), seed=2, dtype=F64).server_state["sigma"]
    assert torch.equal(first, torch.randperm(5, generator=server_generator(2, -1, "init")))
    assert [(r.clients, r.kind, r.train_metrics) for r in ra] == [(r.clients, r.kind, r.train_metrics) for r in rb]
    for key in a.server_state:
        x, y = a.server_state[key], b.server_state[key]
        same = all(torch.equal(x[k], y[k]) for k in x) if isinstance(x, dict) else torch.equal(x, y)
        assert same, key


def test_partial_epoch_equals_a_hand_transcription() -> None:
    """m = 3 of N = 5: one epoch moves only S's models among S's hosts, model i at host k with
    step lr * alpha_i(k) / sum_{l in S} alpha_i(l); eq. (3)'s objective from the hosts' losses."""
    N, m, K, lr, n = 5, 3, 2, 0.05, 10
    fed = least_squares(N, n)
    alg = PERMShuffling(model=Linear(), loss=mean_squared_error, lr=lr, local_steps=K, batch_size=n)
    alg = PERMShuffling(**{**alg.__dict__, "sampling": "shuffle", "clients_per_round": m})  # full-batch steps
    sim = Simulation(alg, fed, seed=4, dtype=F64)
    e = -torch.log(torch.rand(N, N, generator=torch.Generator().manual_seed(0), dtype=F64))
    alpha = e / e.sum(1, keepdim=True)
    sim.server_state["alpha"] = alpha
    S = sim.server_state["members"].tolist()
    sigma = sim.server_state["sigma"].tolist()
    assert len(S) == m and len(set(S)) == m
    v = sim.server_state["v"]["w"].clone()
    phi = torch.zeros(N, dtype=F64)
    for j in range(m):
        new = v.clone()
        for p, i in enumerate(S):  # the paper's i_j = sigma((i + j) mod m), 1-based j, on S's positions
            k = S[sigma[(p + j + 1) % m]]
            step = lr * alpha[i, k] / alpha[i, S].sum()
            w, x, y = v[i].clone(), fed.clients[k].x, fed.clients[k].y
            losses = []
            for _ in range(K):
                r = x @ w - y
                losses.append(0.5 * float((r**2).mean()))  # f_k(v) = ||x v - y||^2 / (2 n)
                w = w - step * x.T @ r / n
            new[i] = w
            phi[i] += float(step / lr) * sum(losses) / K
        v = new
        report = sim.step()
        assert report.clients == sorted(S)
    torch.testing.assert_close(sim.server_state["v"]["w"], v, rtol=1e-10, atol=1e-10)
    outside = [i for i in range(N) if i not in S]
    assert bool((sim.server_state["v"]["w"][outside] == 0).all())  # never trained
    assert sim.server_state["objective_seen"].tolist() == [i in S for i in range(N)]
    torch.testing.assert_close(sim.server_state["objective"][S], phi[S], rtol=1e-10, atol=1e-12)
    assert alg.state_metrics(sim.server_state, fed)["train_loss"] == pytest.approx(float(phi[S].mean()), rel=1e-10)
    assert int(sim.server_state["j"]) == 0 and len(sim.server_state["members"]) == m  # the next epoch's S


def test_partial_perm_estimates_the_sampled_rows_among_the_sampled() -> None:
    fed = clusters(6)
    alg = PERM(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=4, lam=0.5, clients_per_round=4)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    for _ in range(5):  # epoch 0 (alpha^0 uniform): 1 estimate + 4 shuffle rounds
        sim.step()
    S = sim.server_state["members"].tolist()
    report = sim.step()  # epoch 1's estimate round: only S uploads, and S's rows are solved among S
    assert report.kind == "estimate" and report.clients == S
    alpha = sim.server_state["alpha"]
    outside = [i for i in range(6) if i not in S]
    torch.testing.assert_close(alpha[S][:, S].sum(1), torch.ones(4, dtype=F64), rtol=0, atol=1e-12)
    assert bool((alpha[outside] == 1 / 6).all())  # the absent keep their (uniform) rows
    Dm = sim.server_state["discrepancy"][S][:, S]
    torch.testing.assert_close(alpha[S][:, S], mixing_weights(Dm, [fed.client_sizes[k] for k in S], 0.5))


def test_more_clients_per_round_than_clients_is_refused() -> None:
    alg = PERM(model=logreg(), loss=cross_entropy, clients_per_round=6)
    with pytest.raises(FedriskError, match=r"clients_per_round = 6 is more than the federation's 5 clients"):
        Simulation(alg, clusters(5))


# ----------------------------------------------------------------------------- honest curves


def test_train_loss_is_the_weighted_objective_and_the_global_model_is_named() -> None:
    fed = clusters(4)
    alg = PERM(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=4, lam=0.5)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    history = run_simulation(sim, 10, metrics=["accuracy"])
    first, last = history.records[0], history.records[-1]
    assert "train_loss" not in first  # no epoch has ended after round 1
    assert last["train_loss"] == float(sim.server_state["objective"].mean())  # eq. (3), not the hosts' mean loss
    assert "test_accuracy" not in last and "global_test_accuracy" in last
    assert next(iter(k for k in last if k != "round")).startswith("personal_")  # the headline comes first
    fixed = PERMShuffling(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=4)
    last = run_federation(fed, fixed, rounds=2, metrics=["accuracy"]).last()  # its w is never trained: not shown
    assert "personal_accuracy_mean" in last and not any(k.startswith(("test_", "global_")) for k in last)
    fedavg = run_federation(fed, FedAvg(model=logreg(), loss=cross_entropy), rounds=1, metrics=["accuracy"])
    assert "test_accuracy" in fedavg.last() and "global_test_accuracy" not in fedavg.last()


# ----------------------------------------------------------------------------- lam thresholds


@pytest.mark.parametrize("seed", [0, 1])
def test_partner_thresholds_give_the_number_of_non_zero_weights(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    Dm = squared_distances(torch.randn(7, 3, generator=g, dtype=F64))
    n = torch.randint(5, 50, (7,), generator=g)
    T = partner_thresholds(Dm, n)
    for i in range(7):
        for k in range(1, 7):  # strictly between thresholds k and k + 1: exactly k partners
            lo, hi = float(T[i, k - 1]), float(T[i, k])
            if hi - lo < 1e-9:
                continue
            lam = lo + 0.5 * (hi - lo) if lo > 0 else 0.5 * hi
            assert int((mixing_weights(Dm, n, lam)[i] > 0).sum()) == k, (i, k)
        assert int((mixing_weights(Dm, n, float(T[i, -1]) * 1.01 + 1e-9)[i] > 0).sum()) == 7
    assert "every client weights all 7" in lambda_guide(Dm, n, lam=1.0)


# ----------------------------------------------------------------------------- clients.csv / alpha.csv


def test_clients_and_alpha_files_hold_what_the_run_reported(tmp_path) -> None:
    fed = clusters(4)
    alg = PERM(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=4, lam=0.5)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    lines = []

    class Stream:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None: ...

    history = run_simulation(
        sim, 11, eval_every=5, metrics=["accuracy"], callbacks=personal_callbacks(tmp_path, Stream())
    )
    rows = read_clients(tmp_path / CLIENTS_CSV)
    assert [r["round"] for r in rows] == [5] * 4 + [10] * 4 + [11] * 4
    for record in history.records:
        mine = [r["accuracy"] for r in rows if r["round"] == record["round"]]
        assert sum(mine) / 4 == pytest.approx(record["personal_accuracy_mean"], abs=1e-12)
    assert {r["train_samples"] for r in rows} == set(fed.client_sizes) and {r["split"] for r in rows} == {"test"}
    mats = read_alpha(tmp_path / ALPHA_CSV)
    assert [m["round"] for m in mats] == [0, 6, 11]  # uniform alpha^0, then the estimates of rounds 5, 10 (0-based)
    torch.testing.assert_close(mats[-1]["alpha"], sim.server_state["alpha"], rtol=0, atol=0)
    guide = (tmp_path / LAMBDA_GUIDE).read_text()
    assert guide.startswith("round 6: PERM discrepancies") and "".join(lines) == guide
    drawn = plot_personal([("perm lam=0.5", [tmp_path]), ("absent", [tmp_path / "none"])], tmp_path / "report")
    assert [p.name for p in drawn] == ["clients_accuracy.png", "alpha_perm_lam_0.5.png"]
    # a resumed run drops the rows after its checkpoint before writing them again
    cb = personal_callbacks(tmp_path, None)
    sim.round = 5
    for c in cb:
        c.on_start(sim)
    assert {r["round"] for r in read_clients(tmp_path / CLIENTS_CSV)} == {5}
    assert [m["round"] for m in read_alpha(tmp_path / ALPHA_CSV)] == [0]


def test_clients_csv_holds_each_clients_validation_split_too(tmp_path) -> None:
    import dataclasses

    base = clusters(4)  # 24 training rows per client: the first 6 become its validation split
    fed = dataclasses.replace(
        base,
        clients=[c.subset(range(6, 24)) for c in base.clients],
        client_validations=[c.subset(range(6)) for c in base.clients],
    )
    alg = PERM(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=4, lam=0.5)
    sim = Simulation(alg, fed, seed=0, dtype=F64)
    history = run_simulation(sim, 7, eval_every=3, metrics=["accuracy"], callbacks=personal_callbacks(tmp_path, None))
    rows = read_clients(tmp_path / CLIENTS_CSV)
    assert [(r["round"], r["split"]) for r in rows[:8]] == [(3, "test")] * 4 + [(3, "validation")] * 4
    assert len(rows) == 3 * 8 and {r["train_samples"] for r in rows} == {18}
    assert {r["samples"] for r in rows if r["split"] == "validation"} == {6}
    assert {r["samples"] for r in rows if r["split"] == "test"} == {8}
    for record in history.records:
        valid = [r["accuracy"] for r in rows if r["round"] == record["round"] and r["split"] == "validation"]
        assert sum(valid) / 4 == pytest.approx(record["validation_personal_accuracy_mean"], abs=1e-12)
    # the last round's rows, recomputed here: client k's own model on its own validation rows
    for k, part in enumerate(fed.client_validations):
        logits = alg.model.apply(alg.personal_params(sim.server_state, sim.client_states[k], k), part.x.to(F64))
        expected = float((logits.argmax(dim=1) == part.y).to(F64).mean())
        (mine,) = [r["accuracy"] for r in rows if r["round"] == 7 and r["client"] == k and r["split"] == "validation"]
        assert mine == pytest.approx(expected, abs=1e-12)
    # the report's per-client box plot reads the test rows only
    from fedrisk.experiment.personal_outputs import _final_client_values

    assert _final_client_values(tmp_path, "accuracy") == [r["accuracy"] for r in rows[-8:-4]]
