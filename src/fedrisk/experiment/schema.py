"""The config schema: one pydantic model per section, and the models of the named components
(algorithms, datasets, partitioners, models, aggregators, attacks) derived from their own
dataclass fields and signatures.

A fixed key is one annotated line in its section's model: the annotation is its type (``int``,
``float``, ``str``, ``bool``, ``list[int]``, ``int | None``, ``Literal[...]``, a nested
section), :func:`key` gives the default (``...`` = required), the line of the config reference,
a range (``ge`` / ``gt`` / ``le`` / ``lt``) and ``semantic=False`` for keys that do not change a
run's numbers; ``Annotated[str, OneOf("executors")]`` (a registry) or ``OneOf(("a", "b"))``
restricts names.  **Adding a key** to ``[run]`` is therefore one line in :class:`Run`::

    select_by: str = key("", 'metric that picks the reported round; "" = the last round')

then regenerate ``docs/config-reference.md`` (``reference_markdown()`` in
:mod:`fedrisk.experiment.config`; ``tests/experiment/test_docs.py`` says when it is stale).
Cross-key rules (``run.splits`` needs ``data.validation_fraction``, ...) live in
:func:`fedrisk.experiment.config.resolve_config`.  A new table is a :class:`Section` subclass
plus a field of that type in its parent (``binarize: Binarize | None``) or an entry in
:data:`SCHEMA`.

TOML has no null: an optional value is written ``"none"``.  Values are checked strictly
(``true`` is not an integer, ``"3"`` is not a number), except that an integer is a valid
float and a list a valid tuple.  Every problem is reported in one line naming the dotted key,
the value and what is allowed (:func:`validate`).

Example:
    >>> class Demo(Section):
    ...     rounds: int = key(10, "communication rounds", ge=1)
    ...     lr: float | None = key(None, 'a step size; "none" = the default', gt=0)
    >>> obj, problems = validate(Demo, {"rounds": 0, "lr": "fast", "round": 1}, "run")
    >>> print("\\n".join(problems))
    run.rounds = 0 is out of range; allowed: [1, inf)
    run.lr = "fast" has the wrong type; allowed: a number or "none"
    unknown key 'run.round' (did you mean 'run.rounds'?); valid keys in [run]: lr, rounds
    >>> validate(Demo, {"lr": 1, "rounds": 3}, "run")[0], validate(Demo, {"lr": "none"}, "run")[0]
    (Demo(rounds=3, lr=1.0), Demo(rounds=10, lr=None))
    >>> describe(tuple[float, ...]), short(int | None)
    ('a list of numbers', 'int | none')
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import difflib
import functools
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, Union

import annotated_types as at
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic_core import PydanticCustomError, core_schema

from fedrisk.errors import FedriskError

NONE = "none"
"""How a config writes Python's ``None`` (TOML has no null)."""
AUTO = "auto"
RUN_SEED = "run"
SHOWN_DEFAULT = "shown_default"


# ============================================================================= TOML values


def _null(value: Any) -> Any:
    return None if isinstance(value, str) and value == NONE else value


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


_NULLABLE = BeforeValidator(_null)
_SEQUENCES = (list, tuple, cabc.Sequence, cabc.MutableSequence, typing.Sequence, typing.List)  # noqa: UP006


def toml_type(annotation: Any) -> Any | None:
    """The annotation pydantic validates TOML values of ``annotation`` with (``"none"`` for
    None, lists for tuples), or None when a config cannot express it (``Aggregator``, ...)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (Any, object):
        return Annotated[Any, _NULLABLE]
    if annotation in (int, float, str, bool) or (isinstance(annotation, type) and issubclass(annotation, Section)):
        return annotation
    if annotation in (None, type(None)):
        return Annotated[None, _NULLABLE]
    if origin is Annotated:
        inner = toml_type(args[0])
        return None if inner is None else Annotated[(inner, *args[1:])]
    if origin is Literal:
        return annotation
    if origin in (Union, types.UnionType):
        alts = [toml_type(a) for a in args]
        if any(a is None for a in alts):
            return None
        union = Union[tuple(alts)]  # noqa: UP007
        return Annotated[union, _NULLABLE] if type(None) in args else union
    if origin in (dict, cabc.Mapping, cabc.MutableMapping):
        return dict[str, Any]
    if origin in _SEQUENCES or annotation in (list, tuple):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            items = [toml_type(a) for a in args]
            return None if None in items else Annotated[tuple[tuple(items)], BeforeValidator(_as_tuple)]
        item = toml_type(args[0]) if args else Annotated[Any, _NULLABLE]
        if item is None:
            return None
        return Annotated[tuple[item, ...], BeforeValidator(_as_tuple)] if tuple in (origin, annotation) else list[item]
    return None


def type_of_default(value: Any) -> Any | None:
    """The type of a default value (for parameters whose annotation a config cannot express)."""
    if value is None:
        return Any
    if isinstance(value, (bool, int, float, str)):
        return type(value)
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        item = kinds.pop() if len(kinds) == 1 and next(iter(kinds)) in (bool, int, float, str) else Any
        return tuple[item, ...] if isinstance(value, tuple) else list[item]
    return None


def is_plain_value(value: Any) -> bool:
    """True for values a TOML file can hold (scalars, None, lists/tuples of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(is_plain_value(v) for v in value)


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _parts(annotation: Any) -> tuple[Any, Any, tuple[Any, ...]]:
    """``(annotation, origin, args)`` without ``Annotated``, with ``X | Y`` as ``Union``."""
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation)
    return annotation, (Union if origin is types.UnionType else origin), typing.get_args(annotation)


