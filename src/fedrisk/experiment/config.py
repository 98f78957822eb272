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
    [tune]                  # only for `fedrisk tune` / `sweep --tune`: search space, trials, metric

Each table is a pydantic model (:mod:`fedrisk.experiment.sections`, which says how to add a
key: one line there); the ``[algorithm]`` table of an algorithm and the options of a dataset,
partitioner, model, aggregator or attack are models derived from the registered dataclass /
signature (:mod:`fedrisk.experiment.schema`), which stays the single source of their names,
types and defaults.  Rules between keys live beside the tables (``resolve_*``).

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
    fedrisk.experiment.schema.ConfigError: unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in ...
    >>> resolve_config({"data": {"dataset": "digits", "num_clients": 0}, "run": {"rounds": "3"}})
    Traceback (most recent call last):
    fedrisk.experiment.schema.ConfigError: data.num_clients = 0 is out of range; allowed: [1, inf)
    run.rounds = "3" has the wrong type; allowed: an integer
"""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from fedrisk.errors import FedriskError
from fedrisk.experiment.schema import (
    ConfigError,
    algorithm_fields,
    flatten,
    format_value,
    registry_names,
    to_toml_value,
    unknown_key,
)
from fedrisk.experiment.section_rules import (
    check_dual_model,
    resolve_algorithm,
    resolve_attack,
    resolve_data,
    resolve_dual_model,
    resolve_model,
    resolve_objective,
    resolve_run,
    resolve_sweep,
    table_values,
)
from fedrisk.experiment.sections import NOT_RUN_SECTIONS, OPTIONAL_TABLES, SCHEMA, SECTIONS, reference_markdown

__all__ = [  # with what other modules import from here (defined in schema / sections)
    "SCHEMA",
    "SECTIONS",
    "ConfigError",
    "ExperimentConfig",
    "after_set",
    "algorithm_fields",
    "apply_overrides",
    "assignments",
    "diff_configs",
    "flatten",
    "load_config",
    "overlapping_keys",
    "parse_assignment",
    "parse_literal",
    "read_toml",
    "reference_markdown",
    "resolve_config",
    "resolve_seeds",
    "semantic_view",
    "to_toml_value",
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


def assignments(overrides: Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """``--set`` overrides as ``{dotted key: value}`` (a key given twice: the last value).

    Example:
        >>> assignments(["run.rounds=8", "algorithm.aggregator={name = 'median'}", "run.rounds=9"])
        {'run.rounds': 9, 'algorithm.aggregator': {'name': 'median'}}
    """
    return dict(overrides) if isinstance(overrides, Mapping) else dict(parse_assignment(o) for o in overrides)


def overlapping_keys(keys: Iterable[str], others: Iterable[str]) -> list[str]:
    """The dotted ``keys`` that ``others`` also assign: the same key, a key inside a table that
    ``others`` replaces, or a value around a key of ``others``.

    Example:
        >>> overlapping_keys(["run.rounds", "algorithm.lr", "data.binarize.imratio"], ["run.rounds", "data.binarize"])
        ['run.rounds', 'data.binarize.imratio']
    """
    others = list(others)

    def overlaps(a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")

    return [k for k in keys if any(overlaps(k, other) for other in others)]


def after_set(
    overrides: Mapping[str, Any], sets: Sequence[str] | Mapping[str, Any], variant: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """A sweep variant's overrides (named ``variant``), or the config's ``[sweep.grid]`` (no name),
    with the command line's ``--set`` (``sets``) applied after them: the command line is the last
    word.  Returns the overrides to use and the keys ``--set`` replaced.

    The config the overrides are applied to holds ``sets`` already, so a replaced key is left to
    it: dropped from the grid; restated with the command line's value in a variant (the same run,
    and the variant's table in ``sweep.toml`` shows what ran and is never left empty).  A key the
    command line sets for this variant alone (``--set sweep.variants.NAME.KEY=...``) is the more
    specific one and stays.

    Example:
        >>> variant = {"run.rounds": 1024, "algorithm.window": 8}
        >>> after_set(variant, ["run.rounds=32", "algorithm.lr=0.1"], "I8")
        ({'algorithm.window': 8, 'run.rounds': 32}, ['run.rounds'])
        >>> after_set(variant, ["run.rounds=32", "sweep.variants.I8.run.rounds=16"], "I8")
        ({'run.rounds': 1024, 'algorithm.window': 8}, [])
        >>> after_set({"algorithm.lr": [0.03, 0.1]}, ["algorithm.lr=0.05"])
        ({}, ['algorithm.lr'])
    """
    given = assignments(sets)
    own = f"sweep.variants.{variant}"
    if variant is not None and own in given:
        return dict(overrides), []
    mine = [k.removeprefix(own + ".") for k in given if variant is not None and k.startswith(own + ".")]
    specific = set(overlapping_keys(overrides, mine))
    replaced = [k for k in overlapping_keys(overrides, given) if k not in specific]
    kept = {k: v for k, v in overrides.items() if k not in replaced}
    if variant is not None and replaced:
        kept.update({k: given[k] for k in overlapping_keys(given, replaced)})
    return kept, replaced


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
        out = {k: v for k, v in self.values.items() if k not in NOT_RUN_SECTIONS}
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
    flat = flatten(to_toml_value({k: v for k, v in values.items() if k not in NOT_RUN_SECTIONS}))
    return {k: v for k, v in flat.items() if k not in skip and not k.startswith("output.")}


def diff_configs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(key, a_value, b_value)]`` for the dotted keys whose values differ."""
    missing = object()
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k, missing), b.get(k, missing)) for k in keys if a.get(k, missing) != b.get(k, missing)]


# ============================================================================= resolution


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
    values: dict[str, Any] = {"imports": list(raw.get("imports", []))}
    data = values["data"] = resolve_data(raw["data"], problems)
    values["model"] = resolve_model(raw.get("model", {}), problems)
    algorithm = resolve_algorithm(raw.get("algorithm", {}), problems)
    values["objective"] = resolve_objective(raw.get("objective", {}), algorithm, problems)
    values["algorithm"] = algorithm
    if "attack" in raw:
        values["attack"] = resolve_attack(raw["attack"], data, problems)
    if "dual_model" in raw:  # issue 30: the network dual player of the min-max family
        values["dual_model"] = resolve_dual_model(raw["dual_model"], algorithm, problems)
    problems += check_dual_model(algorithm, "dual_model" in raw)
    run = values["run"] = resolve_run(raw.get("run", {}), data, problems)
    if algorithm is not None and run is not None:
        problems += _stage_round_problems(algorithm, run["rounds"])
    for name in SECTIONS:  # tables without rules between their keys (and not optional): [output], ...
        if name not in values and name not in ("attack", "dual_model", "sweep"):
            values[name] = table_values(SCHEMA[name], raw.get(name, {}), name, problems)
    values["sweep"] = resolve_sweep(raw.get("sweep", {}), problems)
    if problems:
        raise ConfigError(problems)
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


def resolve_seeds(spec: int | Sequence[int], base: int = 0) -> list[int]:
    """``N`` -> ``[base, ..., base + N - 1]``; a list is taken as it is."""
    if isinstance(spec, int):
        return list(range(base, base + spec))
    return list(spec)
