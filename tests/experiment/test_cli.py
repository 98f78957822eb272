"""The command line: commands, exit codes, user-error messages without tracebacks, and a real
SIGTERM to a ``python -m fedrisk run`` subprocess followed by an exact resume."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedrisk.cli import main
from fedrisk.experiment import resolve_config, run_experiment
from fedrisk.runtime.distributed import free_port

from .conftest import records, without_time, write_config

REPO = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


@pytest.fixture
def config(tmp_path, tiny) -> Path:
    return write_config(tmp_path / "tiny.toml", tiny)


def test_run_prints_the_results_table(capsys, config, tmp_path):
    code, out, err = run_cli(capsys, "run", config, "--out", tmp_path / "r", "--plain", "--set", "run.rounds=2")
    assert code == 0
    assert out.startswith("finished fedavg on digits-dirichlet-K3: 2 rounds in ")
    assert "| metric | final |" in out and "| test_accuracy | " in out and "best" not in out
    assert "no model selection (run.select_by: no validation split)" in out
    assert f"outputs in {tmp_path / 'r'}" in out
    assert [line.split(" | ")[0] for line in err.splitlines()] == ["round 1/2", "round 2/2"]  # plain progress


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "algorithm.lrr=0.1"], "error: unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?)"),
        (["--set", "algorithm.name=fedav"], 'error: algorithm.name = "fedav" is not a known name (did you mean'),
        (["--set", "run.rounds=-1"], "error: run.rounds = -1 is out of range; allowed: [1, inf)"),
        (["--set", "run.rounds=many"], 'error: run.rounds = "many" has the wrong type; allowed: an integer'),
        (["--set", "rounds"], "error: --set expects key=value with a dotted key"),
        (["--set", "data.dataset_options.flaten=true"], "error: unknown key 'data.dataset_options.flaten' (did"),
    ],
)
def test_bad_config_input_is_one_error_line(capsys, config, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "run", config, "--out", tmp_path / "r", *argv)
    assert code == 2
    assert err.startswith(message)
    assert not (tmp_path / "r").exists()  # validated before anything was written


def test_missing_data_root_is_one_error_line_and_writes_nothing(capsys, config, tmp_path):
    """Issue 30: `--set data.data_root=/no/such/dir` with fashion_mnist named the folder only
    after training on the system copy; now it is refused before anything is written."""
    missing = tmp_path / "no" / "such" / "dir"
    argv = ["--set", "data.dataset=fashion_mnist", "--set", f"data.data_root={missing}"]
    code, _, err = run_cli(capsys, "run", config, "--out", tmp_path / "r", "--quiet", *argv)
    assert code == 2 and err.startswith(f"error: data_root {str(missing)!r} is not a directory")
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_run_directory_errors(capsys, config, tmp_path):
    d = tmp_path / "r"
    assert run_cli(capsys, "run", config, "--out", d, "--quiet", "--set", "run.rounds=1")[0] == 0
    code, _, err = run_cli(capsys, "run", config, "--out", d, "--quiet", "--set", "run.rounds=1")
    assert code == 2 and err == (
        f"error: {d} already holds a finished run; choose another --out or pass --overwrite to replace it\n"
    )
    assert run_cli(capsys, "run", config, "--out", d, "--quiet", "--set", "run.rounds=1", "--overwrite")[0] == 0
    code, _, err = run_cli(capsys, "run", config, "--out", tmp_path / "empty", "--resume")
    assert code == 2 and "holds no checkpoint (checkpoint.pt); nothing to resume" in err
    code, _, err = run_cli(capsys, "run", tmp_path / "missing.toml")
    assert code == 2 and err.startswith("error: config file ") and "does not exist" in err


def test_argparse_errors_exit_2(capsys):
    assert main(["run"]) == 2
    assert "the following arguments are required: CONFIG" in capsys.readouterr().err
    assert main(["run", "x.toml", "--resume", "--overwrite"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    capsys.readouterr()


def test_list(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    for kind in ("algorithms", "datasets", "partitioners", "models", "aggregators", "objectives", "executors"):
        assert f"\n{kind}\n" in f"\n{out}"
    assert "  fedavg " in out and "  dirichlet " in out and "  logreg " in out and "  weighted_mean " in out
    code, out, _ = run_cli(capsys, "list", "algorithms", "scaffold")
    assert code == 0 and out.startswith("scaffold: SCAFFOLD")
    assert "  control_option     str" in out and 'default "II"' in out
    code, out, _ = run_cli(capsys, "list", "partitioner", "dirichlet")
    assert "alpha      float  default 0.5" in out
    code, _, err = run_cli(capsys, "list", "algoritms")
    assert code == 2 and err.startswith("error: unknown kind 'algoritms'. Did you mean 'algorithms'?")
    code, _, err = run_cli(capsys, "list", "models", "resnet")
    assert code == 2 and "Did you mean 'resnet20'?" in err


def test_sweep_and_report_errors(capsys, config, tmp_path):
    code, _, err = run_cli(capsys, "sweep", config, "--seeds", "two")
    assert code == 2 and err.startswith("error: --seeds = 'two' is not allowed; allowed: a count N >= 1")
    code, _, err = run_cli(capsys, "sweep", config, "--grid", "algorithm.lr")
    assert (
        code == 2
        and err.startswith("error: --grid expects key=v1,v2,... with a dotted key")
        and "got 'algorithm.lr'" in err
    )
    code, _, err = run_cli(capsys, "sweep", config, "--grid", "algorithm.lrr=0.1,0.2", "--out", tmp_path / "s")
    assert code == 2 and "sweep point algorithm.lrr=0.1 seed=0: unknown key 'algorithm.lrr'" in err
    code, _, err = run_cli(capsys, "sweep", config, "--jobs", "0")
    assert code == 2 and err == "error: --jobs = 0 is out of range; allowed: [1, inf)\n"
    code, _, err = run_cli(capsys, "report", tmp_path)
    assert code == 2 and err.startswith("error: no run directories (with config.toml and metrics.jsonl) at or below")
    code, _, err = run_cli(capsys, "report", tmp_path / "nope")
    assert code == 2 and "does not exist" in err


def test_sweep_variant_runs_only_the_named_ones_and_a_full_sweep_reuses_them(capsys, tmp_path, tiny, monkeypatch):
    import fedrisk.experiment.sweep as sweep

    monkeypatch.setattr(sweep, "make_report", functools.partial(sweep.make_report, plots=False))  # (speed)
    tiny["run"]["rounds"] = 1
    tiny["sweep"] = {
        "variants": {
            "avg": {"algorithm.name": "fedavg"},
            "prox": {"algorithm.name": "fedprox", "algorithm.mu": 0.1},
            "slow": {"algorithm.lr": 0.01},
        }
    }
    config = write_config(tmp_path / "v.toml", tiny)
    out = tmp_path / "s"
    code, _, err = run_cli(capsys, "sweep", config, "--variant", "slow", "--variant", "avg", "--out", out, "--plain")
    assert code == 0 and "sweep: 2 run(s)" in err
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["avg", "slow"]
    first = {name: (out / name / "seed=0" / "metrics.jsonl").stat().st_mtime_ns for name in ("avg", "slow")}
    code, out_text, err = run_cli(capsys, "sweep", config, "--out", out, "--plain")
    assert code == 0 and "sweep: 3 run(s) in" in err and "(2 already finished, 1 to run" in err
    assert {name: (out / name / "seed=0" / "metrics.jsonl").stat().st_mtime_ns for name in first} == first
    assert "| prox |" in out_text and "| avg |" in out_text and "| slow |" in out_text

    code, _, err = run_cli(capsys, "sweep", config, "--variant", "avg", "--variant", "scafold", "--out", out)
    assert code == 2 and err == "error: --variant 'scafold' is not a variant of the config; allowed: avg, prox, slow\n"
    del tiny["sweep"]
    plain = write_config(tmp_path / "plain.toml", tiny)
    none = "(none: the config has no [sweep.variants])"
    for extra in ([], ["--tune", "2"]):
        code, _, err = run_cli(capsys, "sweep", plain, "--variant", "avg", *extra, "--out", tmp_path / "p")
        assert code == 2
        assert err == f"error: --variant 'avg' is not a variant of the config; allowed: {none}\n"
    assert not (tmp_path / "p").exists()


def test_set_on_the_command_line_wins_over_a_variants_keys(capsys, tmp_path, tiny, monkeypatch):
    """``--set KEY`` is applied after a variant's keys (``run --variant``, ``sweep``): the
    command line is the last word, and the run's config.toml shows the value it ran with."""
    import fedrisk.experiment.sweep as sweep
    from fedrisk.experiment.config import load_config

    monkeypatch.setattr(sweep, "make_report", functools.partial(sweep.make_report, plots=False))  # (speed)
    tiny["run"]["rounds"] = 1
    tiny["sweep"] = {
        "variants": {
            "long": {"run.rounds": 3, "algorithm.lr": 0.05},
            "prox": {"algorithm.name": "fedprox", "algorithm.mu": 0.1},
        }
    }
    config = write_config(tmp_path / "v.toml", tiny)
    code, _, err = run_cli(
        capsys, "run", config, "--variant", "long", "--set", "run.rounds=2", "--out", tmp_path / "r", "--quiet"
    )
    assert code == 0 and err == "note: --set replaces variant long's run.rounds = 3\n"
    run_cfg = load_config(tmp_path / "r" / "config.toml")
    assert (run_cfg["run.rounds"], run_cfg["algorithm.lr"]) == (2, 0.05)  # the variant's other key stays
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["rounds"] == 2

    code, _, err = run_cli(
        capsys,
        "sweep",
        config,
        "--set",
        "run.rounds=2",
        "--set",
        "algorithm.lr=0.2",
        "--out",
        tmp_path / "s",
        "--quiet",
    )
    assert code == 0
    assert err == "note: --set replaces variant long's run.rounds = 3, algorithm.lr = 0.05\n"
    for name in ("long", "prox"):
        run_cfg = load_config(tmp_path / "s" / name / "seed=0" / "config.toml")
        assert (run_cfg["run.rounds"], run_cfg["algorithm.lr"]) == (2, 0.2)
    assert load_config(tmp_path / "s" / "prox" / "seed=0" / "config.toml")["algorithm.name"] == "fedprox"
    # the sweep as run (what --jobs > 1 runs its points from): variant long states the command line's values
    assert load_config(tmp_path / "s" / "sweep.toml")["sweep.variants"]["long"] == {
        "run.rounds": 2,
        "algorithm.lr": 0.2,
    }