def _is_table(annotation: Any) -> bool:
    """A dict, a sub-section, or an optional sub-section (absent = None)."""
    annotation, origin, args = _parts(annotation)
    if origin is Union:
        return any(isinstance(a, type) and issubclass(a, Section) for a in args)
    return origin is dict or annotation is dict or (isinstance(annotation, type) and issubclass(annotation, Section))


def _fixed_length(origin: Any, args: tuple[Any, ...]) -> bool:
    return origin is tuple and bool(args) and not (len(args) == 2 and args[1] is Ellipsis)


_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): f'"{NONE}"'}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def describe(annotation: Any) -> str:
    """Words for error messages: ``an integer or "none"``, ``a list of numbers``."""
    annotation, origin, args = _parts(annotation)
    if annotation in _WORDS or annotation is None:
        return _WORDS[type(None) if annotation is None else annotation]
    if annotation is Any:
        return "any value"
    if _is_table(annotation):
        return "a table"
    if origin is Union:
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _fixed_length(origin, args):
        return f"a list of {len(args)} (" + ", ".join(describe(a) for a in args) + ")"
    if origin in _SEQUENCES:
        return f"a list of {_PLURAL.get(_strip(args[0]), describe(args[0]))}" if args else "a list of any value"
    return f"(not settable from a config: {annotation})"


def short(annotation: Any) -> str:
    """A compact form for tables: ``int``, ``float | none``, ``list[int]``, ``table``."""
    annotation, origin, args = _parts(annotation)
    if annotation in _WORDS or annotation is None:
        return NONE if annotation in (None, type(None)) else annotation.__name__
    if annotation is Any:
        return "any"
    if _is_table(annotation):
        return "table"
    if origin in (Union, Literal):
        return " | ".join(short(a) if origin is Union else json.dumps(a) for a in args)
    if _fixed_length(origin, args):
        return "list[" + ", ".join(short(a) for a in args) + "]"
    if origin in _SEQUENCES:
        return f"list[{short(args[0]) if args else 'any'}]"
    return getattr(annotation, "__name__", str(annotation))


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


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables -> ``{"a.b.c": value}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


# ============================================================================= names


def attack_registry() -> Any:
    """``fedrisk.attacks.ATTACKS`` when the attacks package registers any (else None)."""
    import fedrisk.attacks as attacks

    return getattr(attacks, "ATTACKS", None)


_REGISTRIES = {
    "datasets": ("fedrisk.data", "DATASETS"),
    "partitioners": ("fedrisk.data", "PARTITIONERS"),
    "models": ("fedrisk.models", "MODELS"),
    "algorithms": ("fedrisk.algorithms", "ALGORITHMS"),
    "executors": ("fedrisk.runtime", "EXECUTORS"),
    "aggregators": ("fedrisk.aggregators", "AGGREGATORS"),
}


def registry_names(kind: str) -> list[str]:
    """Valid names of a kind of component (``datasets``, ``algorithms``, ...)."""
    import importlib

    if kind == "objectives":
        from fedrisk.objectives.supervised import LOSSES

        return [AUTO, *sorted(LOSSES)]
    if kind == "attacks":
        reg = attack_registry()
        return reg.names() if reg is not None else []
    module, attr = _REGISTRIES[kind]
    return getattr(importlib.import_module(module), attr).names()


