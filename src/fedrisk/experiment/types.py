"""Config value types: a tiny type language, parsed from annotation strings, that checks and
coerces TOML values and describes itself in error messages.

The same checker serves the fixed config keys (whose types are written in the schema) and the
algorithms' hyper-parameters (whose types come from their dataclass annotations, e.g.
``"int | None"`` or ``"tuple[float, ...]"``).  TOML has no null, so an optional value is
written as the string ``"none"``.

Example:
    >>> spec = parse_type("int | None")
    >>> coerce("algorithm.clients_per_round", "none", spec) is None
    True
    >>> coerce("algorithm.lr", 1, parse_type("float"))
    1.0
    >>> coerce("model.hidden", [64, 32], parse_type("tuple[int, ...]"))
    (64, 32)
    >>> coerce("run.rounds", 2.5, parse_type("int"))
    Traceback (most recent call last):
    fedrisk.errors.FedriskError: run.rounds = 2.5 has the wrong type; allowed: an integer
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from fedrisk.errors import FedriskError

NONE = "none"
"""How a config writes Python's ``None`` (TOML has no null)."""

SCALARS = ("int", "float", "str", "bool", "None")
_ALIASES = {
    "NoneType": "None",
    "Sequence": "list",
    "List": "list",
    "list": "list",
    "Tuple": "tuple",
    "tuple": "tuple",
    "Optional": "optional",
    "Literal": "literal",
    "Any": "any",
    "object": "any",
}


@dataclass(frozen=True)
class TypeSpec:
    """A parsed type: ``kind`` is one of the scalars, ``"list"``, ``"tuple"``, ``"union"``,
    ``"literal"``, ``"any"`` or ``"opaque"`` (a type a config cannot express)."""

    kind: str
    args: tuple[Any, ...] = ()
    variadic: bool = False  # tuple[X, ...]

    @property
    def plain(self) -> bool:
        """True when every value of the type can be written in TOML."""
        if self.kind == "opaque":
            return False
        if self.kind in ("list", "tuple", "union"):
            return all(a.plain for a in self.args)
        return True

    @property
    def optional(self) -> bool:
        return self.kind == "None" or (self.kind == "union" and any(a.kind == "None" for a in self.args))

    def describe(self) -> str:
        """Words for error messages and the config reference."""
        if self.kind == "int":
            return "an integer"
        if self.kind == "float":
            return "a number"
        if self.kind == "str":
            return "a string"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "None":
            return f'"{NONE}"'
        if self.kind == "any":
            return "any value"
        if self.kind == "literal":
            return "one of " + ", ".join(repr(a) for a in self.args)
        if self.kind in ("list", "tuple"):
            if self.variadic or self.kind == "list":
                return f"a list of {_plural(self.args[0])}"
            return "a list of " + str(len(self.args)) + " (" + ", ".join(a.describe() for a in self.args) + ")"
        if self.kind == "union":
            return " or ".join(a.describe() for a in self.args)
        return f"(not settable from a config: {self.args[0] if self.args else '?'})"

    def short(self) -> str:
        """A compact form for tables: ``int``, ``float | none``, ``list[int]``."""
        if self.kind in SCALARS:
            return NONE if self.kind == "None" else self.kind
        if self.kind in ("any", "opaque"):
            return self.kind if self.kind == "any" else str(self.args[0])
        if self.kind == "literal":
            return " | ".join(repr(a).replace("'", '"') for a in self.args)
        if self.kind == "list" or (self.kind == "tuple" and self.variadic):
            return f"list[{self.args[0].short()}]"
        if self.kind == "tuple":
            return "list[" + ", ".join(a.short() for a in self.args) + "]"
        return " | ".join(a.short() for a in self.args)


def _plural(spec: TypeSpec) -> str:
    words = {"int": "integers", "float": "numbers", "str": "strings", "bool": "booleans"}
    return words.get(spec.kind, spec.describe())


# ----------------------------------------------------------------------------- parsing

_TOKEN = re.compile(r"\s*(\.\.\.|[A-Za-z_][A-Za-z_0-9.]*|'[^']*'|\"[^\"]*\"|-?\d+(?:\.\d*)?|[\[\],|])")


def parse_type(annotation: Any) -> TypeSpec:
    """Parse an annotation (a string such as ``"float | None"`` or a type object).

    Names the config cannot express (``Aggregator``, ``LossFn``, ...) become ``opaque``.
    """
    if not isinstance(annotation, str):
        annotation = _annotation_text(annotation)
    tokens = [t for t in _TOKEN.findall(annotation) if t]
    if not tokens:
        return TypeSpec("opaque", (annotation,))
    try:
        spec, pos = _parse_union(tokens, 0)
    except (IndexError, ValueError):
        return TypeSpec("opaque", (annotation,))
    if pos != len(tokens):
        return TypeSpec("opaque", (annotation,))
    return spec


def _annotation_text(obj: Any) -> str:
    if obj is None or obj is type(None):
        return "None"
    if isinstance(obj, type) and not getattr(obj, "__args__", None):
        return obj.__name__
    return str(obj).replace("typing.", "").replace("collections.abc.", "")


