"""Clients that join after training (issue 28): PERM's weights from one discrepancy round at
the trained global model, the other methods' own client updates, the CLI, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from fedrisk.algorithms import APPLE, IFCA, PERM, FedAvg, FedFomo, LocalizedFedAvg
from fedrisk.algorithms.perm_weights import mixing_weights_pgd
from fedrisk.cli import main
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.sources.synthetic import perm_two_cluster_federation
from fedrisk.errors import FedriskError
from fedrisk.experiment import resolve_config, run_experiment
from fedrisk.experiment.new_clients import personalise_new_clients, select_clients
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import tree_flatten_vector

F64 = torch.float64
FED = perm_two_cluster_federation(8, samples_per_client=60, dim=5, test_per_client=20, seed=0)  # clusters 0-3, 4-7
TRAIN, NEW = select_clients(FED, [0, 1, 2, 4, 5, 6]), select_clients(FED, [3, 7])


def logreg() -> FunctionalModel:
    return FunctionalModel(build_model("logreg", (5,), 2, bias=False))


def trained(alg, rounds: int = 14) -> Simulation:
    sim = Simulation(alg, TRAIN, seed=0, dtype=F64)
    for _ in range(rounds):
        sim.step()
    return sim


def test_perm_new_clients_weigh_their_own_cluster_by_eq_2_at_the_trained_model() -> None:
    lam = 5.0  # inside the range where the number of partners changes (lambda_guide: 0.23 .. 52)
    alg = PERM(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=3, batch_size=8, lam=lam)
    sim = trained(alg)
    out = personalise_new_clients(sim, NEW, ["accuracy"], epochs=4)
    w = sim.server_state["w"]
    clients = [*TRAIN.clients]
    for c, new in enumerate(NEW.clients):  # hand: full gradients at w, pairwise distances, the PGD oracle
        grads = []
        for s in [*clients, new]:
            p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            loss = torch.nn.functional.cross_entropy(alg.model.apply(p, s.x.to(F64)), s.y)
            grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(p.values()))]))
        G = torch.stack(grads)
        D = ((G[:, None] - G[None]) ** 2).sum(-1)
        want = mixing_weights_pgd(D, [60] * 7, lam, steps=3000)[6]
        torch.testing.assert_close(out.weights[c], want, rtol=0, atol=1e-6)
        same = [0, 1, 2] if c == 0 else [3, 4, 5]  # TRAIN positions of the new client's cluster
        assert float(out.weights[c][same].sum() + out.weights[c][6]) > 0.99
        assert int((out.weights[c][same] > 0).sum()) >= 1  # it learns from peers, not alone
    global_acc = [float((alg.model.apply(w, t.x.to(F64)).argmax(1) == t.y).double().mean()) for t in NEW.client_tests]
    assert out.summary["personal_accuracy_mean"] > sum(global_acc) / 2 + 0.1  # personal beats the global model
    assert [r["client"] for r in out.rows] == [0, 1] and [r["test_samples"] for r in out.rows] == [20, 20]


def test_ifca_and_fedavg_ft_use_their_own_client_rule() -> None:
    sim = trained(IFCA(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=3, batch_size=8), rounds=4)
    out = personalise_new_clients(sim, NEW, ["accuracy"])
    models = sim.server_state["models"]
    for c, s in enumerate(NEW.clients):  # the cluster model with the smallest training loss
        losses = [
            float(
                torch.nn.functional.cross_entropy(
                    sim.algorithm.model.apply({k: v[j] for k, v in models.items()}, s.x.to(F64)), s.y
                )
            )
            for j in range(2)
        ]
        j = min(range(2), key=lambda j: losses[j])
        assert all(torch.equal(out.params[c][k], models[k][j]) for k in models)
    ft = LocalizedFedAvg(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=8, finetune_steps=5)
    sim = trained(ft, rounds=3)
    out = personalise_new_clients(sim, NEW, ["accuracy"])
    moved = tree_flatten_vector(out.params[0]) - tree_flatten_vector(sim.server_state["params"])
    assert float(moved.norm()) > 1e-3  # fine-tuned from w
    sim = trained(FedFomo(model=logreg(), loss=cross_entropy, lr=0.5, local_steps=2, batch_size=8), rounds=2)
    out = personalise_new_clients(sim, NEW, ["accuracy"])  # downloads, eq. (6)-(7), local steps
    assert len(out.rows) == 2 and all(0.0 <= r["accuracy"] <= 1.0 for r in out.rows)


def _ce(alg, params, x, y):
    return torch.nn.functional.cross_entropy(alg.model.apply(params, x.to(F64)), y)


def test_apple_new_clients_learn_their_dr_vector_on_their_own_data_with_the_cores_frozen() -> None:
    # full batches (a shuffled batch of all 60 rows) so that the hand loop needs no minibatch draws
    alg = APPLE(
        model=logreg(), loss=cross_entropy, lr=0.5, dr_lr=0.5, local_steps=2, batch_size=60, sampling="shuffle",
        mu=0.3, decay_rounds=4,
    )  # fmt: skip
    sim = trained(alg, rounds=6)
    cores = {k: v.clone() for k, v in sim.server_state["cores"].items()}
    out = personalise_new_clients(sim, NEW, ["accuracy"], rounds=3)
    assert all(torch.equal(sim.server_state["cores"][k], cores[k]) for k in cores)  # frozen
    N = 6
    for c, s in enumerate(NEW.clients):  # hand: SGD on p only, lam(r) = (1 + cos(pi r / L)) / 2 from r = 0
        p0 = torch.full((N,), 1.0 / N, dtype=F64)
        p = p0.clone()
        for r in range(3):
            lam = 0.5 * (1 + math.cos(math.pi * r / 4)) * 0.3
            for _ in range(2):
                phi = {k: (p.reshape(-1, 1, 1) * v).sum(0).requires_grad_(True) for k, v in cores.items()}
                g = torch.autograd.grad(_ce(alg, phi, s.x, s.y), list(phi.values()))
                dots = sum((gx.unsqueeze(0) * v).reshape(N, -1).sum(1) for gx, v in zip(g, cores.values()))
                p = p - 0.5 * (dots + lam * (p - p0))
        torch.testing.assert_close(out.weights[c], p, rtol=1e-10, atol=1e-12)
        for k in cores:
            torch.testing.assert_close(out.params[c][k], (p.reshape(-1, 1, 1) * cores[k]).sum(0))
        own, other = ([0, 1, 2], [3, 4, 5]) if c == 0 else ([3, 4, 5], [0, 1, 2])  # TRAIN positions per cluster
        assert float(p[own].sum()) > float(p[other].sum()) + 0.5  # it learns whom to learn from
    assert out.weights.shape == (2, 6) and not out.self_column


def test_fedfomo_new_clients_mix_the_downloads_by_their_validation_gain() -> None:
    # num_download = N: every training model is downloaded; batch = the 48 training rows (60 - 12 validation)
    alg = FedFomo(
        model=logreg(), loss=cross_entropy, lr=0.3, local_steps=2, batch_size=48, sampling="shuffle",
        num_download=6, val_fraction=0.2,
    )  # fmt: skip
    sim = trained(alg, rounds=3)
    init = Simulation(alg, TRAIN, seed=0, dtype=F64).client_states[0]["model"]  # the run's initial model
    models = sim.server_state["models"]
    out = personalise_new_clients(sim, NEW, ["accuracy"])
    for c, s in enumerate(NEW.clients):  # hand: eqs. (6)-(7) on the last 12 rows, then 2 full-batch steps
        xv, yv, xt, yt = s.x[48:], s.y[48:], s.x[:48], s.y[:48]
        own = torch.cat([init[k].reshape(-1) for k in sorted(init)])
        base = float(_ce(alg, init, xv, yv))
        gains = []
        for j in range(6):
            theta = {k: v[j] for k, v in models.items()}
            dist = torch.cat([theta[k].reshape(-1) for k in sorted(theta)]) - own
            gains.append((base - float(_ce(alg, theta, xv, yv))) / float(dist.norm()))
        pos = torch.tensor(gains, dtype=F64).clamp_min(0)
        assert float(pos.sum()) > 0
        v = {k: init[k] + sum(float(pos[j] / pos.sum()) * (models[k][j] - init[k]) for j in range(6)) for k in init}
        for _ in range(2):
            q = {k: t.clone().requires_grad_(True) for k, t in v.items()}
            g = torch.autograd.grad(_ce(alg, q, xt, yt), list(q.values()))
            v = {k: v[k] - 0.3 * gk for k, gk in zip(q, g)}
        for k in v:
            torch.testing.assert_close(out.params[c][k], v[k])


def test_bad_new_clients_are_refused() -> None:
    sim = trained(FedAvg(model=logreg(), loss=cross_entropy), rounds=1)
    with pytest.raises(FedriskError, match=r"fedavg has no personal models"):
        personalise_new_clients(sim, NEW)
    sim = trained(PERM(model=logreg(), loss=cross_entropy, lam=1.0), rounds=1)
    three = Federation("3 classes", NEW.clients, 3, client_tests=NEW.client_tests)
    with pytest.raises(FedriskError, match=r"new clients: 3 classes differ from the run's 2"):
        personalise_new_clients(sim, three)
    wide = Samples(torch.zeros(4, 6), torch.zeros(4, dtype=torch.long))
    with pytest.raises(FedriskError, match=r"inputs of shape \[6\] differ from the run's \[5\]"):
        personalise_new_clients(sim, Federation("wide", [wide], 2, client_tests=[wide]))


def test_cli_evaluates_new_clients_of_a_finished_run(tmp_path, capsys) -> None:
    data = {
        "dataset": "perm_synthetic",
        "partition": "by_attribute",
        "num_clients": 4,
        "client_test_fraction": 0.25,
        "dataset_options": {"samples_per_client": 40, "dim": 4, "test_per_client": 10},
    }
    raw = {
        "data": data,
        "model": {"name": "logreg", "bias": False},
        "algorithm": {"name": "perm", "lam": 1.0, "lr": 0.5, "local_steps": 2, "batch_size": 8},
        "run": {"rounds": 5, "metrics": ["accuracy"]},
    }
    run = run_experiment(resolve_config(raw), tmp_path / "run", progress="none").path
    (tmp_path / "new.toml").write_text(
        '[data]\ndataset = "perm_synthetic"\npartition = "by_attribute"\nnum_clients = 4\nseed = 7\n'
        "client_test_fraction = 0.25\n[data.dataset_options]\nsamples_per_client = 40\ndim = 4\ntest_per_client = 10\n"
        "[new_clients]\nclients = [1, 2]\n"
    )
    assert main(["evaluate", str(run), "--new-clients", str(tmp_path / "new.toml"), "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "| client | test samples | accuracy | largest weights" in out and "personal_accuracy_mean = " in out
    assert len((run / "new_clients.csv").read_text().splitlines()) == 3
    (tmp_path / "bad.toml").write_text((tmp_path / "new.toml").read_text() + '[model]\nname = "mlp"\n')
    assert main(["evaluate", str(run), "--new-clients", str(tmp_path / "bad.toml")]) == 2
    assert "[model] differs from the run's in name" in capsys.readouterr().err
