"""Mutation testing (mutmut 3) of one scope at a time: see docs/reliability.md, "Mutation testing".

Usage (from the repository root, after ``.venv/bin/pip install mutmut``)::

    .venv/bin/python scripts/mutation.py SCOPE                 # mutmut run --max-children 1, niced
    .venv/bin/python scripts/mutation.py SCOPE results         # the survivors
    .venv/bin/python scripts/mutation.py SCOPE show NAME       # one mutant's diff
    .venv/bin/python scripts/mutation.py SCOPE run 'fedrisk.runtime.executor.x_check_reply*'  # some mutants
    .venv/bin/python scripts/mutation.py SCOPE count               # mutants per file, nothing run

A scope is ``aggregators`` (the top-level keys of ``[tool.mutmut]`` in pyproject.toml) or a table
``[tool.mutmut.scopes.SCOPE]`` there (its ``source_paths`` and ``pytest_add_cli_args_test_selection``).
Each scope runs in its own folder, ``runs/mutation/SCOPE/``: a copy of ``src/``, ``tests/``, ``configs/`` and
``pyproject.toml`` whose ``[tool.mutmut]`` is the scope's.  mutmut keeps its results there, so the
scopes do not mix and a stopped run goes on where it stopped (the copy is refreshed at each call).
``FEDRISK_FUZZ_EXAMPLES`` defaults to 10 (the fuzz tests are not the point of a mutant run) and
``OMP_NUM_THREADS`` to 1 (see below).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import tomli_w
import tomllib

REPO = Path(__file__).resolve().parents[1]
MUTMUT = REPO / ".venv" / "bin" / "mutmut"


def scopes(pyproject: dict) -> dict[str, dict]:
    """Every scope's ``[tool.mutmut]`` table (``aggregators`` is the top-level one)."""
    top = dict(pyproject["tool"]["mutmut"])
    named = top.pop("scopes", {})
    return {"aggregators": top, **{name: {**top, **table} for name, table in named.items()}}


def main(argv: list[str]) -> int:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    known = scopes(pyproject)
    if not argv or argv[0] not in known:
        print(f"usage: scripts/mutation.py {{{','.join(known)}}} [run|results|show NAME|...]", file=sys.stderr)
        return 2
    scope, args = argv[0], argv[1:] or ["run"]
    if args[0] == "count":  # mutmut's own generator, as `run` would mutate the files (a few seconds)
        from mutmut.mutation.file_mutation import mutate_file_contents

        total = 0
        for path in known[scope]["source_paths"]:
            count = len(mutate_file_contents(path, (REPO / path).read_text()).mutant_names)
            total += count
            print(f"{path}: {count}")
        print(f"{scope}: {total} mutants")
        return 0
    if args[0] == "run" and "--max-children" not in args:
        args = [*args[:1], "--max-children", "1", *args[1:]]
    folder = REPO / "runs" / "mutation" / scope
    folder.mkdir(parents=True, exist_ok=True)
    if args[0] == "run":  # refresh the copy (mutmut itself copies only what it has not copied yet)
        for name in ("src", "tests", "configs"):  # configs: tests that read the shipped configs
            shutil.copytree(REPO / name, folder / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
        config = {**pyproject, "tool": {**pyproject["tool"], "mutmut": known[scope]}}
        config["tool"]["mutmut"]["use_git_change_detection"] = False  # the copy is not a git checkout
        (folder / "pyproject.toml").write_text(tomli_w.dumps(config))
    # one thread: mutmut forks each mutant's worker from a process that has run torch, and a forked
    # OpenMP thread pool deadlocks (the worker then waits forever without using any CPU)
    env = {"FEDRISK_FUZZ_EXAMPLES": "10", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ}
    command = [str(MUTMUT), *args]
    if args[0] == "run":
        command = ["nice", "-n", "15", *command]
    os.chdir(folder)
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
