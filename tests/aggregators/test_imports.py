"""The aggregator modules import each other without a cycle, deferred (function-level) imports
included: the robust rules and the pre-aggregations share their helpers through
``fedrisk.aggregators.rows``, below both."""

from __future__ import annotations

import ast
from pathlib import Path

import fedrisk.aggregators

PACKAGE = "fedrisk.aggregators"


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its body."""
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        name = f"{package}.{path.stem}" if path.stem != "__init__" else package
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module if node.level == 0 else f"{package}.{node.module}"
                deps.add(module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d.startswith(package + ".") and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep] if dep in path else [node, dep]
            if dep not in state:
                found = visit(dep, [*path, dep])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_aggregator_modules_have_no_import_cycle() -> None:
    graph = import_graph(Path(fedrisk.aggregators.__file__).parent, PACKAGE)
    assert f"{PACKAGE}.rows" in graph[f"{PACKAGE}.preaggregation"]
    assert find_cycle(graph) is None, find_cycle(graph)


def test_find_cycle_sees_a_deferred_import_cycle() -> None:
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": set()}
    assert find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert find_cycle({"p.a": {"p.b"}, "p.b": set()}) is None
