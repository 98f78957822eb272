"""clients.csv / alpha.csv / lambda_guide.txt through the runner: written for a PERM run,
identical after a crash and resume (no row twice, none missing)."""

from __future__ import annotations

import pytest

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
