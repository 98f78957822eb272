"""Experiment configs: TOML files validated up front, ``--set key=value`` overrides, and the
resolved config written with every run.

A config has these sections (``docs/config-reference.md`` lists every key; ``fedrisk list``
the names)::

    imports = []            # optional: modules to import first (your own algorithms, datasets);
                            # the config's folder and the current folder go on sys.path
    [data]                  # dataset, partition, num_clients, ... -> fedrisk.data.build_federation
    [data.dataset_options]  # options of the dataset loader (open table, checked against it)
    [data.partition_options]# options of the partitioner: alpha, min_size, classes_per_client, ...
    [data.binarize]         # optional: positive_classes, imratio, per_class, balanced_test
    [model]                 # name + the model's options (hidden = [64], ...) + num_outputs
    [objective]             # name of the loss (fedrisk.objectives.supervised.LOSSES) or "auto"
    [algorithm]             # name + its hyper-parameters (the algorithm dataclass's fields)
    [attack]                # optional: a Byzantine attack and the Byzantine clients
    [run]                   # rounds, seed(s), executor, evaluation schedule, checkpoints, ...
    [output]                # dir, plots, tensorboard / mlflow tracking
    [sweep]                 # only for `fedrisk sweep`: seeds, jobs, grid, variants

Each table is a pydantic model (:mod:`fedrisk.experiment.sections`, which says how to add a
key: one line there); the ``[algorithm]`` table of an algorithm and the options of a dataset,
partitioner, model, aggregator or attack are models derived from the registered dataclass /
signature (:mod:`fedrisk.experiment.schema`), which stays the single source of their names,
types and defaults.  Rules between keys live in the ``_resolve_*`` functions below.

Validation happens before any data is loaded and reports every problem of the file, one line
each: unknown sections, keys and names get the key, a close match and the valid choices; wrong
types and ranges get the key, the value and what is allowed.  ``--set`` overrides go through
the same checks.  The *resolved* config holds every key with its effective value (defaults
filled in, including the algorithm's and the model's defaults); loading it again gives the
same run.

Resolved ambiguities:

* TOML has no null: ``"none"`` stands for Python's ``None`` (e.g. ``clients_per_round``).
* ``data.seed = "run"`` (the default) partitions with the run's seed, so repeating a run over
  seeds also varies the split; set an integer to hold the split fixed across seeds.
* ``model.num_outputs = "auto"`` is 1 for regression, for one-output objectives
  (``binary_cross_entropy*``, ``mse``) and for scorers on a binary task: algorithms declaring
  ``scorer = True``, or (without that attribute) algorithms that define their own objective
  (no ``loss`` field, e.g. the AUC min-max family); otherwise the number of classes.
* ``objective.name = "auto"`` is ``mse`` for regression, ``binary_cross_entropy`` for one
  output, else ``cross_entropy``.  Algorithms without a ``loss`` field define their own
  objective through their hyper-parameters and reject ``[objective]``.
* An algorithm field is a config hyper-parameter when its annotation (or, failing that, its
  default) is a plain TOML type (numbers, strings, booleans, none, lists of them).  ``model``
  and the ``loss`` are built by the runner, a field typed ``Aggregator`` is set by name
  (``aggregator = "median"`` or ``aggregator = {name = "trimmed_mean", ...}``) and a field
  typed ``ServerOpt`` by ``server_lr`` / ``server_momentum`` / ``server_nesterov``
  (``chain(server_momentum, server_lr)``, i.e. FedAvgM's ``m <- beta m + delta``, step
  ``eta * m``).  Other fields keep their Python default.

Example:
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 4},
    ...                       "algorithm": {"name": "fedavg", "lr": 0.05}}, overrides=["run.rounds=3"])
    >>> cfg["algorithm.lr"], cfg["algorithm.local_steps"], cfg["run.rounds"], cfg["data.partition"]
    (0.05, 1, 3, 'iid')
    >>> resolve_config({"data": {"dataset": "digits"}, "algorithm": {"lrr": 0.1}})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    fedrisk.experiment.config.ConfigError: unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in ...
    >>> resolve_config({"data": {"dataset": "digits", "num_clients": 0}, "run": {"rounds": "3"}})
    Traceback (most recent call last):
    fedrisk.experiment.config.ConfigError: data.num_clients = 0 is out of range; allowed: [1, inf)
    run.rounds = "3" has the wrong type; allowed: an integer
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import tomllib
from pydantic_core import PydanticUndefined

from fedrisk.errors import FedriskError, check_range
from fedrisk.experiment.schema import (
    AUTO,
    NONE,
    REQUIRED,
    RUN_SEED,
    SHOWN_DEFAULT,
    AlgorithmFields,
    OneOf,
    Section,
    algorithm_fields,
    attack_registry,
    derived_section,
    describe,
    field_names,
    format_value,
    interval,
    is_plain_value,
    options_section,
    registry_names,
    section_values,
    short,
    signature_options,
    to_toml_value,
    unknown_choice,
    validate,
)
from fedrisk.experiment.schema import unknown_key as unknown_key
from fedrisk.experiment.sections import (
    OPTIONAL_TABLES,
    SCHEMA,
    SECTIONS,
    Algorithm,
    AlgorithmName,
    Attack,
    Data,
    Model,
    Objective,
    Output,
    Run,
    ServerStep,
    Sweep,
)

__all__ = [
    "AUTO",
    "NONE",
    "REQUIRED",
    "RUN_SEED",
    "SCHEMA",
    "AlgorithmFields",
    "ConfigError",
    "ExperimentConfig",
    "algorithm_fields",
    "attack_registry",
    "load_config",
    "registry_names",
    "resolve_config",
    "signature_options",
]

# ============================================================================= dotted keys


def parse_literal(text: str) -> Any:
    """A ``--set`` / ``--grid`` value: a TOML literal (``0.1``, ``true``, ``[64, 32]``,
    ``"x"``), or the bare text as a string (``fedavg``).

    Example:
        >>> parse_literal("0.1"), parse_literal("true"), parse_literal("[64, 32]"), parse_literal("fedavg")
        (0.1, True, [64, 32], 'fedavg')
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def parse_assignment(text: str, flag: str = "--set") -> tuple[str, Any]:
    """``"algorithm.lr=0.05"`` -> ``("algorithm.lr", 0.05)``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise FedriskError(f"{flag} expects key=value with a dotted key (e.g. algorithm.lr=0.05); got {text!r}")
    return key, parse_literal(value.strip())


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """``tree[a][b][c] = value`` for ``key = "a.b.c"`` (creating tables on the way)."""
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise FedriskError(
                f"cannot set {key!r}: {'.'.join(parts[: i + 1])!r} is a value ({format_value(child)}), not a table"
            )
        node = child
    node[parts[-1]] = value


def get_dotted(tree: Mapping[str, Any], key: str, default: Any = None) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


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


def apply_overrides(
    raw: Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any], flag: str = "--set"
) -> dict[str, Any]:
    """A deep copy of ``raw`` with ``key=value`` overrides applied."""
    out = copy.deepcopy(dict(raw))
    items = overrides.items() if isinstance(overrides, Mapping) else (parse_assignment(o, flag) for o in overrides)
    for key, value in items:
        set_dotted(out, key, value)
    return out


# ============================================================================= loading


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error becomes a :class:`FedriskError`."""
    p = Path(path)
    if not p.is_file():
        raise FedriskError(f"config file {str(p)!r} does not exist")
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise FedriskError(f"{p}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise FedriskError(f"{p}: not a text file (TOML is UTF-8; byte {exc.start} is not)") from None
    except OSError as exc:
        raise FedriskError(f"cannot read config file {str(p)!r}: {exc.strerror or exc}") from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read, override and validate a config file.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); f = os.path.join(d, "c.toml")
        >>> _ = open(f, "w").write('[data]\\ndataset = "digits"\\n[run]\\nrounds = 5\\n')
        >>> load_config(f, ["run.rounds=7"])["run.rounds"]
        7
    """
    raw = read_toml(path)
    return resolve_config(raw, overrides, source=Path(path))


# ============================================================================= resolution


@dataclass
class ExperimentConfig:
    """A validated config.

    Attributes:
        values: the resolved config as nested dicts of Python values (every key present).
        raw: the user's tables after overrides (what was actually written).
        source: the file it was read from (None when built in Python).
    """

    values: dict[str, Any]
    raw: dict[str, Any]
    source: Path | None = None

    def __getitem__(self, dotted: str) -> Any:
        sentinel = object()
        value = get_dotted(self.values, dotted, sentinel)
        if value is sentinel:
            raise KeyError(dotted)
        return value

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.values.get(name) or {})

    @property
    def name(self) -> str:
        """A short name: the config file's stem (``"config"`` when built in Python)."""
        return self.source.stem if self.source is not None else "config"

    def with_overrides(self, overrides: Sequence[str] | Mapping[str, Any]) -> ExperimentConfig:
        """The config re-resolved from its raw tables plus ``overrides``."""
        return resolve_config(apply_overrides(self.raw, overrides), source=self.source)

    def run_values(self) -> dict[str, Any]:
        """The resolved values of one run (no ``[sweep]`` table)."""
        out = {k: v for k, v in self.values.items() if k != "sweep"}
        data = out.get("data")
        if data is not None:  # absent optional tables stay absent (not "none")
            out["data"] = {k: v for k, v in data.items() if not (f"data.{k}" in OPTIONAL_TABLES and v is None)}
        return out

    def to_toml(self) -> str:
        """The resolved config of one run as TOML (``"none"`` for None)."""
        header = "# Resolved fedrisk config: every key with its effective value.\n"
        header += "# Run it again with `fedrisk run <this file>`.\n"
        return header + tomli_w.dumps(to_toml_value(self.run_values()))

    def semantic(self) -> dict[str, Any]:
        """Dotted keys -> values of every key that can change the run's numbers."""
        return semantic_view(self.run_values())