def test_set_for_one_variant_is_kept_over_a_general_set(capsys):
    """docs/results/byzantine_worst_case.md's command: 400 rounds for every method, 140 for LFRPG
    (``--set sweep.variants.lfrpg.run.rounds=140``: the more specific key wins)."""
    from fedrisk.cli import chosen_variants
    from fedrisk.experiment.config import load_config

    sets = ["run.rounds=400", "run.eval_every=100"]
    sets += ["sweep.variants.lfrpg.run.rounds=140", "sweep.variants.lfrpg.run.eval_every=20"]
    cfg = load_config(REPO / "configs" / "byzantine" / "worst_case_key_cells.toml", sets)
    variants = chosen_variants(cfg, None, sets)
    ran = {name: cfg.with_overrides(over) for name, over in variants.items()}
    assert {name: (c["run.rounds"], c["run.eval_every"]) for name, c in ran.items()} == {
        "frpg": (400, 100),
        "lfrpg": (140, 20),
        "rsa": (400, 100),
        "geomed": (400, 100),
    }
    assert capsys.readouterr().err == ""
    variants = chosen_variants(cfg, ["lfrpg"], ["run.rounds=400", "sweep.variants.lfrpg.run.eval_every=20"])
    assert (variants["lfrpg"]["run.rounds"], variants["lfrpg"]["run.eval_every"]) == (400, 20)
    assert capsys.readouterr().err == "note: --set replaces variant lfrpg's run.rounds = 140\n"


