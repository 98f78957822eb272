"""What makes ``fedrisk tune`` cheap beyond its trials (issue 24, "Speed and memory"): the
trials of a study load their data once per process, forked workers inherit it, a data check
is not repeated on unchanged tensors, and workers fork only when that is safe."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from fedrisk.data import build as build_mod
from fedrisk.data.build import build_federation, reuse_federations
from fedrisk.data.federation import Samples
from fedrisk.data.loaders import DATASETS
from fedrisk.data.validate import check_samples
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import resolve_config
from fedrisk.experiment.tune import run_tune, tune_spec
from fedrisk.experiment.tune_workers import forks
from fedrisk.registry import Entry

RAW = {
    "data": {"dataset": "breast_cancer", "num_clients": 3, "validation_fraction": 0.3},
    "model": {"name": "logreg"},
    "objective": {"name": "binary_cross_entropy"},
    "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 2},
    "run": {"rounds": 2, "eval_every": 1, "splits": ["test", "validation"], "metrics": ["auroc"], "threads": 1},
    "output": {"plots": False},
    "tune": {"space": {"algorithm.lr": "log:1e-3:1"}, "metric": "validation_auroc", "trials": 3},
}


def cfg_of(**over):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in RAW.items()}
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return resolve_config(raw)


@pytest.fixture
def loads(tmp_path, monkeypatch):
    """The breast-cancer loader, counting its calls in a file (forked workers append too)."""
    log = tmp_path / "loads.txt"
    log.touch()
    original = DATASETS.get("breast_cancer")

    @functools.wraps(original)
    def counted(*args, **kwargs):
        with open(log, "a") as fh:
            fh.write("load\n")
        return original(*args, **kwargs)

    monkeypatch.setitem(DATASETS._entries, "breast_cancer", Entry("breast_cancer", counted, "counted"))
    return lambda: len(log.read_text().splitlines())


def test_the_trials_of_a_tune_load_their_data_once(tmp_path, loads):
    cfg = cfg_of()
    result = run_tune(cfg, tmp_path / "study", tune_spec(cfg), plots=False)
    assert len(result.trials) == 3
    assert loads() == 1
    assert build_mod._reused is None  # the federations are let go with the study


def test_forked_workers_inherit_the_data_and_share_the_study(tmp_path, loads):
    cfg = cfg_of(tune={"trials": 4})
    spec = tune_spec(cfg, jobs=2)
    assert forks(cfg, spec)
    result = run_tune(cfg, tmp_path / "study", spec, plots=False)
    assert len(result.trials) == 4 and {t.state.name for t in result.trials} <= {"COMPLETE", "PRUNED"}
    assert len({t.user_attrs["run_dir"] for t in result.trials}) == 4
    assert all((tmp_path / "study" / f"worker{i}.log").is_file() for i in (0, 1))
    assert loads() == 1  # the tuner's, before forking: no worker loaded the data again


@pytest.mark.parametrize(
    ("threads", "cores", "fork"),
    [(1, 16, True), (2, 16, False), (0, 2, True), (0, 8, False)],
)
def test_workers_fork_only_when_each_trial_runs_one_thread(monkeypatch, threads, cores, fork):
    # torch's OpenMP runtime hangs in a forked child that runs multi-threaded work after the
    # parent did: fork only when the trials run on one thread
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    cfg = cfg_of(run={"threads": threads})
    assert forks(cfg, tune_spec(cfg, jobs=2)) is fork
    assert not forks(cfg, tune_spec(cfg, jobs=2, space=["run.threads=int:1:2"]))


def test_reused_federation_shares_tensors_not_containers():
    kw = {"seed": 3, "validation_fraction": 0.2}
    fresh = build_federation("wine", "dirichlet", 3, **kw)
    with reuse_federations():
        a = build_federation("wine", "dirichlet", 3, **kw)
        a.info["client_sizes"].append(-1)  # a caller changes its copy ...
        a.clients.pop()
        b = build_federation("wine", "dirichlet", 3, **kw)
        other = build_federation("wine", "dirichlet", 3, seed=4, validation_fraction=0.2)
    assert b.info == fresh.info and b.num_clients == 3  # ... the next one is untouched
    assert b.clients[0].x is a.clients[0].x  # the data is shared
    for mine, theirs in zip([*b.clients, b.validation, b.test], [*fresh.clients, fresh.validation, fresh.test]):
        assert torch.equal(mine.x, theirs.x) and torch.equal(mine.y, theirs.y)
    assert other.clients[0].x is not b.clients[0].x  # other arguments: built anew
    assert build_federation("wine", "dirichlet", 3, **kw).clients[0].x is not b.clients[0].x  # outside: fresh


def test_data_check_is_skipped_only_for_unchanged_tensors(monkeypatch):
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
    s = Samples(x, y)
    calls = []
    real = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(1) or real(t))
    check_samples(s, 2, "client 0")
    check_samples(Samples(x, y), 2, "client 0")  # the same tensors, another Samples: not scanned again
    assert len(calls) == 1
    x[1, 0] = float("nan")  # changed in place: scanned again, and the NaN is found
    with pytest.raises(FedriskError, match="client 0: 1 of 4 rows have NaN"):
        check_samples(s, 2, "client 0")
    y2 = torch.tensor([0, 1, 0, 1])
    check_samples(Samples(torch.zeros(4, 2), y2), 2, "client 1")
    y2[0] = 5
    with pytest.raises(FedriskError, match="label 5 is out of range"):
        check_samples(Samples(torch.zeros(4, 2), y2), 2, "client 1")


@pytest.mark.slow
def test_worker_module_runs_as_a_fresh_interpreter(tmp_path):
    # the spawn path (several threads per trial) still works end to end
    cfg = cfg_of(run={"threads": 2}, tune={"trials": 2})
    spec = tune_spec(cfg, jobs=2)
    assert not forks(cfg, spec)
    result = run_tune(cfg, tmp_path / "study", spec, plots=False)
    assert len(result.trials) == 2
    assert Path(tmp_path / "study" / "worker1.log").is_file()


def test_sweep_tune_builds_the_variants_shared_data_once(tmp_path, loads):
    from fedrisk.experiment.sweep import run_tuned_sweep

    cfg = cfg_of(tune={"trials": 2})
    variants = {
        "avg": {"algorithm.name": "fedavg", "tune.keys": ["algorithm.lr"]},
        "prox": {"algorithm.name": "fedprox", "tune.keys": ["algorithm.lr"]},
    }
    result = run_tuned_sweep(cfg, tmp_path, trials=2, variants=variants, seeds=[0], progress="none")
    assert not result.failed and len(result.points) == 2
    assert loads() == 1  # 2 variants x 2 trials (seed 0 is the best trial's run, copied)
    assert build_mod._reused is None