@dataclasses.dataclass(frozen=True)
class OneOf:
    """``Annotated[str, OneOf("datasets")]``: a registered name (or one of a tuple of names);
    on a list, every item."""

    choices: tuple[str, ...] | str

    def names(self) -> list[str]:
        return registry_names(self.choices) if isinstance(self.choices, str) else list(self.choices)

    def allowed(self) -> str:
        if isinstance(self.choices, str):
            return f"`fedrisk list {self.choices}`"
        return ", ".join(f'"{c}"' for c in self.choices)

    def _check(self, value: Any) -> Any:
        names = self.names()
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item not in names:
                raise PydanticCustomError("unknown_name", "unknown name", {"value": item, "choices": names})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))


def unknown_choice(dotted: str, value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{dotted} = {format_value(value)} is not a known name{hint}; valid choices: {', '.join(sorted(choices))}"


def unknown_key(section: str, key: str, valid: Iterable[str], what: str = "") -> str:
    """``unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in [algorithm]: ...``
    (``valid options of <what>`` for a component's options)."""
    valid = sorted(valid)
    prefix = f"{section}." if section else ""
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {prefix + close[0]!r}?)" if close else ""
    where = f"options of {what}" if what else "keys in " + (f"[{section}]" if section else "the top level")
    return f"unknown key {prefix + key!r}{hint}; valid {where}: {', '.join(valid) or '(none)'}"


# ============================================================================= sections


def key(default: Any, doc: str, *, semantic: bool = True, shown: str | None = None, **constraints: Any) -> Any:
    """A config key: its default (``...`` = required), its line in the reference, a range
    (``ge`` / ``gt`` / ``le`` / ``lt``), ``semantic=False`` when it does not change a run's
    numbers (resume checks and report grouping ignore it), ``shown`` for a default the
    reference describes in words."""
    extra = {"semantic": semantic, **({SHOWN_DEFAULT: shown} if shown else {})}
    return Field(default, description=doc, json_schema_extra=extra, **constraints)


