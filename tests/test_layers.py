"""The layers of ``docs/architecture.md``: every module of fedrisk imports only its own layer and
the layers below it, deferred (function-level) imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import fedrisk

# top to bottom, as drawn in docs/architecture.md ("fedrisk" is the package's own __init__)
LAYERS: list[set[str]] = [
    {"cli", "cli_list", "deploy", "__main__"},
    {"experiment"},
    {"api", "fedrisk"},
    {"runtime"},
    {"attacks"},
    {"algorithms"},
    {"aggregators"},
    {"objectives"},
    {"models", "data", "metrics"},
    {"tree", "rng", "autodiff", "errors", "registry", "catalog"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def part(module: str) -> str:
    """``fedrisk.algorithms.codasca`` -> ``algorithms``; ``fedrisk`` -> ``fedrisk``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def upward_imports(root: Path) -> list[str]:
    """Every import of a fedrisk module from a higher layer, as ``file: importer -> imported``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        me = part(".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "fedrisk" and LEVEL[part(name)] < LEVEL[me]:
                    found.append(f"{rel}: {me} -> {part(name)}")
    return found


def test_every_part_of_the_package_has_a_layer() -> None:
    root = Path(fedrisk.__file__).parent
    parts = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert parts - {"__init__"} <= set(LEVEL), sorted(parts - {"__init__"} - set(LEVEL))


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports(Path(fedrisk.__file__).parent) == []


def test_an_upward_import_is_reported(tmp_path: Path) -> None:
    pkg = tmp_path / "fedrisk"
    (pkg / "objectives").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "objectives" / "__init__.py").write_text("")
    (pkg / "objectives" / "bad.py").write_text("def f():\n    from fedrisk.runtime.simulation import Simulation\n")
    assert upward_imports(pkg) == ["fedrisk/objectives/bad: objectives -> runtime"]