def _parse_union(tokens: list[str], pos: int) -> tuple[TypeSpec, int]:
    alts = []
    spec, pos = _parse_atom(tokens, pos)
    alts.append(spec)
    while pos < len(tokens) and tokens[pos] == "|":
        spec, pos = _parse_atom(tokens, pos + 1)
        alts.append(spec)
    return (alts[0] if len(alts) == 1 else _union(alts)), pos


def _union(alts: list[TypeSpec]) -> TypeSpec:
    flat: list[TypeSpec] = []
    for a in alts:
        flat.extend(a.args if a.kind == "union" else (a,))
    return TypeSpec("union", tuple(flat))


def _parse_atom(tokens: list[str], pos: int) -> tuple[TypeSpec, int]:
    name = tokens[pos].rsplit(".", 1)[-1]
    pos += 1
    args: list[Any] = []
    variadic = False
    if pos < len(tokens) and tokens[pos] == "[":
        pos += 1
        while tokens[pos] != "]":
            if tokens[pos] == "...":
                variadic = True
                pos += 1
            elif _ALIASES.get(name) == "literal":
                args.append(ast.literal_eval(tokens[pos]))
                pos += 1
            else:
                sub, pos = _parse_union(tokens, pos)
                args.append(sub)
            if tokens[pos] == ",":
                pos += 1
        pos += 1
    kind = _ALIASES.get(name, name)
    if kind in SCALARS:
        return TypeSpec(kind), pos
    if kind == "any":
        return TypeSpec("any"), pos
    if kind == "literal":
        return TypeSpec("literal", tuple(args)), pos
    if kind == "optional":
        return _union([args[0], TypeSpec("None")]), pos
    if kind == "Union":
        return _union(args), pos
    if kind == "list":
        return TypeSpec("list", (args[0] if args else TypeSpec("any"),)), pos
    if kind == "tuple":
        if not args:
            return TypeSpec("tuple", (TypeSpec("any"),), variadic=True), pos
        return TypeSpec("tuple", tuple(args), variadic=variadic), pos
    return TypeSpec("opaque", (name,)), pos


def infer_type(value: Any) -> TypeSpec:
    """The type of a default value (for fields whose annotation cannot be read)."""
    if value is None:
        return TypeSpec("any")
    if isinstance(value, bool):
        return TypeSpec("bool")
    if isinstance(value, int):
        return TypeSpec("int")
    if isinstance(value, float):
        return TypeSpec("float")
    if isinstance(value, str):
        return TypeSpec("str")
    if isinstance(value, (list, tuple)):
        elems = {infer_type(v).kind for v in value}
        elem = TypeSpec(elems.pop()) if len(elems) == 1 and next(iter(elems), "") in SCALARS else TypeSpec("any")
        return TypeSpec("tuple" if isinstance(value, tuple) else "list", (elem,), variadic=True)
    return TypeSpec("opaque", (type(value).__name__,))


def is_plain_value(value: Any) -> bool:
    """True for values a TOML file can hold (scalars, None, lists/tuples of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain_value(v) for v in value)
    return False


# ----------------------------------------------------------------------------- checking


class _Mismatch(Exception):
    pass


def coerce(key: str, value: Any, spec: TypeSpec) -> Any:
    """``value`` converted to ``spec`` (int -> float, list -> tuple, "none" -> None), or a
    :class:`FedriskError` naming ``key``, the value and the allowed type."""
    try:
        return _coerce(value, spec)
    except _Mismatch:
        raise FedriskError(f"{key} = {format_value(value)} has the wrong type; allowed: {spec.describe()}") from None


def _coerce(value: Any, spec: TypeSpec) -> Any:
    kind = spec.kind
    if kind == "any":
        return None if value == NONE else value
    if kind == "None":
        if value is None or value == NONE:
            return None
        raise _Mismatch
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if kind == "str":
        if isinstance(value, str):
            return value
        raise _Mismatch
    if kind == "literal":
        if value in spec.args and type(value) in {type(a) for a in spec.args}:
            return value
        raise _Mismatch
    if kind in ("list", "tuple"):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if kind == "list" or spec.variadic:
            out = [_coerce(v, spec.args[0]) for v in value]
        else:
            if len(value) != len(spec.args):
                raise _Mismatch
            out = [_coerce(v, s) for v, s in zip(value, spec.args)]
        return tuple(out) if kind == "tuple" else out
    if kind == "union":
        # None first so that "none" is not taken as a string; then the exact kinds before
        # the widening ones (int before float).
        order = sorted(spec.args, key=lambda s: {"None": 0, "bool": 1, "int": 2, "float": 3}.get(s.kind, 4))
        for alt in order:
            try:
                return _coerce(value, alt)
            except _Mismatch:
                continue
        raise _Mismatch
    raise _Mismatch


def _toml_key(key: Any) -> str:
    """A bare TOML key when it can be one, else a quoted (escaped) one."""
    text = str(key)
    return text if text and all(c.isascii() and (c.isalnum() or c in "_-") for c in text) else json.dumps(text)


def format_value(value: Any) -> str:
    """A value as a config would write it (for messages)."""
    if value is None:
        return f'"{NONE}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a TOML basic string: control characters escaped, so a message stays one line
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {format_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def to_toml_value(value: Any) -> Any:
    """A Python value as TOML can store it (None -> "none", tuples -> lists)."""
    if value is None:
        return NONE
    if isinstance(value, (list, tuple)):
        return [to_toml_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_toml_value(v) for k, v in value.items()}
    return value
