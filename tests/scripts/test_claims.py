"""scripts/claims.py: the statistics against hand-computed values, the verdict rule, reading runs at
their validation-selected round, the recorded CSVs, and missing runs (issue 25)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "claims.py"


@pytest.fixture(scope="module")
def claims():
    spec = importlib.util.spec_from_file_location("claims", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["claims"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_sign_test_is_the_exact_binomial_tail(claims):
    assert claims.sign_test([0.1, 0.2, 0.3]) == 1 / 8
    assert claims.sign_test([0.1, 0.2, 0.3, 0.4, 0.5]) == 1 / 32
    # 4 of 5 positive: P(X >= 4) = (5 + 1) / 32; a zero difference is dropped (n = 4, k = 3: 5/16)
    assert claims.sign_test([0.1, 0.2, -0.3, 0.4, 0.5]) == 6 / 32
    assert claims.sign_test([0.1, 0.2, -0.3, 0.4, 0.0]) == 5 / 16
    assert claims.sign_test([-1.0, -2.0]) == 1.0


def test_paired_t_matches_the_two_degree_closed_form(claims):
    # with 2 degrees of freedom P(T > t) = 1/2 - t / (2 sqrt(2 + t^2))
    for diffs in ([0.02, 0.03, 0.01], [0.5, -0.1, 0.2], [-0.3, -0.1, 0.05]):
        n = len(diffs)
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        t = mean / (sd / math.sqrt(n))
        assert claims.paired_t(diffs) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), rel=1e-10)
    assert claims.paired_t([0.1, 0.1, 0.1]) == 0.0 and claims.paired_t([0.0, 0.0, 0.0]) == 1.0


def test_differences_point_towards_the_claimed_method(claims):
    acc = claims.Row("r", "p", "c", "n", "s", metric="test_accuracy")
    loss = claims.Row("r", "p", "c", "n", "s", metric="grad_phi_norm", scale="log")
    assert claims.differences(acc, [0.8, 0.7], [0.75, 0.72]) == pytest.approx([0.05, -0.02])
    assert claims.differences(loss, [0.01, 1.0], [0.1, 0.5]) == pytest.approx([math.log(10), -math.log(2)])


@pytest.mark.parametrize(
    ("stats", "effect", "expected"),
    [
        ((3, 0.05, 0.01, 0.01, 0.125, 3), None, "reproduced"),
        ((3, 0.05, 0.01, 0.01, 0.125, 3), 0.09, "reproduced"),  # at least half the paper's effect
        ((3, 0.04, 0.01, 0.01, 0.125, 3), 0.09, "reproduced in direction"),
        ((5, 0.05, 0.04, 0.04, 0.03, 5), None, "reproduced"),  # within 2 std, but 5 seeds
        ((5, 0.05, 0.07, 0.09, 0.19, 4), None, "not reproduced"),  # p >= 0.05
        ((3, -0.05, 0.01, 0.99, 1.0, 0), None, "not reproduced"),  # the baseline is better
        ((3, 0.01, 0.02, 0.3, 0.5, 2), None, "no verdict: the gap is within 2 std over 3 seeds; run 5 seeds"),
        ((2, 0.05, 0.01, 0.05, 0.25, 2), None, "no verdict: 2 paired seed(s); the protocol needs >= 3"),
    ],
)
def test_verdict_rule(claims, stats, effect, expected):
    assert claims.verdict(claims.Stats(*stats), effect) == expected


def test_a_tuned_value_at_the_edge_of_its_range_withholds_the_verdict(claims, tmp_path):
    win, loss = claims.Stats(5, 1.0, 0.01, 1e-6, 1 / 32, 5), claims.Stats(5, -1.0, 0.01, 1.0, 1.0, 0)
    assert claims.verdict(win) == "reproduced" and claims.verdict(loss) == "not reproduced"
    # a baseline at an edge could close a win; the method at an edge could turn a loss
    assert claims.verdict(win, baseline_edge=True).startswith("no verdict: a baseline's tuned value is at the edge")
    assert claims.verdict(loss, method_edge=True).startswith("no verdict: the claimed method's tuned value")
    # more tuning of the side at the edge could only strengthen these
    assert claims.verdict(win, method_edge=True) == "reproduced"
    assert claims.verdict(loss, baseline_edge=True) == "not reproduced"
    folder = tmp_path / "runs" / "sw" / "a"
    (folder / "tune").mkdir(parents=True)
    (folder / "tuned.json").write_text(json.dumps({"params": {"algorithm.lr": 9.5e-5, "algorithm.beta": 0.5}}))
    (folder / "tune" / "tune.toml").write_text(
        '[study.space]\n"algorithm.lr" = "log:1e-4:0.3"\n"algorithm.beta" = "float:0.0:1.0"\n'
    )
    row = claims.Row("r", "p", "c", "n", "s", runs="runs/sw", method="a")
    # lr 9.5e-5 sits at 0.6 % of the log range (below 1e-4 would be outside); beta in the middle
    assert claims.edge_flags(row, "a", tmp_path) == ["a: lr=9.5e-05 at the edge of log:1e-4:0.3"]


def _run(folder: Path, seed: int, rows: list[dict], key: str = "validation_accuracy", finished: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f"[run]\nseed = {seed}\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (folder / "summary.json").write_text(json.dumps({"status": "finished", "selected": {"selected_by": key}}))


def _sweep(base: Path, values: dict[str, list[tuple[float, float]]]) -> None:
    """``{variant: [(validation at the best round, test there), ...] per seed}``; a later round has
    a higher test and a lower validation value, so reading the test-best or the last round differs."""
    for variant, per_seed in values.items():
        for seed, (val, test) in enumerate(per_seed):
            rows = [
                {"round": 10, "validation_accuracy": val, "test_accuracy": test, "steps_per_client": 100.0},
                {"round": 20, "validation_accuracy": val - 0.1, "test_accuracy": test + 0.2},
            ]
            _run(base / "runs" / "sw" / variant / f"seed={seed}", seed, rows)


ROWS = """
[[row]]
id = "r1"
paper = "P"
claim = "A beats B"
paper_number = "+0.1"
setup = "here"
command = "fedrisk sweep c.toml --tune 2 --out runs/sw"
runs = "runs/sw"
method = "a"
baseline = ["b", "c"]
metric = "test_accuracy"

