"""The documentation runs: the tutorial's code blocks execute (and print what the text says),
the config reference matches the schema, and the documented commands parse."""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import math
import re
import shlex
import sys
from pathlib import Path

import pytest
import tomllib

from fedrisk.cli import build_parser, main
from fedrisk.experiment.config import reference_markdown, resolve_config

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BLOCK = re.compile(r"```(\w+)(?: file=(\S+))?\n(.*?)```", re.S)


def blocks(text: str) -> list[tuple[str, str | None, str, int]]:
    """(language, file name, body, end offset) of every fenced block."""
    return [(m.group(1), m.group(2), m.group(3), m.end()) for m in BLOCK.finditer(text)]


@pytest.fixture
def clean_registry():
    """The tutorial registers an algorithm and imports a module: undo both afterwards."""
    from fedrisk.algorithms import ALGORITHMS

    path_before = list(sys.path)
    yield
    ALGORITHMS._entries.pop("clipped_fedavg", None)
    sys.modules.pop("my_algorithms", None)
    sys.path[:] = path_before


_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


def printed_close(claim: str, printed: str, rel: float = 1e-9) -> bool:
    """Whether ``printed`` contains ``claim`` with its numbers equal up to ``rel`` (the last
    printed digit of a float differs between CPUs)."""
    parts = re.split(f"({_NUMBER})", claim)
    pattern = "".join(f"({_NUMBER})" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    for match in re.finditer(pattern, printed):
        got = [float(g) for g in match.groups()]
        want = [float(x) for x in parts[1::2]]
        if all(math.isclose(a, b, rel_tol=rel, abs_tol=rel) for a, b in zip(got, want)):
            return True
    return False


def test_tutorial_code_runs_and_prints_what_it_says(tmp_path, monkeypatch, clean_registry):
    text = (DOCS / "tutorial-custom-algorithm.md").read_text()
    monkeypatch.chdir(tmp_path)
    # drawing 16 PNGs would take most of this test's time; plots are tested in test_runner / test_report
    for where in ("fedrisk.experiment.plots.plot_curves", "fedrisk.experiment.report.plot_curves"):
        monkeypatch.setattr(where, lambda *args, **kwargs: [])
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict = {}
    ran = {"python": 0, "console": 0, "file": 0}
    for lang, fname, body, end in blocks(text):
        if fname:
            (tmp_path / fname).write_text(body)
            ran["file"] += 1
        elif lang == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(body, "tutorial", "exec"), namespace)
            ran["python"] += 1
            claim = re.match(r"\s*Prints `([^`]*)`", text[end:], re.IGNORECASE)
            if claim:
                assert printed_close(claim.group(1), out.getvalue()), (claim.group(1), out.getvalue())
        elif lang == "console":
            for line in body.splitlines():
                if line.startswith("$ fedrisk "):
                    assert main(shlex.split(line)[2:]) == 0, line
                    ran["console"] += 1
    assert ran == {"python": 3, "console": 2, "file": 2}
    assert (tmp_path / "runs" / "clipped" / "summary.json").is_file()
    assert (tmp_path / "runs" / "clip-sweep" / "report.md").is_file()


@pytest.mark.skipif(not any(Path("/usr/share/datasets/fashion-mnist").glob("train-images*")), reason="no Fashion-MNIST")
def test_getting_started_python_block(tmp_path, monkeypatch):
    text = (DOCS / "getting-started.md").read_text()
    (tmp_path / "configs").symlink_to(CONFIGS)
    monkeypatch.chdir(tmp_path)
    [(body, end)] = [(body, end) for lang, _, body, end in blocks(text) if lang == "python"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(body, "getting-started", "exec"), {})
    claim = re.match(r"\s*prints `([^`]*)`", text[end:])
    assert claim and claim.group(1) in out.getvalue()


def test_config_reference_matches_the_schema():
    text = (DOCS / "config-reference.md").read_text()
    start = text.index("<!-- BEGIN GENERATED")
    body = text[text.index("\n", start) + 1 : text.index("<!-- END GENERATED -->")]
    assert body == reference_markdown(), "regenerate the tables with fedrisk.experiment.config.reference_markdown()"


def test_config_reference_examples_are_valid():
    text = (DOCS / "config-reference.md").read_text()
    examples = [body for lang, _, body, _ in blocks(text) if lang == "toml"]
    assert len(examples) == 2
    full = tomllib.loads(examples[0])
    assert resolve_config(full)["algorithm.name"] == "scaffold"
    sweep = tomllib.loads(examples[1])
    cfg = resolve_config({**full, **sweep})
    assert cfg["sweep.variants"]["scaffold"] == {"algorithm.name": "scaffold", "algorithm.control_option": "I"}


@pytest.mark.parametrize(
    "page",
    [
        "getting-started.md",
        "tutorial-custom-algorithm.md",
        "config-reference.md",
        "comparing-methods.md",
        "auc-family.md",
    ],
)
def test_documented_commands_parse(page):
    text = (DOCS / page).read_text()
    parser = build_parser()
    commands = re.findall(r"^\$ (?:\.venv/bin/)?(?:fedrisk|python -m fedrisk) (.*)$", text, re.M)
    for cmd in commands:
        parser.parse_args(shlex.split(cmd))
    if page == "getting-started.md":
        assert len(commands) >= 6


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.toml")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_configs_are_valid(path):
    from fedrisk.experiment.config import load_config

    cfg = load_config(path)
    assert cfg["run.rounds"] >= 1


@pytest.mark.parametrize(
    "module",
    [
        "schema",
        "sections",
        "section_rules",
        "config",
        "outputs",
        "progress",
        "runner",
        "plots",
        "report",
        "sweep",
        "selection",
        "scoring",
        "tune",
        "tune_space",
        "tune_storage",
        "__init__",
    ],
)
def test_doctests(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write run directories write them here
    name = "fedrisk.experiment" if module == "__init__" else f"fedrisk.experiment.{module}"
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_cli_doctest(capsys):
    import fedrisk.cli

    result = doctest.testmod(fedrisk.cli, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_printed_claims_are_portable(page):
    """A "Prints `...`" claim that the docs tests check must not depend on the CPU: no float with
    more than 6 significant digits (the last bits of a sum differ between CPUs and thread counts)."""
    text = (DOCS / page).read_text()
    for claim in re.findall(r"[Pp]rints `([^`]*)`", text):
        for number in re.findall(r"\d+\.\d+(?:e-?\d+)?", claim):
            digits = number.split("e")[0].replace(".", "").lstrip("0")
            assert len(digits) <= 6, f"{page}: {claim!r} promises {number}; round it (see docs/reliability.md)"