class Section(BaseModel):
    """A config table: unknown keys are errors, values are checked strictly (see the module
    docstring), ``"none"`` is None where a key allows None.  ``component`` names the
    registered object whose ``options`` the table holds beside its fixed keys
    (``"model 'mlp'"``): unknown keys then list those options only.  ``required`` words a
    missing key (``{key}``, ``{type}``)."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    component: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    required: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = {f.alias or n: f for n, f in cls.model_fields.items()}
        return {
            k: None if k in fields and v == NONE and type(None) in _parts(fields[k].annotation)[2] else v
            for k, v in data.items()
        }


def field_names(model: type[BaseModel]) -> list[str]:
    """The config keys of a model (aliases where a key shadows a pydantic attribute)."""
    return [f.alias or n for n, f in model.model_fields.items()]


def _field(model: type[BaseModel], name: str) -> tuple[str, Any] | None:
    for attr, f in model.model_fields.items():
        if (f.alias or attr) == name:
            return attr, f
    return None


def section_values(obj: BaseModel) -> dict[str, Any]:
    """A validated section as nested dicts (sub-sections as tables, absent ones as None)."""
    return {
        (f.alias or n): section_values(v) if isinstance(v := getattr(obj, n), BaseModel) else v
        for n, f in type(obj).model_fields.items()
    }


def derived_section(
    name: str,
    base: type[Section] | tuple[type[Section], ...],
    fields: Mapping[str, tuple[Any, Any]],
    component: str = "",
    required: str = "",
) -> type[Section]:
    """A section model: ``base``'s fixed keys plus ``fields`` (``key -> (annotation, default
    or REQUIRED)``; an annotation of None takes any value unchecked)."""
    defs: dict[str, Any] = {}
    for k, (annotation, default) in fields.items():
        attr = k if not (hasattr(BaseModel, k) or k.startswith("model_")) else f"{k}_"
        default = ... if default is REQUIRED else default
        defs[attr] = (Any if annotation is None else annotation, Field(default, alias=k if attr != k else None))
    model = create_model(name, __base__=base, **defs)
    model.component, model.options, model.required = component, tuple(fields), required
    return model


REQUIRED = inspect.Parameter.empty
"""The default of an option without one."""


def _hints(obj: Any) -> dict[str, Any]:
    """The evaluated annotations of a function or dataclass; one by one when some name cannot
    be resolved (imported only for type checking): those are left out (read from defaults)."""
    target = obj.__init__ if isinstance(obj, type) and not dataclasses.is_dataclass(obj) else obj
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:
        owners = reversed(obj.__mro__) if isinstance(target, type) else [target]
        out = {}
        for owner in owners:
            namespace = vars(sys.modules.get(owner.__module__, typing))
            for name, text in inspect.get_annotations(owner).items():
                try:
                    out[name] = eval(text, namespace) if isinstance(text, str) else text
                except Exception:
                    out.pop(name, None)
        return out


def signature_options(
    fn: Callable[..., Any], exclude: Iterable[str] = (), skip_positional: int = 0
) -> dict[str, tuple[Any, Any]]:
    """``name -> (annotation for pydantic or None = unchecked, default or REQUIRED)`` of the
    keyword-settable parameters of ``fn``."""
    hints = _hints(fn)
    out: dict[str, tuple[Any, Any]] = {}
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        if i < skip_positional or p.name in exclude:
            continue
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        hint = hints.get(p.name, REQUIRED) if p.annotation is not REQUIRED else REQUIRED
        annotation = toml_type(hint) if hint is not REQUIRED else None
        if annotation is None and p.default is not REQUIRED and is_plain_value(p.default):
            annotation = toml_type(type_of_default(p.default))
        out[p.name] = (annotation, p.default)
    return out


@functools.cache
def options_section(
    what: str,
    fn: Callable[..., Any],
    exclude: tuple[str, ...] = (),
    skip: int = 0,
    extra: tuple[tuple[str, Any, Any], ...] = (),
) -> type[Section]:
    """The section model of a component's options (``what`` = ``"dataset 'digits'"``): the
    keyword parameters of ``fn`` but ``exclude`` and the first ``skip``, plus ``extra`` keys
    ``(name, annotation, default)``."""
    opts = signature_options(fn, exclude, skip)
    opts.update({k: (toml_type(annotation), default) for k, annotation, default in extra})
    return derived_section(f"Options[{what}]", Section, opts, what)


@dataclasses.dataclass(frozen=True)
class AlgorithmFields:
    """How the fields of an algorithm dataclass map onto the config.

    Attributes:
        hyper: settable hyper-parameters ``name -> (annotation, default or REQUIRED)``.
        loss: the name of the field holding the loss function (None if the algorithm has none).
        aggregator: the name of the aggregator field (None if none).
        server_opt: the name of the server-optimiser field (None if none).
        fixed: fields the config cannot set (they keep their Python default).
    """

    hyper: dict[str, tuple[Any, Any]]
    loss: str | None
    aggregator: str | None
    server_opt: str | None
    fixed: tuple[str, ...]


@functools.cache
def algorithm_fields(cls: type) -> AlgorithmFields:
    """Classify the dataclass fields of algorithm ``cls``: a field is a hyper-parameter when its
    annotation (or, failing that, its default) is a TOML type; ``model`` and the loss are built
    by the runner, the ``Aggregator`` and ``ServerOpt`` fields are set by their own keys.

    Example:
        >>> from fedrisk.algorithms import FedAvg
        >>> f = algorithm_fields(FedAvg)
        >>> sorted(f.hyper)[:3], f.loss, f.aggregator, f.server_opt
        (['batch_size', 'clients_per_round', 'local_steps'], 'loss', 'aggregator', 'server_opt')
    """
    hints = _hints(cls)
    hyper: dict[str, tuple[Any, Any]] = {}
    loss = aggregator = server_opt = None
    fixed = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "model":
            continue
        text = f.type if isinstance(f.type, str) else str(f.type)
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        annotation = toml_type(hints[f.name]) if f.name in hints else None
        if "ServerOpt" in text:
            server_opt = f.name
        elif "Aggregator" in text:
            aggregator = f.name
        elif "LossFn" in text or (f.name == "loss" and annotation is None):
            loss = f.name
        elif annotation is not None:
            hyper[f.name] = (annotation, default)
        elif default is not REQUIRED and is_plain_value(default) and default is not None:
            hyper[f.name] = (toml_type(type_of_default(default)), default)
        elif default is REQUIRED:
            raise FedriskError(
                f"algorithm {getattr(cls, 'name', cls.__name__)!r}: field {f.name!r} ({text}) has no default and "
                "cannot be set from a config"
            )
        else:
            fixed.append(f.name)
    return AlgorithmFields(hyper, loss, aggregator, server_opt, tuple(fixed))


# ============================================================================= validation

_RANGE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def interval(info: Any) -> str:
    """``[0.0, 1.0)`` from a field's ``ge`` / ``gt`` / ``le`` / ``lt`` ("" when it has none)."""
    low = high = None
    low_in = high_in = True
    for m in info.metadata:
        if isinstance(m, (at.Ge, at.Gt)):
            low, low_in = (m.ge, True) if isinstance(m, at.Ge) else (m.gt, False)
        elif isinstance(m, (at.Le, at.Lt)):
            high, high_in = (m.le, True) if isinstance(m, at.Le) else (m.lt, False)
    if low is None and high is None:
        return ""
    lb = "[" if low_in and low is not None else "("
    rb = "]" if high_in and high is not None else ")"
    return f"{lb}{'-inf' if low is None else repr(low)}, {'inf' if high is None else repr(high)}{rb}"