[[row]]
id = "r2"
paper = "P"
claim = "needs data"
paper_number = "-"
setup = "-"
testable = false
needs = "a GPU"
"""


def test_rows_read_at_the_validation_selected_round_against_the_strongest_baseline(claims, tmp_path):
    _sweep(
        tmp_path,
        {
            "a": [(0.9, 0.80), (0.9, 0.82), (0.9, 0.815)],
            "b": [(0.7, 0.79), (0.7, 0.80), (0.7, 0.80)],  # the stronger on validation
            "c": [(0.6, 0.99), (0.6, 0.99), (0.6, 0.99)],  # best on test: must not be chosen
        },
    )
    (tmp_path / "rows.toml").write_text(ROWS)
    row = claims.load_rows(tmp_path / "rows.toml")[0]
    paired = claims.collect(row, tmp_path)
    assert paired.baseline == "b"
    assert paired.method == [0.80, 0.82, 0.815] and paired.other == [0.79, 0.80, 0.80]
    assert paired.rounds == [(10, 10)] * 3 and paired.steps == [100.0] * 3
    d = claims.differences(row, paired.method, paired.other)
    s = claims.statistics(d)
    assert (s.n, s.positive) == (3, 3) and (s.mean, s.std) == pytest.approx((0.015, 0.005))
    assert s.sign_p == 1 / 8 and s.t_p == pytest.approx(0.5 - 3**1.5 / (2 * 29**0.5))  # t = 3 sqrt(3)
    assert claims.verdict(s) == "reproduced"


def test_record_and_from_recorded_give_the_same_table(claims, tmp_path, capsys):
    _sweep(tmp_path, {"a": [(0.9, 0.80), (0.9, 0.82), (0.9, 0.81)], "b": [(0.7, 0.79)] * 3, "c": [(0.6, 0.5)] * 3})
    (tmp_path / "rows.toml").write_text(ROWS)
    args = ["--rows", str(tmp_path / "rows.toml"), "--base", str(tmp_path), "--recorded-dir", str(tmp_path / "rec")]
    assert claims.main([*args, "--record"]) == 0
    live = capsys.readouterr().out
    assert (tmp_path / "rec" / "r1.csv").read_text().splitlines()[1].startswith("0,0.8,0.79,10,10,100.0,")
    assert claims.main([*args, "--from-recorded"]) == 0
    again = capsys.readouterr().out
    table = [line for line in live.splitlines() if line.startswith("|")]
    assert table == again.splitlines()
    assert "**reproduced**" in table[2] and "not testable here**: a GPU" in table[3]


def test_missing_or_partial_runs_name_the_runs_and_the_command(claims, tmp_path, capsys):
    _sweep(tmp_path, {"a": [(0.9, 0.80), (0.9, 0.82), (0.9, 0.81)], "b": [(0.7, 0.79)] * 2})
    _run(tmp_path / "runs" / "sw" / "b" / "seed=2", 2, [{"round": 10, "validation_accuracy": 0.5}], finished=False)
    (tmp_path / "rows.toml").write_text(ROWS)
    args = ["--rows", str(tmp_path / "rows.toml"), "--base", str(tmp_path)]
    assert claims.main([*args, "--row", "r1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "runs/sw/b/seed=2 (started)" in err and "runs/sw/c/seed=0 (empty)" in err
    assert "make them with: fedrisk sweep c.toml --tune 2 --out runs/sw" in err
    # the whole table lists the row as not run yet, with its command, and invents no number
    assert claims.main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "A beats B" in x)
    assert "not run yet under the protocol" in line and "fedrisk sweep c.toml" in line and "0.8" not in line


def test_bad_rows_file_is_one_line(claims, tmp_path, capsys):
    (tmp_path / "rows.toml").write_text(
        '[[row]]\nid = "x"\npaper = "P"\nclaim = "c"\npaper_number = "n"\nsetup = "s"\nmetrc = "m"\n'
    )
    assert claims.main(["--rows", str(tmp_path / "rows.toml")]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) ['metrc']" in err and err.count("\n") == 1


def test_every_shipped_row_names_a_runnable_command(claims):
    rows = claims.load_rows()
    for row in rows:
        if row.testable:
            assert row.command.startswith("fedrisk sweep ") and f"--out {row.runs}" in row.command, row.id
            assert (SCRIPT.parents[1] / row.config).is_file() and row.config in row.command, row.id
        else:
            assert row.needs, row.id


def test_docstring_examples(claims):
    import doctest

    result = doctest.testmod(claims)
    assert result.failed == 0 and result.attempted >= 4


def test_every_shipped_claims_config_resolves_with_its_tune_spaces(claims):
    """What `fedrisk sweep --tune` checks before its first trial, for every row's config."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CODASCA's large-window step warnings
        lines = claims.check_configs(claims.load_rows())
    configs = {r.config for r in claims.load_rows() if r.config}
    assert len(lines) == len(configs) and all("resolve" in line for line in lines)
    shipped = sorted(str(p.relative_to(SCRIPT.parents[1])) for p in SCRIPT.parents[1].glob("configs/*/claims/*.toml"))
    assert set(shipped) <= configs  # every claims config backs a row
