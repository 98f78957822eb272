"""fedrisk tune: search-space parsing and bad input, pruning at the evaluation that condemns a
trial, best.toml, and a resumed study (also after kill -9) equal to an uninterrupted one."""

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
import tomli_w

from fedrisk.errors import FedriskError
from fedrisk.experiment.config import load_config, resolve_config
from fedrisk.experiment.outputs import read_jsonl
from fedrisk.experiment.runner import run_experiment
from fedrisk.experiment.tune import (
    Pruned,
    Reporter,
    open_study,
    parse_dimension,
    parse_space,
    run_tune,
    tune_spec,
)

SRC = str(Path(__file__).resolve().parents[2] / "src")

RAW = {
    "data": {"dataset": "breast_cancer", "num_clients": 3, "validation_fraction": 0.3},
    "model": {"name": "logreg"},
    "objective": {"name": "binary_cross_entropy"},
    "algorithm": {"name": "fedavg", "lr": 0.1, "local_steps": 2},
    "run": {"rounds": 4, "eval_every": 2, "splits": ["test", "validation"], "metrics": ["auroc"]},
    "output": {"plots": False},
    "tune": {"space": {"algorithm.lr": "log:1e-4:1"}, "metric": "validation_auroc", "trials": 5},
}


def cfg_of(**over):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in RAW.items()}
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v}
    return resolve_config(raw)