def test_set_wins_over_the_configs_grid_and_the_command_lines_grid_is_one_place(capsys, tmp_path, tiny, monkeypatch):
    import fedrisk.experiment.sweep as sweep
    from fedrisk.experiment.config import load_config

    monkeypatch.setattr(sweep, "make_report", functools.partial(sweep.make_report, plots=False))  # (speed)
    tiny["run"]["rounds"] = 1
    tiny["sweep"] = {"grid": {"algorithm.lr": [0.05, 0.1]}, "variants": {"three": {"algorithm.local_steps": 3}}}
    config = write_config(tmp_path / "g.toml", tiny)
    out = tmp_path / "s"
    code, _, err = run_cli(capsys, "sweep", config, "--set", "algorithm.lr=0.2", "--out", out, "--quiet")
    assert code == 0 and err == "note: --set replaces the config's [sweep.grid] algorithm.lr = [0.05, 0.1]\n"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["three"]
    assert load_config(out / "three" / "seed=0" / "config.toml")["algorithm.lr"] == 0.2
    # --grid on the command line sweeps its key as documented (over the config's grid) ...
    code, _, _ = run_cli(capsys, "sweep", config, "--grid", "algorithm.lr=0.3", "--out", tmp_path / "g", "--quiet")
    assert (
        code == 0
        and load_config(tmp_path / "g" / "three,algorithm.lr=0.3" / "seed=0" / "config.toml")["algorithm.lr"] == 0.3
    )
    # ... and a key given both to --set and to --grid is ambiguous
    code, _, err = run_cli(
        capsys, "sweep", config, "--set", "algorithm.lr=0.2", "--grid", "algorithm.lr=0.3", "--out", tmp_path / "x"
    )
    assert code == 2
    assert err == "error: algorithm.lr is set both by --set and by --grid; set it in one place\n"
    assert not (tmp_path / "x").exists()