def _nested(info: Any) -> type[Section] | None:
    annotation, origin, args = _parts(info.annotation)
    for a in args if origin is Union else (annotation,):
        if isinstance(a, type) and issubclass(a, Section):
            return a
    return None


class ConfigError(FedriskError):
    """Every problem of a config, one line each (``problems``; the message joins them)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def validate(model: type[Section], table: Any, section: str) -> tuple[Section | None, list[str]]:
    """``(the validated section, [])`` or ``(None, one line per problem)``; ``section`` is the
    dotted name of the table (``"data"``, ``"data.dataset_options"``)."""
    if not isinstance(table, Mapping):
        return None, [f"[{section}] must be a table; got {format_value(table)}"]
    try:
        return model.model_validate(dict(table)), []
    except ValidationError as exc:
        return None, explain(model, table, section, exc.errors())


def explain(model: type[Section], table: Mapping[str, Any], section: str, errors: list[Any]) -> list[str]:
    """pydantic's errors as the config's one-line messages: one per key (a key's errors inside
    a list or a union are one problem about the key's whole value)."""
    groups: dict[tuple[str, ...], tuple[type[Section], Any, list[Any]]] = {}
    for err in errors:
        current, info, path = model, None, ()
        for part in err["loc"]:
            found = _field(current, part) if isinstance(part, str) else None
            if found is None:  # an index or a union member below a key, or a key `current` lacks
                path += (part,) if isinstance(part, str) and err["type"] == "extra_forbidden" else ()
                break
            path, info = (*path, part), found[1]
            if (inner := _nested(info)) is None:
                break
            current = inner
        if err["type"] == "missing" and len(err["loc"]) > len(path):  # an item of a fixed-length list
            err = {**err, "type": "too_short"}
        groups.setdefault(path, (current, info, []))[2].append(err)
    problems: list[str] = []
    missing: dict[type[Section], list[str]] = {}
    for path, (current, info, errs) in groups.items():
        dotted = ".".join((section, *path)) if section else ".".join(path)
        kinds = {e["type"] for e in errs}
        value = _lookup(table, path)
        if "extra_forbidden" in kinds:
            valid = current.options if current.component else field_names(current)
            problems.append(unknown_key(dotted.rpartition(".")[0], path[-1], valid, current.component))
        elif "missing" in kinds and current.component and path[-1] in current.options:
            missing.setdefault(current, []).append(dotted)
        elif "missing" in kinds:
            one_of = next((m for m in info.metadata if isinstance(m, OneOf)), None)
            choices = f"; valid choices: {', '.join(one_of.names())}" if one_of else ""
            phrase = current.required.replace("{key}", dotted).replace("{type}", describe(info.annotation))
            problems.append(phrase or f"missing required key {dotted!r}{choices}")
        elif "unknown_name" in kinds:
            ctx = next(e["ctx"] for e in errs if e["type"] == "unknown_name")
            problems.append(unknown_choice(dotted, ctx["value"], ctx["choices"]))
        elif kinds <= set(_RANGE):
            numeric = float in (_strip(info.annotation), *_parts(info.annotation)[2])
            shown = float(value) if numeric and isinstance(value, int) else value
            problems.append(f"{dotted} = {shown!r} is out of range; allowed: {interval(info)}")
        else:
            problems.append(
                f"{dotted} = {format_value(value)} has the wrong type; allowed: {describe(info.annotation)}"
            )
    problems += [f"{current.component} needs {', '.join(repr(k) for k in keys)}" for current, keys in missing.items()]
    return problems


def _lookup(table: Any, path: Sequence[str]) -> Any:
    for part in path:
        table = table.get(part) if isinstance(table, Mapping) else None
    return table