def stored(out):
    """The study in ``out`` read with Optuna's own journal backend (the file is a plain Optuna journal)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    assert (out / "study.journal").is_file()  # the backend would create it
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "study.journal")))
    return optuna.load_study(study_name="fedrisk", storage=storage)


def outcome(out):
    """The trials of a study in proposal order: (params, state, value, intermediate values)."""
    study = stored(out)
    rows = []
    for t in sorted(study.get_trials(), key=lambda t: t.user_attrs.get("index", t.number)):
        if t.state.name == "FAIL" and "error" not in t.user_attrs:
            continue  # interrupted, proposed again
        rows.append((t.params, t.state.name, t.value, dict(t.intermediate_values)))
    return rows


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("log:0:1", "0 < LO"),
        ("gauss:0:1", "unknown kind"),
        ("float:2:1", "LO < HI"),
        ("float:1", "two bounds"),
        ("int:1.5:3", "integers"),
        ("choice:", "empty choice"),
        ("choice:1,1", "repeated"),
        ("choice:[1],[2]", "numbers, strings or booleans"),
    ],
)
def test_unparsable_space_is_one_line_error(text, why):
    with pytest.raises(FedriskError) as err:
        parse_dimension("algorithm.lr", text)
    msg = str(err.value)
    assert why in msg and "algorithm.lr" in msg and "allowed: log:LO:HI" in msg and "\n" not in msg


def test_space_parses_kinds():
    space = parse_space(["algorithm.lr=log:1e-3:1", "algorithm.local_steps=int:1:8", "model.name=choice:logreg,mlp"])
    assert [(d.kind, d.low, d.high, d.choices) for d in space.values()] == [
        ("log", 1e-3, 1.0, ()),
        ("int", 1, 8, ()),
        ("choice", None, None, ("logreg", "mlp")),
    ]
    with pytest.raises(FedriskError, match="given twice"):
        parse_space(["algorithm.lr=log:1e-3:1", "algorithm.lr=float:0:1"])
    with pytest.raises(FedriskError, match="KEY=SPEC"):
        parse_space(["algorithm.lr"])


def test_bad_keys_metrics_and_empty_space_are_errors():
    cfg = cfg_of()
    with pytest.raises(FedriskError, match=r"algorithm\.lrr.*unknown key"):
        tune_spec(cfg, space=["algorithm.lrr=log:1e-3:1"])
    with pytest.raises(FedriskError, match=r"local_steps = 'float:0.5:2.0'"):
        tune_spec(cfg, space=["algorithm.local_steps=float:0.5:2"])  # an int key
    with pytest.raises(FedriskError, match="not a tunable key"):
        tune_spec(cfg, space=["run.seed=int:0:3"])
    with pytest.raises(FedriskError, match="not evaluated on the validation split"):
        tune_spec(cfg, metric="test_auroc")
    with pytest.raises(FedriskError, match=r"'validation_accuracy'.* not evaluated.*auroc"):
        tune_spec(cfg, metric="validation_accuracy")
    with pytest.raises(FedriskError, match=r"needs (the|a) validation split"):
        tune_spec(cfg_of(run={"splits": ["test"]}, data={"validation_fraction": 0.0}))
    with pytest.raises(FedriskError, match="no metric to tune"):
        tune_spec(cfg_of(tune={"metric": ""}))
    with pytest.raises(FedriskError, match="has no tunable key"):
        tune_spec(cfg_of(tune={"space": {}}))
    with pytest.raises(FedriskError, match=r"tune\.keys lists algorithm\.lam, not in tune\.space"):
        tune_spec(cfg_of(tune={"keys": ["algorithm.lam"]}))
    with pytest.raises(FedriskError, match=r"unknown key 'tune\.sapce'"):
        cfg_of(tune={"sapce": {}})


def test_metric_on_a_split_the_runs_select_on_needs_no_splits_entry(tmp_path):
    # a validation split without "validation" in run.splits: the trials select on the tuned metric,
    # so each run evaluates that split (the shipped configs' [tune] tables rely on this)
    cfg = cfg_of(run={"splits": ["test"]})
    spec = tune_spec(cfg, trials=1)
    assert spec.metric == "validation_auroc"
    result = run_tune(cfg, tmp_path, spec, plots=False)
    [trial] = result.trials
    recs = read_jsonl(tmp_path / trial.user_attrs["run_dir"] / "metrics.jsonl")
    assert trial.value == max(r["validation_auroc"] for r in recs)
    # the per-client validation summaries: accepted with per-client splits, refused without
    personal = {"validation_fraction": 0.0, "client_validation_fraction": 0.3}
    spec = tune_spec(cfg_of(data=personal, run={"splits": ["test"]}), metric="validation_personal_auroc_mean")
    assert spec.metric == "validation_personal_auroc_mean"
    with pytest.raises(FedriskError, match="client_validation_fraction"):
        tune_spec(cfg, metric="validation_personal_auroc_mean")


def test_cli_errors_are_one_line(tmp_path, capsys):
    from fedrisk.cli import main

    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(RAW))
    assert main(["tune", str(path), "--space", "algorithm.lr=log:-1:1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: search space algorithm.lr = 'log:-1:1' does not parse") and err.count("\n") == 1


def test_cli_tune_draws_the_history_unless_no_plots_or_output_plots_is_false(tmp_path, capsys, monkeypatch):
    from fedrisk.cli import main

    drawn = []  # the drawing itself: test_history_plot_shows_complete_and_pruned_trials_and_the_best_so_far
    monkeypatch.setattr(
        "fedrisk.experiment.tune_outputs.plot_history", lambda trials, spec, path: drawn.append(path) or path
    )
    path = tmp_path / "c.toml"
    raw = {**RAW, "run": {**RAW["run"], "threads": 1}, "tune": {**RAW["tune"], "trials": 1}, "output": {"plots": True}}
    path.write_text(tomli_w.dumps(raw))
    cases = (
        (tmp_path / "plotted", []),
        (tmp_path / "plain", ["--no-plots"]),
        (tmp_path / "off", ["--set", "output.plots=false"]),
    )
    for out, extra in cases:
        assert main(["tune", str(path), "--quiet", "--out", str(out), *extra]) == 0
        assert drawn == ([] if extra else [out / "history.png"])
        drawn.clear()
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert last.startswith(f"outputs in {out}: ") and ("history.png" in last) is not bool(extra)
        assert last.endswith("study.journal trials/")


# ----------------------------------------------------------------------------- pruning


class _FakeTrial:
    """Prunes at a given step; records what was reported."""

    def __init__(self, prune_at: int) -> None:
        self.prune_at = prune_at
        self.reported: list[tuple[int, float]] = []

    def report(self, value: float, step: int) -> None:
        self.reported.append((step, value))

    def should_prune(self) -> bool:
        return self.reported[-1][0] >= self.prune_at


def test_pruned_trial_stops_at_the_evaluation_of_the_decision(tmp_path):
    cfg = cfg_of(run={"rounds": 10, "eval_every": 2})
    trial = _FakeTrial(prune_at=4)
    reporter = Reporter(trial, "validation_auroc", tmp_path / "metrics.jsonl")
    with pytest.raises(Pruned, match="round 4"):
        run_experiment(cfg, tmp_path, progress="none", callbacks=[reporter])
    assert [s for s, _ in trial.reported] == [2, 4]
    assert [r["round"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [2, 4]  # no round past the decision
    assert [v for _, v in trial.reported] == [r["validation_auroc"] for r in read_jsonl(tmp_path / "metrics.jsonl")]


def test_median_pruner_prunes_bad_trials_and_best_toml(tmp_path):
    # lr = 1e-4 barely moves the model: worse than the median of finished trials at round 2 -> pruned
    cfg = cfg_of(tune={"space": {"algorithm.lr": "choice:0.5,0.0001"}, "trials": 7})
    result = run_tune(cfg, tmp_path, tune_spec(cfg), plots=False)
    states = [(t.params["algorithm.lr"], t.state.name) for t in result.trials]
    assert ("0.0001", "PRUNED") in [(str(lr), s) for lr, s in states[2:]]  # after the 2 startup trials
    for t in result.trials:
        if t.state.name == "PRUNED":
            rounds = [r["round"] for r in read_jsonl(tmp_path / t.user_attrs["run_dir"] / "metrics.jsonl")]
            assert rounds == [max(t.intermediate_values)] and rounds[-1] < cfg["run.rounds"]
    # best.toml: the base config with the best value; best.json's round is the validation-best evaluation
    best = load_config(tmp_path / "best.toml")
    assert best["algorithm.lr"] == result.best_params["algorithm.lr"] == 0.5
    info = json.loads((tmp_path / "best.json").read_text())
    recs = read_jsonl(tmp_path / info["run_dir"] / "metrics.jsonl")
    top = max(r["validation_auroc"] for r in recs)
    assert info["value"] == top == result.best_value
    assert info["round"] == min(r["round"] for r in recs if r["validation_auroc"] == top)
    complete = [t.value for t in result.trials if t.state.name == "COMPLETE"]
    assert result.best_value == max(complete)
    assert "| trial | lr | validation_auroc |" in (tmp_path / "trials.md").read_text()


def test_history_plot_shows_complete_and_pruned_trials_and_the_best_so_far(tmp_path):
    import optuna
    from PIL import Image

    from fedrisk.experiment.tune_outputs import plot_history

    dist = {"algorithm.lr": optuna.distributions.FloatDistribution(1e-4, 1, log=True)}
    trials = [
        optuna.trial.create_trial(params={"algorithm.lr": 0.1}, distributions=dist, value=0.8),
        optuna.trial.create_trial(
            params={"algorithm.lr": 0.5},
            distributions=dist,
            state=optuna.trial.TrialState.PRUNED,
            intermediate_values={2: 0.6},
        ),
        optuna.trial.create_trial(params={"algorithm.lr": 0.01}, distributions=dist, value=0.9),
    ]
    path = plot_history(trials, tune_spec(cfg_of()), tmp_path / "history.png")
    image = Image.open(path).convert("RGB")
    assert image.size == (660, 396)  # 6 x 3.6 inches at 110 dpi
    colours = {c for _, c in image.getcolors(maxcolors=1 << 20)}
    for name, rgb in (("complete", (31, 119, 180)), ("best so far", (255, 127, 14)), ("pruned", (214, 39, 40))):
        assert rgb in colours, name


# ----------------------------------------------------------------------------- resume


def interrupted(cfg, spec, out):
    """The study of ``spec`` after 2 trials, interrupted while its 3rd was running (as a kill -9 leaves it)."""
    run_tune(cfg, out, tune_spec(cfg, trials=2), plots=False)
    study, sampler = open_study(out, spec)
    sampler.reseed(2)
    trial = study.ask()
    for d in spec.space.values():
        d.suggest(trial)
    trial.set_user_attr("run_dir", "trials/002")
    trial.set_user_attr("index", 2)


def whole_and_interrupted(tmp_path):
    """A 5-trial tune: its config, spec and trials run whole (``tmp_path/whole``), and the folder
    ``tmp_path/part`` holding the same study :func:`interrupted` in its third trial."""
    cfg = cfg_of(tune={"trials": 5})
    spec = tune_spec(cfg)
    run_tune(cfg, tmp_path / "whole", spec, plots=False)
    interrupted(cfg, spec, tmp_path / "part")
    return cfg, spec, outcome(tmp_path / "whole"), tmp_path / "part"


def test_resumed_tune_has_the_same_trials(tmp_path):
    cfg, spec, whole, part = whole_and_interrupted(tmp_path)
    with pytest.raises(FedriskError, match="already holds a tune"):
        run_tune(cfg, part, spec, plots=False)
    run_tune(cfg, part, spec, resume=True, plots=False)
    assert outcome(part) == whole
    assert len(outcome(part)) == 5


FRAGMENT = b'{"op_code":8,"worker_id":"x","trial_id":2,"user_at'  # a record cut short by a kill


@pytest.mark.parametrize("where", ["end", "middle"])
def test_a_record_cut_short_by_a_kill_is_dropped_on_resume(tmp_path, where):
    # a process killed inside its write leaves part of a record; Optuna skips it at the end of
    # the file, but the next record (another worker's, or this study's after resuming) lands on
    # the same line and Optuna cannot read that line
    cfg, spec, whole, part = whole_and_interrupted(tmp_path)
    journal = part / "study.journal"
    lines = journal.read_bytes().split(b"\n")
    if where == "end":
        lines[-1] = FRAGMENT
    else:
        lines[5] = FRAGMENT + lines[5]
    journal.write_bytes(b"\n".join(lines))
    if where == "middle":
        with pytest.raises(ValueError):  # Optuna's own reader
            stored(part)
    echoed = []
    run_tune(cfg, part, spec, resume=True, plots=False, echo=echoed.append)
    assert "study.journal: dropped 1 record(s) cut short by a killed process" in echoed
    assert outcome(part) == whole


def test_a_journal_line_that_is_no_record_is_a_one_line_error(tmp_path):
    cfg = cfg_of(tune={"trials": 1})
    run_tune(cfg, tmp_path, tune_spec(cfg), plots=False)
    with open(tmp_path / "study.journal", "ab") as fh:
        fh.write(b"garbage\n")
    with pytest.raises(FedriskError, match=r"study\.journal: line \d+ is not an Optuna journal record; restore"):
        run_tune(cfg, tmp_path, tune_spec(cfg), resume=True, plots=False)


def test_an_older_sqlite_study_is_copied_and_resumes(tmp_path):
    # fedrisk before the journal kept the study in study.db (Optuna's SQLite storage): --resume
    # copies it, every trial as it was, and continues it; without --resume it is not overwritten
    import optuna

    cfg, spec, whole, part = whole_and_interrupted(tmp_path)
    kept = [(t.number, t.state, t.params, t.datetime_start, t.user_attrs) for t in stored(part).get_trials()]
    old = optuna.storages.RDBStorage(f"sqlite:///{part / 'study.db'}")
    optuna.copy_study(from_study_name="fedrisk", from_storage=stored(part)._storage, to_storage=old)
    old.engine.dispose()
    (part / "study.journal").unlink()
    before = (part / "study.db").read_bytes()
    with pytest.raises(FedriskError, match="already holds a tune"):
        run_tune(cfg, part, spec, plots=False)
    lines = []
    run_tune(cfg, part, spec, resume=True, plots=False, echo=lines.append)
    assert "study.db (an older fedrisk's SQLite study) copied to study.journal; study.db is left in place" in lines
    assert outcome(part) == whole
    assert (part / "study.db").read_bytes() == before
    after = stored(part).get_trials()  # the old trials themselves, not a new study that happens to agree
    assert [(t.number, t.state, t.params, t.datetime_start, t.user_attrs) for t in after[:2]] == kept[:2]
    assert kept[2][1].name == "RUNNING" and after[2].state.name == "FAIL" and after[2].params == kept[2][2]
    assert len(after) == 6  # the interrupted trial, proposed again


def test_opening_a_folder_without_a_study_is_an_error_and_creates_nothing(tmp_path):
    with pytest.raises(FedriskError, match=r"holds no tune \(study\.journal\)"):
        open_study(tmp_path, tune_spec(cfg_of()))
    assert not any(tmp_path.iterdir())


def test_an_unreadable_older_study_is_a_one_line_error(tmp_path):
    cfg = cfg_of(tune={"trials": 1})
    spec = tune_spec(cfg)
    run_tune(cfg, tmp_path, spec, plots=False)
    (tmp_path / "study.journal").unlink()
    (tmp_path / "study.db").write_bytes(b"not a database")
    with pytest.raises(FedriskError, match=r"study\.db \(a study of an older fedrisk\) cannot be read: ") as info:
        run_tune(cfg, tmp_path, spec, resume=True, plots=False)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "study.journal").exists()


def test_resume_refuses_other_settings(tmp_path):
    cfg = cfg_of(tune={"trials": 1})
    run_tune(cfg, tmp_path, tune_spec(cfg), plots=False)
    other = tune_spec(cfg, space=["algorithm.lr=log:1e-3:1"])
    with pytest.raises(FedriskError, match=r"other settings \(space differ"):
        run_tune(cfg, tmp_path, other, resume=True)


@pytest.mark.slow
def test_kill_9_tune_resumes_with_every_finished_trial(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({**RAW, "tune": {**RAW["tune"], "trials": 6}}))
    env = {**os.environ, "PYTHONPATH": SRC}
    cmd = [sys.executable, "-m", "fedrisk", "tune", str(path), "--quiet"]
    subprocess.run([*cmd, "--out", str(tmp_path / "whole")], env=env, check=True, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
        if not (out / "study.journal").is_file():
            continue
        states = [t.state.name for t in stored(out).get_trials()]
        if states.count("COMPLETE") + states.count("PRUNED") >= 3 and states[-1] == "RUNNING":
            break
    assert proc.poll() is None, "the study file never showed 3 finished trials and a running one while the tune ran"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished_before = [t for t in outcome(out) if t[1] != "RUNNING"]
    assert len(finished_before) >= 3
    subprocess.run([*cmd, "--out", str(out), "--resume"], env=env, check=True, capture_output=True)
    after = outcome(out)
    assert after[: len(finished_before)] == finished_before  # no finished trial lost or redone
    assert after == outcome(tmp_path / "whole")


# ----------------------------------------------------------------------------- sweep --tune


def test_sweep_tune_tunes_each_variant_then_runs_the_seeds(tmp_path):
    from fedrisk.experiment.sweep import run_tuned_sweep

    cfg = cfg_of(run={"rounds": 2, "eval_every": 1})
    variants = {
        "avg": {"algorithm.name": "fedavg", "tune.keys": ["algorithm.lr"]},
        "prox": {"algorithm.name": "fedprox", "tune.keys": ["algorithm.lr"]},
    }
    result = run_tuned_sweep(cfg, tmp_path, trials=2, variants=variants, seeds=[0, 1], progress="none")
    assert not result.failed and len(result.points) == 4
    for name in variants:
        best = json.loads((tmp_path / name / "tune" / "best.json").read_text())
        tuned = json.loads((tmp_path / name / "tuned.json").read_text())
        assert tuned["params"] == best["params"] and best["trials"] == 2
        for seed in (0, 1):  # the seed runs use the selected value
            run_cfg = load_config(tmp_path / name / f"seed={seed}" / "config.toml")
            assert run_cfg["algorithm.lr"] == best["params"]["algorithm.lr"] and run_cfg["run.seed"] == seed
    # seed 0 (= run.seed, the study's seed) is the best trial's run, copied: the same numbers as running it afresh
    best = json.loads((tmp_path / "avg" / "tune" / "best.json").read_text())
    copied = read_jsonl(tmp_path / "avg" / "seed=0" / "metrics.jsonl")
    assert copied == read_jsonl(tmp_path / "avg" / "tune" / best["run_dir"] / "metrics.jsonl")
    fresh = run_experiment(
        load_config(tmp_path / "avg" / "seed=0" / "config.toml"), tmp_path / "fresh", progress="none"
    )
    drop = ("wall_time",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in fresh.history.records] == [
        {k: v for k, v in r.items() if k not in drop} for r in copied
    ]
    assert "| configuration | tuned |" in result.report.table
    assert f"lr={tuned['params']['algorithm.lr']:.4g}" in result.report.table
    # the trials stay out of the sweep's report; re-running continues (nothing left to do)
    assert len(result.report.groups) == 2
    again = run_tuned_sweep(cfg, tmp_path, trials=2, variants=variants, seeds=[0, 1], progress="none")
    assert len(again.skipped) == 4


def test_sweep_tune_without_tunable_key_is_an_error(tmp_path):
    from fedrisk.experiment.sweep import run_tuned_sweep

    cfg = cfg_of(tune={"space": {}})
    with pytest.raises(FedriskError, match="sweep variant 'avg' has no tunable key"):
        run_tuned_sweep(cfg, tmp_path, trials=2, variants={"avg": {"algorithm.name": "fedavg"}}, progress="none")
    assert not any(tmp_path.iterdir())  # checked before anything ran


def test_cli_sweep_tune_variant_tunes_only_the_named_one_and_a_full_sweep_reuses_it(tmp_path, capsys, monkeypatch):
    import fedrisk.experiment.sweep as sweep
    from fedrisk.cli import main

    monkeypatch.setattr(sweep, "make_report", functools.partial(sweep.make_report, plots=False))  # (speed)

    variants = {
        "avg": {"algorithm.name": "fedavg", "tune.keys": ["algorithm.lr"]},
        "prox": {"algorithm.name": "fedprox", "tune.keys": ["algorithm.lr"]},
    }
    raw = {**RAW, "run": {**RAW["run"], "rounds": 2, "eval_every": 1}, "sweep": {"variants": variants}}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(raw))
    argv = ["sweep", str(path), "--tune", "1", "--seeds", "1", "--out", str(tmp_path / "o"), "--quiet"]
    assert main([*argv, "--variant", "prox"]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir() if p.is_dir()) == ["prox"]
    kept = [tmp_path / "o" / "prox" / f for f in ("tune/study.journal", "seed=0/metrics.jsonl")]
    before = [f.stat().st_mtime_ns for f in kept]
    tuned = (tmp_path / "o" / "prox" / "tuned.json").read_text()
    capsys.readouterr()
    assert main(argv) == 0
    assert [f.stat().st_mtime_ns for f in kept] == before  # the finished study and run are reused
    assert (tmp_path / "o" / "prox" / "tuned.json").read_text() == tuned
    assert (tmp_path / "o" / "avg" / "seed=0" / "summary.json").is_file()
    assert "| prox |" in capsys.readouterr().out


def test_cli_sweep_tune_set_wins_over_the_variants_keys(tmp_path, capsys, monkeypatch):
    import fedrisk.experiment.sweep as sweep
    from fedrisk.cli import main

    monkeypatch.setattr(sweep, "make_report", functools.partial(sweep.make_report, plots=False))  # (speed)
    variants = {"long": {"run.rounds": 4, "algorithm.local_steps": 3, "tune.keys": ["algorithm.lr"]}}
    raw = {**RAW, "run": {**RAW["run"], "rounds": 1, "eval_every": 1}, "sweep": {"variants": variants}}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(raw))
    argv = ["sweep", str(path), "--tune", "1", "--seeds", "1", "--set", "run.rounds=2", "--out", str(tmp_path / "o")]
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == "note: --set replaces variant long's run.rounds = 4\n"
    trial = json.loads((tmp_path / "o" / "long" / "tune" / "best.json").read_text())["run_dir"]
    for run in (tmp_path / "o" / "long" / "seed=0", tmp_path / "o" / "long" / "tune" / trial):
        cfg = load_config(run / "config.toml")
        assert (cfg["run.rounds"], cfg["algorithm.local_steps"]) == (2, 3)


def test_a_key_both_set_on_the_command_line_and_tuned_is_an_error(tmp_path, capsys):
    from fedrisk.cli import main

    variants = {"avg": {"tune.keys": ["algorithm.lr"]}, "lam": {"tune.keys": ["algorithm.local_steps"]}}
    raw = {**RAW, "tune": {**RAW["tune"], "space": {"algorithm.lr": "log:0.01:1", "algorithm.local_steps": "int:1:4"}}}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({**raw, "sweep": {"variants": variants}}))
    sweep = ["sweep", str(path), "--tune", "1", "--out", str(tmp_path / "o")]
    assert main([*sweep, "--set", "algorithm.lr=0.1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: sweep variant 'avg': algorithm.lr is both set by --set and tuned; set it in one place "
        "(drop the --set, or take the key out of the search space: tune.keys / --space)\n"
    )
    assert main([*sweep, "--set", "algorithm={name = 'fedavg', lr = 0.1}"]) == 2  # a table around the key
    assert "'avg': algorithm.lr is both set" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # checked before anything ran
    single = tmp_path / "s.toml"
    single.write_text(tomli_w.dumps(raw))
    tune = ["tune", str(single), "--trials", "1", "--out", str(tmp_path / "t")]
    assert main([*tune, "--set", "algorithm.local_steps=2"]) == 2
    assert "error: algorithm.local_steps is both set by --set and tuned" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_parallel_workers_share_the_study(tmp_path):
    cfg = cfg_of(tune={"trials": 4})
    result = run_tune(cfg, tmp_path, tune_spec(cfg, jobs=2), plots=False)
    assert len(result.trials) == 4 and {t.state.name for t in result.trials} <= {"COMPLETE", "PRUNED"}
    assert len({t.user_attrs["run_dir"] for t in result.trials}) == 4
    assert len(list((tmp_path / "trials").iterdir())) == 4
    assert all((tmp_path / f"worker{i}.log").is_file() for i in (0, 1))


def test_cli_sweep_tune_errors_are_one_line(tmp_path, capsys):
    from fedrisk.cli import main

    raw = {**RAW, "tune": {"metric": "validation_auroc"}, "sweep": {"variants": {"avg": {"algorithm.name": "fedavg"}}}}
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(raw))
    assert main(["sweep", str(path), "--tune", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: sweep variant 'avg' has no tunable key") and err.count("\n") == 1
    assert main(["sweep", str(path), "--tune", "2", "--grid", "algorithm.lr=0.1,0.2"]) == 2
    assert "--tune with a grid" in capsys.readouterr().err
    assert main(["sweep", str(path), "--tune", "0"]) == 2
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- personalised methods


PERM_RAW = {
    "data": {
        "dataset": "perm_synthetic",
        "partition": "by_attribute",
        "num_clients": 4,
        "client_test_fraction": 0.2,
        "client_validation_fraction": 0.25,
        "dataset_options": {"samples_per_client": 40, "dim": 3, "test_per_client": 8},
    },
    "model": {"name": "logreg", "bias": False},
    "algorithm": {"name": "perm", "lr": 0.5, "local_steps": 2, "batch_size": 8},
    "run": {"rounds": 6, "eval_every": 3, "metrics": ["accuracy"]},
    "output": {"plots": False},
}


def test_perm_lam_tuned_on_each_clients_validation_split(tmp_path):
    cfg = resolve_config(PERM_RAW)
    metric = "validation_personal_accuracy_mean"
    spec = tune_spec(cfg, space=["algorithm.lam=log:0.1:1000"], metric=metric, trials=2, pruner="none")
    result = run_tune(cfg, tmp_path, spec, plots=False)
    assert [t.state.name for t in result.trials] == ["COMPLETE", "COMPLETE"]
    for t in result.trials:  # each trial ran PERM at its lam and is scored by its best per-client validation mean
        run = tmp_path / t.user_attrs["run_dir"]
        assert load_config(run / "config.toml")["algorithm.lam"] == t.params["algorithm.lam"]
        assert t.value == max(r[metric] for r in read_jsonl(run / "metrics.jsonl"))
    assert result.best_value == max(t.value for t in result.trials)
    assert load_config(tmp_path / "best.toml")["algorithm.lam"] == result.best_params["algorithm.lam"]
    # without per-client validation splits the metric is refused before anything runs
    no_split = resolve_config({**PERM_RAW, "data": {**PERM_RAW["data"], "client_validation_fraction": 0.0}})
    with pytest.raises(FedriskError, match=r"'validation_personal_accuracy_mean'.*client_validation_fraction"):
        tune_spec(no_split, space=["algorithm.lam=log:0.1:1000"], metric=metric)