def semantic_view(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flattened ``values`` without the keys marked ``semantic=False`` and without [sweep]."""
    skip = {
        f"{sec}.{name}" if sec else name
        for sec, model in SCHEMA.items()
        for name, f in model.model_fields.items()
        if not (f.json_schema_extra or {}).get("semantic", True)
    }
    flat = flatten(to_toml_value({k: v for k, v in values.items() if k != "sweep"}))
    return {k: v for k, v in flat.items() if k not in skip and not k.startswith("output.")}


def diff_configs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(key, a_value, b_value)]`` for the dotted keys whose values differ."""
    missing = object()
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k, missing), b.get(k, missing)) for k in keys if a.get(k, missing) != b.get(k, missing)]


# ============================================================================= resolution


class ConfigError(FedriskError):
    """Every problem of a config, one line each (``problems``; the message joins them)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def resolve_config(
    raw: Mapping[str, Any],
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    source: Path | None = None,
) -> ExperimentConfig:
    """Validate ``raw`` (plus overrides) and fill every default; see the module docstring.
    Every problem of the config is reported, one line each, in one :class:`FedriskError`
    (a file whose top level is wrong stops there: its sections cannot be told apart)."""
    raw = apply_overrides(raw, overrides)
    _import_plugins(raw.get("imports", []), source)
    shape = [unknown_key("", k, [*SECTIONS, "imports"]) for k in raw if k not in SECTIONS and k != "imports"]
    shape += [
        f"{k} must be a table ([{k}]); got {format_value(raw[k])}"
        for k in raw
        if k in SECTIONS and not isinstance(raw[k], Mapping)
    ]
    if "data" not in raw and not shape:  # (a misspelt [data] is the likelier problem: it is named first)
        shape.append(
            'the config needs a [data] table with at least dataset = "..."; valid datasets: '
            + ", ".join(registry_names("datasets"))
        )
    if shape:
        raise ConfigError(shape)
    problems: list[str] = []
    data = _resolve_data(raw["data"], problems)
    model = _resolve_model(raw.get("model", {}), problems)
    algorithm = _resolve_algorithm(raw.get("algorithm", {}), problems)
    objective = _resolve_objective(raw.get("objective", {}), algorithm, problems)
    attack = _resolve_attack(raw["attack"], data, problems) if "attack" in raw else None
    run = _resolve_run(raw.get("run", {}), data, problems)
    if algorithm is not None and run is not None:
        problems += _stage_round_problems(algorithm, run["rounds"])
    output = _section(Output, raw.get("output", {}), "output", problems)
    sweep = _resolve_sweep(raw.get("sweep", {}), problems)
    if problems:
        raise ConfigError(problems)
    values: dict[str, Any] = {"imports": list(raw.get("imports", [])), "data": data, "model": model}
    values.update(objective=objective, algorithm=algorithm)
    if attack is not None:
        values["attack"] = attack
    values.update(run=run, output=output, sweep=sweep)
    return ExperimentConfig(values=values, raw=raw, source=source)


STAGE_ROUND_FIELDS = ("warmup_rounds", "fedavg_rounds")
"""Algorithm hyper-parameters that count rounds of a first stage (PERM's warm-up, two-stage
PERM's FedAvg stage): the run must be longer."""


def _stage_round_problems(algorithm: Mapping[str, Any], rounds: int) -> list[str]:
    return [
        f"algorithm.{k} = {algorithm[k]} is not below run.rounds = {rounds}: the run would end before "
        f"{algorithm.get('name')!r} starts personalising; lower {k} or raise run.rounds"
        for k in STAGE_ROUND_FIELDS
        if isinstance(algorithm.get(k), int) and algorithm[k] >= rounds
    ]


def _import_plugins(modules: Any, source: Path | None) -> None:
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise FedriskError(f"imports = {format_value(modules)} has the wrong type; allowed: a list of module names")
    for folder in ([source.parent] if source is not None else []) + [Path.cwd()]:
        if str(folder.resolve()) not in sys.path:
            sys.path.insert(0, str(folder.resolve()))
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise FedriskError(f"imports: cannot import module {mod!r}: {exc}") from None


def _section(model: type[Section], table: Any, name: str, problems: list[str]) -> dict[str, Any] | None:
    """The validated table as a dict (every key, defaults filled), or None with its problems
    added to ``problems``."""
    obj, found = validate(model, table, name)
    problems += found
    return None if obj is None else section_values(obj)


def _check(problems: list[str], check: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        check(*args, **kwargs)
    except FedriskError as exc:
        problems.append(str(exc))


def _options(model: type[Section], table: Any, name: str, problems: list[str], fill: bool) -> dict[str, Any]:
    """A component's options (``model.component`` names it): the given ones validated, plus
    (with ``fill``) the defaults TOML can hold."""
    values = _section(model, table, name, problems) or {}
    out = {k: values[k] for k in table if k in values}
    if fill:
        for k, f in model.model_fields.items():
            default = f.get_default(call_default_factory=True)
            if (f.alias or k) not in out and is_plain_value(default):
                out[f.alias or k] = list(default) if isinstance(default, tuple) else default
    return out


def _valid_name(table: Any, key: str, default: Any, kind: str) -> str | None:
    """``table[key]`` when it is a registered name of ``kind`` (so that a component's options
    are checked even when another key of its table is wrong)."""
    name = table.get(key, default) if isinstance(table, Mapping) else None
    return name if isinstance(name, str) and name in registry_names(kind) else None


def _split(table: Any, fixed: type[Section]) -> tuple[Any, dict[str, Any]]:
    """``(the fixed keys, the component's options)`` of a table with both."""
    if not isinstance(table, Mapping):
        return table, {}
    return {k: v for k, v in table.items() if k in fixed.model_fields}, {
        k: v for k, v in table.items() if k not in fixed.model_fields
    }


# ----------------------------------------------------------------------------- [data]


def _resolve_data(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.data import DATASETS, PARTITIONERS

    out = _section(Data, table, "data", problems)
    seed = table.get("seed")
    if isinstance(seed, str) and seed != RUN_SEED:
        problems.append(f'data.seed = {format_value(seed)} is not allowed; allowed: "{RUN_SEED}" or an integer >= 0')
    if isinstance(seed, int) and not isinstance(seed, bool):
        _check(problems, check_range, "data.seed", seed, 0)
    options: dict[str, Any] = {}  # checked whenever the name is valid (and the table a table)
    if (name := _valid_name(table, "dataset", None, "datasets")) and isinstance(table.get("dataset_options", {}), dict):
        loader = options_section(f"dataset {name!r}", DATASETS.get(name), exclude=("data_root",))
        given = table.get("dataset_options", {})
        options["dataset_options"] = _options(loader, given, "data.dataset_options", problems, fill=False)
    if (name := _valid_name(table, "partition", "iid", "partitioners")) and isinstance(
        table.get("partition_options", {}), dict
    ):
        on = (("on", str | None, None),)
        part = options_section(f"partitioner {name!r}", PARTITIONERS.get(name), ("num_clients", "seed"), 1, on)
        given = table.get("partition_options", {})
        options["partition_options"] = _options(part, given, "data.partition_options", problems, fill=False)
    return None if out is None else {**out, **options}


# ----------------------------------------------------------------------------- [model]


def _resolve_model(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.models import MODELS

    fixed, given = _split(table, Model)
    out = _section(Model, fixed, "model", problems)
    nout = fixed.get("num_outputs") if isinstance(fixed, Mapping) else None
    if isinstance(nout, str) and nout != AUTO:
        problems.append(
            f'model.num_outputs = {format_value(nout)} is not allowed; allowed: "{AUTO}" or an integer >= 1'
        )
    if isinstance(nout, int) and not isinstance(nout, bool):
        _check(problems, check_range, "model.num_outputs", nout, 1)
    if (name := _valid_name(table, "name", "logreg", "models")) is None:
        return None
    model = options_section(f"model {name!r}", MODELS.get(name), ("input_shape", "num_outputs"), 2)
    options = _options(model, given, "model", problems, fill=True)
    return None if out is None else {**out, **options}


def model_options(model: Mapping[str, Any]) -> dict[str, Any]:
    """The factory options of a resolved ``[model]`` table (without name / num_outputs)."""
    return {k: v for k, v in model.items() if k not in Model.model_fields}


# ----------------------------------------------------------------------------- [algorithm]


def algorithm_section(cls: type) -> type[Section]:
    """The ``[algorithm]`` model of algorithm ``cls``: its name, its hyper-parameters (from the
    dataclass) and, where it has those fields, the aggregator and the server-step keys."""
    cached = _ALGORITHM_SECTIONS.get(cls)
    if cached is None:
        fields = algorithm_fields(cls)
        name = getattr(cls, "name", cls.__name__)
        bases = (ServerStep, AlgorithmName) if fields.server_opt else (AlgorithmName,)
        hyper = dict(fields.hyper)
        if fields.aggregator:
            hyper["aggregator"] = (None, None)  # a name or a table: checked by _resolve_aggregator
        phrase = f"algorithm {name!r} needs the hyper-parameter '{{key}}' ({{type}})"
        cached = _ALGORITHM_SECTIONS[cls] = derived_section(f"Algorithm[{name}]", bases, hyper, required=phrase)
    return cached


_ALGORITHM_SECTIONS: dict[type, type[Section]] = {}


def _resolve_algorithm(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.algorithms import ALGORITHMS

    if not isinstance(table, Mapping):
        problems.append(f"[algorithm] must be a table; got {format_value(table)}")
        return None
    head = _section(AlgorithmName, {"name": table["name"]} if "name" in table else {}, "algorithm", problems)
    if head is None:
        return None
    cls = ALGORITHMS.get(head["name"])
    fields = algorithm_fields(cls)
    model = algorithm_section(cls)
    valid = field_names(model)
    table = dict(table)
    for k in [k for k in table if k in Algorithm.model_fields and k not in valid]:
        what = "aggregator" if k == "aggregator" else "server optimiser"
        problems.append(
            f"algorithm.{k} is not allowed for algorithm {head['name']!r} (it has no {what}); "
            f"valid keys in [algorithm]: {', '.join(sorted(valid))}"
        )
        del table[k]
    values = _section(model, table, "algorithm", problems)
    if values is None:
        return None
    out = {"name": values["name"], **{k: values[k] for k in fields.hyper}}
    if fields.aggregator:
        out["aggregator"] = _resolve_aggregator(table.get("aggregator"), cls, fields.aggregator, problems)
    if fields.server_opt:
        out.update({k: values[k] for k in ServerStep.model_fields})
        if out["server_optimizer"] == "adam" and (out["server_momentum"] or out["server_nesterov"]):
            problems.append(
                'algorithm.server_optimizer = "adam" takes only server_lr (Adam\'s betas are 0.9, 0.999); '
                "remove algorithm.server_momentum / algorithm.server_nesterov"
            )
        if out["server_optimizer"] == "sgd":  # the default stays out: checkpoints written before the key resume
            del out["server_optimizer"]
    _check(problems, _precheck_algorithm, cls, out, fields)
    return out


def _resolve_aggregator(value: Any, cls: type, field_name: str, problems: list[str]) -> Any:
    from fedrisk.aggregators import AGGREGATORS

    if value is None:
        default = next(f for f in dataclasses.fields(cls) if f.name == field_name)
        obj = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default
        name = getattr(obj, "name", None)
        return name if name in AGGREGATORS else NONE
    if isinstance(value, str):
        name, options = value, {}
    elif isinstance(value, Mapping) and "name" in value:
        name, options = value["name"], {k: v for k, v in value.items() if k != "name"}
    elif isinstance(value, Mapping):
        problems.append(
            'algorithm.aggregator table needs a name, e.g. aggregator = {name = "median"}; '
            f"valid choices: {', '.join(AGGREGATORS.names())}"
        )
        return None
    else:
        problems.append(
            f"algorithm.aggregator = {format_value(value)} has the wrong type; allowed: a name or a table with a name"
        )
        return None
    if name not in AGGREGATORS:
        problems.append(unknown_choice("algorithm.aggregator", name, AGGREGATORS.names()))
        return None
    model = options_section(f"aggregator {name!r}", AGGREGATORS.get(name))
    options = _options(model, options, "algorithm.aggregator", problems, fill=True)
    return {"name": name, **options} if options else name


def _precheck_algorithm(cls: type, hyper: Mapping[str, Any], fields: AlgorithmFields) -> None:
    """Construct the algorithm with placeholder model/loss so that its own range checks run
    before any data is loaded.  Only :class:`FedriskError` counts here: checks that need the
    real model run again when the run is built."""
    kwargs = {k: hyper[k] for k in fields.hyper}
    kwargs["model"] = None
    if fields.loss:
        kwargs[fields.loss] = None
    try:
        cls(**kwargs)
    except FedriskError as exc:
        raise FedriskError(f"[algorithm] {hyper['name']}: {exc}") from None
    except Exception:
        pass


# ----------------------------------------------------------------------------- [objective]


def _resolve_objective(
    table: Mapping[str, Any], algorithm: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    from fedrisk.algorithms import ALGORITHMS

    out = _section(Objective, table, "objective", problems)
    if out is None or algorithm is None:
        return out
    if algorithm_fields(ALGORITHMS.get(algorithm["name"])).loss is None and out["name"] != AUTO:
        problems.append(
            f"objective.name = {format_value(out['name'])} is not allowed: algorithm {algorithm['name']!r} defines its "
            f"own objective through its hyper-parameters (see `fedrisk list algorithms {algorithm['name']}`); "
            f'remove [objective] or set name = "{AUTO}"'
        )
    return out


# ----------------------------------------------------------------------------- [attack]


def _resolve_attack(
    table: Mapping[str, Any], data: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    reg = attack_registry()
    if reg is None or not reg.names():
        problems.append("[attack]: no attacks are registered in this installation (fedrisk.attacks.ATTACKS)")
        return None
    fixed, given = _split(table, Attack)
    out = _section(Attack, fixed, "attack", problems)
    if out is not None:
        if out["byzantine"] and out["num_byzantine"]:
            problems.append("[attack]: give either byzantine (client ids) or num_byzantine, not both")
        ids = out["byzantine"] or list(range(out["num_byzantine"]))
        if data is not None and ([k for k in ids if not 0 <= k < data["num_clients"]] or len(set(ids)) != len(ids)):
            problems.append(
                f"attack.byzantine = {format_value(ids)} is not allowed; "
                f"allowed: distinct client ids in [0, {data['num_clients'] - 1}]"
            )
        if not ids:
            problems.append("[attack] needs Byzantine clients: set byzantine = [ids] or num_byzantine = N")
    if (name := _valid_name(table, "name", None, "attacks")) is None:
        return None
    options = _options(options_section(f"attack {name!r}", reg.get(name)), given, "attack", problems, fill=True)
    return None if out is None else {**out, **options}


# ----------------------------------------------------------------------------- [run], [sweep]


def _resolve_run(
    table: Mapping[str, Any], data: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    from fedrisk.metrics import parse_metric

    out = _section(Run, table, "run", problems)
    if out is None:
        return None
    for m in out["metrics"]:
        try:
            parse_metric(m)
        except FedriskError as exc:
            problems.append(f"run.metrics: {exc}")
    if data is not None and "validation" in out["splits"] and data["validation_fraction"] <= 0:
        problems.append(
            'run.splits includes "validation" but data.validation_fraction = 0.0; allowed: set '
            'data.validation_fraction in (0, 1) or evaluate on ["test"] only'
        )
    if len(set(out["seeds"])) != len(out["seeds"]) or any(s < 0 for s in out["seeds"]):
        problems.append(f"run.seeds = {format_value(out['seeds'])} is not allowed; allowed: distinct integers >= 0")
    return out


def _resolve_sweep(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    out = _section(Sweep, table, "sweep", problems)
    if out is None:
        return None
    seeds = out["seeds"]
    if isinstance(seeds, int):
        _check(problems, check_range, "sweep.seeds", seeds, 1)
    elif not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        problems.append(f"sweep.seeds = {format_value(seeds)} is not allowed; allowed: distinct integers >= 0")
    out["grid"] = flatten(out["grid"])
    for k, values in out["grid"].items():
        if not isinstance(values, list) or not values:
            problems.append(
                f"sweep.grid.{k} = {format_value(values)} has the wrong type; allowed: a non-empty list of values"
            )
    variants = {}
    for name, over in out["variants"].items():
        if not isinstance(over, Mapping) or not over:
            problems.append(
                f"sweep.variants.{name} = {format_value(over)} has the wrong type; allowed: a table of overrides "
                'such as {"algorithm.name" = "scaffold"}'
            )
        else:
            variants[name] = flatten(over)
    out["variants"] = variants
    return out


def resolve_seeds(spec: int | Sequence[int], base: int = 0) -> list[int]:
    """``N`` -> ``[base, ..., base + N - 1]``; a list is taken as it is."""
    if isinstance(spec, int):
        return list(range(base, base + spec))
    return list(spec)


# ============================================================================= reference


def reference_markdown() -> str:
    """The key tables of ``docs/config-reference.md``, generated from :data:`SCHEMA` (a test
    checks that the document contains exactly this text)."""
    blocks = []
    for section, model in SCHEMA.items():
        title = "top level" if not section else f"[{section}]"
        lines = [f"### {title}", "", "| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for name, f in model.model_fields.items():
            extra = f.json_schema_extra or {}
            if f.default is PydanticUndefined:
                default = "(required)"
            elif SHOWN_DEFAULT in extra:
                default = str(extra[SHOWN_DEFAULT])
            elif f.default is None and "table" in short(f.annotation):
                default = "(absent)"
            else:
                default = f"`{format_value(f.default)}`"
            one_of = next((m for m in f.metadata if isinstance(m, OneOf)), None)
            allowed = one_of.allowed() if one_of else interval(f)
            doc = (f.description or "").replace("|", "\\|")
            kind = short(f.annotation).replace(" | ", " or ")
            lines.append(f"| `{name}` | {kind} | {default} | {allowed} | {doc} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def describe_key(dotted: str) -> str:
    """What a fixed key allows, in words (``describe_key("run.rounds")`` = ``"an integer"``)."""
    section, _, name = dotted.rpartition(".")
    return describe(SCHEMA[section].model_fields[name].annotation)