def test_run_with_several_seeds_runs_each(capsys, config, tmp_path):
    code, out, _ = run_cli(
        capsys, "run", config, "--out", tmp_path / "m", "--quiet", "--set", "run.rounds=1", "--set", "run.seeds=[0, 1]"
    )
    assert code == 0
    assert (tmp_path / "m" / "seed=0" / "summary.json").is_file() and (
        tmp_path / "m" / "seed=1" / "summary.json"
    ).is_file()
    assert "| fedavg | 2 | 1 |" in out


def test_sigterm_to_a_subprocess_then_resume_is_exact(tmp_path, tiny):
    """A real SIGTERM to `python -m fedrisk run`: exit 143 with a checkpoint, then --resume ends
    with exactly the metrics of an uninterrupted run."""
    tiny["model"] = {"name": "mlp", "hidden": [16]}
    tiny["algorithm"].update({"local_steps": 100, "batch_size": 32})
    tiny["run"].update({"rounds": 6, "checkpoint_every": 0})
    config = write_config(tmp_path / "slow.toml", tiny)
    out = tmp_path / "part"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedrisk", "run", str(config), "--out", str(out), "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").is_file() and len(records(out)) >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "SIGTERM received: finishing the current round" in stderr
    stopped = len(records(out))
    assert 2 <= stopped < 6
    assert f"SIGTERM received: stopped after round {stopped}; checkpoint written to {out / 'checkpoint.pt'}" in stderr
    assert f"Continue with: fedrisk run {out / 'config.toml'} --out {out} --resume" in stderr
    assert "Traceback" not in stderr

    # resume from the run's own resolved config, as the message says
    assert main(["run", str(out / "config.toml"), "--out", str(out), "--resume", "--quiet"]) == 0
    full = run_experiment(resolve_config(tiny), tmp_path / "full", progress="none")
    assert without_time(records(out)) == without_time(full.history.records)


def test_distributed_run_writes_once_and_matches_sequential(tmp_path, tiny):
    """`torchrun -m fedrisk run` with the distributed executor: rank 0 writes, the numbers equal
    the sequential executor's (float64, up to the order of the all-reduce sums)."""
    tiny["run"].update({"dtype": "float64", "rounds": 3})
    tiny["algorithm"]["name"] = "scaffold"
    config = write_config(tmp_path / "d.toml", tiny)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "fedrisk", "run", str(config), "--out", str(tmp_path / "dist"), "--quiet",
           "--set", "run.executor=distributed"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # never leave the workers behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.count("finished scaffold on digits-dirichlet-K3") == 1  # only rank 0 reports
    seq = run_experiment(resolve_config(tiny), tmp_path / "seq", progress="none")
    dist = records(tmp_path / "dist")
    assert [r["round"] for r in dist] == [1, 2, 3]
    for a, b in zip(dist, seq.history.records):
        assert a["test_accuracy"] == b["test_accuracy"] and a["bytes_up"] == b["bytes_up"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-12)
