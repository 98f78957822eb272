"""The names and one-line descriptions of fedrisk's built-in components, read from its source
without importing it.

``fedrisk list`` prints every registry (algorithms, datasets, models, ...).  Importing the
registries imports torch (1-2 s); their names and descriptions, however, are string literals in
the registering calls (``ALGORITHMS.add("fedavg", FedAvg, "FedAvg: ...")``,
``@DATASETS.register("digits", "...")`` at the start of a line) and in the ``LOSSES`` table,
so :func:`catalog` finds those calls in the package's source files and parses just them with
:mod:`ast`: a few milliseconds.

It answers only when the reading is certain: a registering call whose name or description is
not a string literal, a name registered twice, or a call that does not parse makes it return
``None``, and the caller imports the registries instead.  Components registered at run
time by user code (a config's ``imports``) are not built-in and are not listed here.
``tests/experiment/test_startup.py`` checks that the catalog equals the imported registries.

Example:
    >>> cat = catalog()
    >>> cat is not None and ("fedavg" in dict(cat["algorithms"]))
    True
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

__all__ = ["REGISTRY_VARIABLES", "catalog"]

REGISTRY_VARIABLES = {
    "algorithms": "ALGORITHMS",
    "datasets": "DATASETS",
    "partitioners": "PARTITIONERS",
    "models": "MODELS",
    "aggregators": "AGGREGATORS",
    "executors": "EXECUTORS",
    "metrics": "METRICS",
    "attacks": "ATTACKS",
}
"""Kind (as ``fedrisk list`` names it) -> the registry's module-level variable."""

_KIND_OF = {v: k for k, v in REGISTRY_VARIABLES.items()}
_PACKAGE = Path(__file__).resolve().parent


class _Uncertain(Exception):
    """A registration the catalog cannot read from the source."""


def _literal(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise _Uncertain


_CALL = re.compile(r"^[ \t]*@?(" + "|".join(_KIND_OF) + r")\.(add|register)\(", re.MULTILINE)
_LOSSES = re.compile(r"^LOSSES\b[^=\n]*=\s*\{", re.MULTILINE)


def _expression(text: str, start: int, close: str) -> ast.expr:
    """The Python expression that starts at ``text[start]`` and ends at one of the following
    ``close`` characters: the shortest such piece that parses (parsing whole modules costs
    ~0.2 s; these pieces, a millisecond)."""
    end = text.find(close, start)
    while end != -1:
        try:
            return ast.parse(text[start : end + 1], mode="eval").body
        except SyntaxError:
            end = text.find(close, end + 1)
    raise _Uncertain


def _registrations(text: str) -> list[tuple[str, str, str]]:
    """``(kind, name, description)`` of every ``VAR.add(name, obj, description)`` and
    ``@VAR.register(name, description)`` call that starts a line of ``text``."""
    out = []
    for match in _CALL.finditer(text):
        call = _expression(text, match.start(1), ")")
        if not isinstance(call, ast.Call):
            raise _Uncertain
        keywords = {k.arg: k.value for k in call.keywords}
        position = 2 if match.group(2) == "add" else 1
        name = call.args[0] if call.args else keywords.get("name")
        desc = call.args[position] if len(call.args) > position else keywords.get("description")
        out.append((_KIND_OF[match.group(1)], _literal(name), _literal(desc)))
    return out


def _losses(text: str) -> list[tuple[str, str]]:
    """``(name, description)`` of the ``LOSSES = {name: (fn, description), ...}`` table."""
    match = _LOSSES.search(text)
    if match is None:
        raise _Uncertain
    table = _expression(text, match.end() - 1, "}")
    if not isinstance(table, ast.Dict):
        raise _Uncertain
    rows = []
    for k, v in zip(table.keys, table.values):
        if not (isinstance(v, ast.Tuple) and len(v.elts) == 2):
            raise _Uncertain
        rows.append((_literal(k), _literal(v.elts[1])))
    return rows


def catalog() -> dict[str, list[tuple[str, str]]] | None:
    """Kind -> sorted ``(name, description)`` of the built-in components (``objectives`` from the
    ``LOSSES`` table); ``None`` when some registration cannot be read from the source."""
    found: dict[str, dict[str, str]] = {kind: {} for kind in REGISTRY_VARIABLES}
    try:
        for path in sorted(_PACKAGE.rglob("*.py")):
            if path.name == "catalog.py" and path.parent == _PACKAGE:
                continue
            for kind, name, desc in _registrations(path.read_text(encoding="utf-8")):
                if name in found[kind]:
                    raise _Uncertain
                found[kind][name] = desc
        losses = _losses((_PACKAGE / "objectives" / "supervised.py").read_text(encoding="utf-8"))
    except (_Uncertain, OSError, UnicodeDecodeError):
        return None
    out = {kind: sorted(entries.items()) for kind, entries in found.items()}
    out["objectives"] = sorted(losses)
    return out
