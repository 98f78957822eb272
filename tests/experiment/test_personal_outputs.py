"""clients.csv / alpha.csv / lambda_guide.txt through the runner: written for a PERM run,
identical after a crash and resume (no row twice, none missing)."""

from __future__ import annotations

import pytest
import torch

from fedrisk.experiment import resolve_config, run_experiment
from fedrisk.experiment.personal_outputs import ALPHA_CSV, CLIENTS_CSV, LAMBDA_GUIDE, read_alpha

from .conftest import crash_at

RAW = {
    "data": {
        "dataset": "perm_synthetic",
        "partition": "by_attribute",
        "num_clients": 4,
        "client_test_fraction": 0.25,
        "dataset_options": {"samples_per_client": 40, "dim": 4, "test_per_client": 10},
    },
    "model": {"name": "logreg", "bias": False},
    "algorithm": {"name": "perm", "lam": 1.0, "lr": 0.5, "local_steps": 2, "batch_size": 8},
    "run": {"rounds": 12, "eval_every": 3, "checkpoint_every": 4, "metrics": ["accuracy"]},
}


def test_personal_files_survive_a_crash_and_resume(tmp_path, monkeypatch) -> None:
    cfg = resolve_config(RAW)
    run_experiment(cfg, tmp_path / "full", progress="none")
    full = {name: (tmp_path / "full" / name).read_text() for name in (CLIENTS_CSV, ALPHA_CSV, LAMBDA_GUIDE)}
    assert [m["round"] for m in read_alpha(tmp_path / "full" / ALPHA_CSV)] == [0, 6, 11]
    assert len(full[CLIENTS_CSV].splitlines()) == 1 + 4 * 4  # header + 4 evaluations x 4 clients
    with monkeypatch.context() as m:
        crash_at(m, 10)  # after the checkpoint of round 8 and the evaluation of round 9 (rewritten on resume)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_experiment(cfg, tmp_path / "part", progress="none")
    run_experiment(cfg, tmp_path / "part", resume=True, progress="none")
    for name, text in full.items():
        assert (tmp_path / "part" / name).read_text() == text, name


def test_ifca_memberships_per_evaluation_and_their_agreement_with_the_true_groups(tmp_path) -> None:

    from fedrisk import run_federation
    from fedrisk.algorithms import IFCA
    from fedrisk.data.sources.synthetic import perm_two_cluster_federation
    from fedrisk.experiment.personal_outputs import CLUSTERS_CSV, personal_callbacks, read_clusters
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import cross_entropy
    from fedrisk.runtime.simulation import Simulation

    fed = perm_two_cluster_federation(6, samples_per_client=40, dim=4, test_per_client=10, seed=1)
    model = FunctionalModel(build_model("logreg", (4,), 2, bias=False))
    alg = IFCA(model=model, loss=cross_entropy, num_clusters=3, lr=0.5, local_steps=3, batch_size=8)
    run_federation(fed, alg, rounds=4, eval_every=2, callbacks=personal_callbacks(tmp_path, stream=None))
    got = read_clusters(tmp_path / CLUSTERS_CSV)
    assert sorted(got) == [2, 4]
    sim, want = Simulation(alg, fed, seed=0), {}
    for r in range(1, 5):  # hand: every client's argmin_j of its full training loss at the round's cluster models
        models = sim.server_state["models"]
        want[r] = [
            min(
                range(3),
                key=lambda j, c=c: float(
                    torch.nn.functional.cross_entropy(model.apply({k: v[j] for k, v in models.items()}, c.x), c.y)
                ),
            )
            for c in fed.clients
        ]
        sim.step()
    for r in (2, 4):
        assert [c for c, _ in got[r]] == want[r]
        assert [g for _, g in got[r]] == ["0", "0", "0", "1", "1", "1"]


def test_cluster_table_scores_memberships_by_the_adjusted_rand_index(tmp_path) -> None:
    from fedrisk.data.federation import Federation, Samples
    from fedrisk.experiment.personal_outputs import cluster_table, true_groups

    def write(run, rows):
        run.mkdir()
        (run / "clusters.csv").write_text("round,client,cluster,group\n" + "".join(f"{r}\n" for r in rows))

    # a perfect recovery with renamed clusters, then a split that crosses the groups
    write(tmp_path / "a", ["5,0,1,x", "5,1,1,x", "5,2,0,y", "5,3,0,y", "9,0,2,x", "9,1,2,x", "9,2,0,y", "9,3,0,y"])
    write(tmp_path / "b", ["9,0,0,x", "9,1,1,x", "9,2,0,y", "9,3,1,y"])
    table = cluster_table([("ifca", [tmp_path / "a", tmp_path / "b"])])
    # hand ARI of b: contingency [[1,1],[1,1]], sum C(n_ij,2) = 0, rows/cols C(2,2)*2 = 2 each, C(4,2) = 6:
    # (0 - 2*2/6) / ((2+2)/2 - 2*2/6) = -(2/3) / (4/3) = -0.5
    assert "| ifca | 2 | 9/9 | 2/2 | 0.2500 ± 1.0607 | 1.0000 / -0.5000 | 5/– |" in table
    y = lambda *ks: torch.tensor(ks)  # noqa: E731
    fed = Federation("k", [Samples(torch.zeros(3, 1), y(2, 7, 7)), Samples(torch.zeros(2, 1), y(7, 2))], 10)
    assert true_groups(fed) == ["2+7", "2+7"]
