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

Validation happens before any data is loaded: unknown sections, keys and names get the key, a
close match and the valid choices; wrong types and ranges get the key, the value and what is
allowed.  ``--set`` overrides go through the same checks.  The *resolved* config holds every
key with its effective value (defaults filled in, including the algorithm's and the model's
defaults); loading it again gives the same run.

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
    fedrisk.errors.FedriskError: unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in ...
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from fedrisk.errors import FedriskError, check_range
from fedrisk.experiment.types import (
    NONE,
    TypeSpec,
    coerce,
    format_value,
    infer_type,
    is_plain_value,
    parse_type,
    to_toml_value,
)

REQUIRED = object()
"""Marks an option without a default."""

AUTO = "auto"
RUN_SEED = "run"
DTYPES = ("float32", "float64")
SPLITS = ("test", "validation")
FAILURE_POLICIES = ("raise", "skip")
CLIENT_STATES = ("memory", "disk")
SERVER_OPTIMIZERS = ("sgd", "adam")
ONE_OUTPUT_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_probs", "mse")


# ============================================================================= the schema


@dataclass(frozen=True)
class Option:
    """One fixed config key.

    Attributes:
        key: the key inside its section.
        type: its type in the language of :mod:`fedrisk.experiment.types`.
        default: the default value (:data:`REQUIRED` when the key must be given).
        doc: one line for the config reference.
        low / high: the allowed range of a number (inclusive unless the flags say otherwise).
        choices: valid names: a tuple, or the name of a registry (``"datasets"``, ...).
        semantic: False for keys that do not change a run's numbers (output paths, checkpoint
            interval, threads); resume checks and report grouping ignore them.
    """

    key: str
    type: str
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True
    choices: tuple[str, ...] | str | None = None
    semantic: bool = True

    @property
    def spec(self) -> TypeSpec:
        return parse_type(self.type)


def _o(*args: Any, **kwargs: Any) -> Option:
    return Option(*args, **kwargs)


SCHEMA: dict[str, list[Option]] = {
    "": [
        _o(
            "imports",
            "list[str]",
            [],
            "modules imported before validation (they may register algorithms, datasets, ...)",
        ),
    ],
    "data": [
        _o("dataset", "str", REQUIRED, "dataset name", choices="datasets"),
        _o("partition", "str", "iid", "partitioner name", choices="partitioners"),
        _o("num_clients", "int", 10, "number of clients K", low=1),
        _o(
            "seed",
            "int | str",
            RUN_SEED,
            'seed of the data pipeline; "run" = the run\'s seed, an integer fixes the split across seeds',
        ),
        _o("data_root", "str", "", 'folder with user-supplied files (MNIST, CIFAR, ...); "" = none', semantic=True),
        _o(
            "client_test_fraction",
            "float",
            0.0,
            "share of each client's rows kept as its personal test set",
            low=0.0,
            high=1.0,
            high_inclusive=False,
        ),
        _o(
            "validation_fraction",
            "float",
            0.0,
            "share of the training set held out as the global validation set",
            low=0.0,
            high=1.0,
            high_inclusive=False,
        ),
        _o(
            "dataset_options",
            "table",
            {},
            "options of the dataset loader (checked against it; `fedrisk list datasets`)",
        ),
        _o(
            "partition_options",
            "table",
            {},
            "options of the partitioner (alpha, min_size, classes_per_client, ..., on)",
        ),
        _o("binarize", "table", None, "optional [data.binarize] table: classes -> {0, 1}"),
        _o("feature_noise", "table", None, "optional [data.feature_noise] table: per-client Gaussian input noise"),
        _o("label_noise", "table", None, "optional [data.label_noise] table: symmetric label noise on client rows"),
    ],
    "data.binarize": [
        _o(
            "positive_classes",
            "int | list[int] | None",
            None,
            'classes mapped to label 1; "none" = the upper half of the classes',
        ),
        _o(
            "imratio",
            "float | None",
            None,
            'target positive fraction of the training set (positives subsampled); "none" = keep all',
            low=0.0,
            high=1.0,
            low_inclusive=False,
            high_inclusive=False,
        ),
        _o(
            "per_class",
            "bool",
            False,
            "spread the positive budget over the positive classes in proportion to their sizes",
        ),
        _o("balanced_test", "bool", False, "subsample the test set to equal class counts"),
    ],
    "data.feature_noise": [
        _o("std", "float", REQUIRED, "noise standard deviation", low=0.0),
        _o("mean", "float", 0.0, "noise mean of the middle client"),
        _o("mean_step", "float", 0.0, "client k's mean is mean + (k - K//2) * mean_step"),
    ],
    "data.label_noise": [
        _o(
            "rate",
            "float",
            0.0,
            "probability of replacing a client's training label by a random other class",
            low=0.0,
            high=1.0,
        ),
    ],
    "model": [
        _o("name", "str", "logreg", "model name (its options go beside it, e.g. hidden = [64])", choices="models"),
        _o(
            "num_outputs", "int | str", AUTO, '"auto" (classes, or 1 for one-output objectives / scorers) or an integer'
        ),
        # -- issue 30 (BatchNorm state, two-stage recipe) ---------------------------------
        _o(
            "norm_stats",
            "str",
            AUTO,
            'BatchNorm running statistics: "averaged" (the default for models with BatchNorm), "local" (FedBN) '
            'or "frozen"; "auto" = averaged, or none for models without BatchNorm',
            choices=(AUTO, "averaged", "local", "frozen"),
        ),
        _o("reset_head", "bool", False, "re-initialise the last layer after run.init_from (pre-train, new head)"),
    ],
    "objective": [
        _o("name", "str", AUTO, '"auto" or a loss name (`fedrisk list objectives`)', choices="objectives"),
    ],
    "algorithm": [
        _o(
            "name",
            "str",
            "fedavg",
            "algorithm name (its hyper-parameters go beside it; `fedrisk list algorithms NAME`)",
            choices="algorithms",
        ),
        _o(
            "aggregator",
            "str | table",
            "(algorithm default)",
            'aggregator name, or {name = "...", option = ...} (algorithms with an aggregator field)',
        ),
        _o(
            "server_lr",
            "float",
            1.0,
            "server learning rate on the averaged delta (algorithms with a server_opt field)",
            low=0.0,
            low_inclusive=False,
        ),
        _o(
            "server_momentum",
            "float",
            0.0,
            "server momentum beta (FedAvgM; algorithms with a server_opt field)",
            low=0.0,
            high=1.0,
            high_inclusive=False,
        ),
        _o("server_nesterov", "bool", False, "Nesterov form of the server momentum"),
        _o(
            "server_optimizer",
            "str",
            "sgd",
            'server step: "sgd" (server_lr, server_momentum) or "adam" (Adam with lr server_lr on -delta)',
            choices=SERVER_OPTIMIZERS,
        ),
    ],
    "attack": [
        _o("name", "str", REQUIRED, "attack name (its options go beside it)", choices="attacks"),
        _o("byzantine", "list[int]", [], "ids of the Byzantine clients"),
        _o("num_byzantine", "int", 0, "alternatively: the first num_byzantine clients are Byzantine", low=0),
    ],
    "run": [
        _o("rounds", "int", 10, "communication rounds", low=1),
        _o("seed", "int", 0, "the root of every random stream (data, initialisation, clients)", low=0),
        _o("seeds", "list[int]", [], "several seeds: `fedrisk run` runs each into DIR/seed=<s>"),
        _o("executor", "str", "sequential", "how clients are run", choices="executors"),
        _o("eval_every", "int", 1, "evaluate every this many rounds (and after the last)", low=1),
        _o("eval_at_start", "bool", False, "also evaluate the initial model (round 0)"),
        _o(
            "metrics",
            "list[str]",
            [],
            "metric names; [] = accuracy/log_loss, or auroc/auprc for one-output binary models",
        ),
        _o("splits", "list[str]", ["test"], "global splits to evaluate on", choices=SPLITS),
        _o("dtype", "str", "float32", "floating dtype of data and parameters", choices=DTYPES),
        _o(
            "on_client_failure",
            "str",
            "raise",
            "a failing / NaN client stops the run or is skipped",
            choices=FAILURE_POLICIES,
        ),
        _o("min_replies", "int", 1, "a round with fewer valid client replies stops the run (never counted)", low=1),
        _o(
            "client_states",
            "str",
            "memory",
            'where per-client states live: "memory", or "disk" (one file per client in DIR/client_states; '
            "checkpoints link the files instead of loading them; for large federations)",
            choices=CLIENT_STATES,
            semantic=False,
        ),
        _o(
            "checkpoint_every",
            "int",
            0,
            "also write a checkpoint every this many rounds (0 = no round interval)",
            low=0,
            semantic=False,
        ),
        _o(
            "checkpoint_seconds",
            "float",
            30.0,
            "write a checkpoint after a round once this many seconds have passed since the last one "
            "(0 = no time interval); checkpoints are always written at the end and on SIGINT/SIGTERM",
            low=0,
            semantic=False,
        ),
        _o("threads", "int", 0, "torch threads (0 = torch's default)", low=0, semantic=False),
        _o(
            "init_from",
            "str",
            "",
            'start from a finished run\'s model: its directory (model.pt) or a .pt file; "" = random init',
        ),
    ],
    "output": [
        _o("dir", "str", "", 'the run directory; "" = runs/<config file name>', semantic=False),
        _o("plots", "bool", True, "write PNG plots at the end of the run", semantic=False),
        _o(
            "tensorboard",
            "bool",
            False,
            "also log every evaluation and the config to TensorBoard event files in DIR/tensorboard "
            "(needs fedrisk[tracking])",
            semantic=False,
        ),
        _o(
            "mlflow",
            "bool",
            False,
            "also log every evaluation and the config to MLflow (needs fedrisk[tracking])",
            semantic=False,
        ),
        _o(
            "mlflow_tracking_uri",
            "str",
            "",
            'the MLflow tracking URI; "" = a local file store in DIR/mlruns',
            semantic=False,
        ),
        _o("mlflow_experiment", "str", "", 'the MLflow experiment name; "" = the config file\'s name', semantic=False),
    ],
    "sweep": [
        _o(
            "seeds",
            "int | list[int]",
            1,
            "an integer N (seeds run.seed .. run.seed+N-1) or a list of seeds",
            semantic=False,
        ),
        _o("jobs", "int", 1, "runs in parallel (subprocesses)", low=1, semantic=False),
        _o(
            "grid",
            "table",
            {},
            'key -> list of values, e.g. "algorithm.lr" = [0.03, 0.1]; every combination runs',
            semantic=False,
        ),
        _o(
            "variants",
            "table",
            {},
            "name -> table of overrides; every variant runs with every grid point",
            semantic=False,
        ),
    ],
}
"""Every fixed key, by section (``""`` = top level).  Sections ``model``, ``algorithm`` and
``attack`` also take the named object's own options; ``data.dataset_options`` and
``data.partition_options`` are checked against the named loader / partitioner."""

SECTIONS = ("data", "model", "objective", "algorithm", "attack", "run", "output", "sweep")
OPTIONAL_TABLES = {"data.binarize", "data.feature_noise", "data.label_noise"}


def _schema(section: str) -> dict[str, Option]:
    return {o.key: o for o in SCHEMA[section]}


# ============================================================================= registries


def registry_names(kind: str) -> list[str]:
    """Valid names of a kind of component (``datasets``, ``algorithms``, ...)."""
    if kind == "datasets":
        from fedrisk.data import DATASETS

        return DATASETS.names()
    if kind == "partitioners":
        from fedrisk.data import PARTITIONERS

        return PARTITIONERS.names()
    if kind == "models":
        from fedrisk.models import MODELS

        return MODELS.names()
    if kind == "algorithms":
        from fedrisk.algorithms import ALGORITHMS

        return ALGORITHMS.names()
    if kind == "objectives":
        from fedrisk.objectives.supervised import LOSSES

        return [AUTO, *sorted(LOSSES)]
    if kind == "executors":
        from fedrisk.runtime import EXECUTORS

        return EXECUTORS.names()
    if kind == "aggregators":
        from fedrisk.aggregators import AGGREGATORS

        return AGGREGATORS.names()
    if kind == "attacks":
        reg = attack_registry()
        return reg.names() if reg is not None else []
    raise KeyError(kind)


def attack_registry() -> Any:
    """``fedrisk.attacks.ATTACKS`` when the attacks package registers any (else None)."""
    import fedrisk.attacks as attacks

    return getattr(attacks, "ATTACKS", None)


def _choices(option: Option) -> list[str]:
    if option.choices is None:
        return []
    if isinstance(option.choices, str):
        return registry_names(option.choices)
    return list(option.choices)


# ============================================================================= errors


def unknown_key(section: str, key: str, valid: Iterable[str]) -> FedriskError:
    """``unknown key 'algorithm.lrr' (did you mean 'algorithm.lr'?); valid keys in [algorithm]: ...``"""
    valid = sorted(valid)
    close = difflib.get_close_matches(key, valid, n=1)
    dotted = f"{section}.{key}" if section else key
    hint = f" (did you mean {(f'{section}.' if section else '') + close[0]!r}?)" if close else ""
    where = f"[{section}]" if section else "the top level"
    return FedriskError(f"unknown key {dotted!r}{hint}; valid keys in {where}: {', '.join(valid) or '(none)'}")


def unknown_choice(dotted: str, value: str, choices: Sequence[str]) -> FedriskError:
    close = difflib.get_close_matches(value, list(choices), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return FedriskError(
        f"{dotted} = {format_value(value)} is not a known name{hint}; valid choices: {', '.join(sorted(choices))}"
    )


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
    skip = {(f"{sec}.{o.key}" if sec else o.key) for sec, opts in SCHEMA.items() for o in opts if not o.semantic}
    flat = flatten(to_toml_value({k: v for k, v in values.items() if k != "sweep"}))
    return {k: v for k, v in flat.items() if k not in skip and not k.startswith("output.")}


def diff_configs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(key, a_value, b_value)]`` for the dotted keys whose values differ."""
    missing = object()
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k, missing), b.get(k, missing)) for k in keys if a.get(k, missing) != b.get(k, missing)]


def resolve_config(
    raw: Mapping[str, Any],
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    source: Path | None = None,
) -> ExperimentConfig:
    """Validate ``raw`` (plus overrides) and fill every default; see the module docstring."""
    raw = apply_overrides(raw, overrides)
    _import_plugins(raw.get("imports", []), source)
    values: dict[str, Any] = {}
    for key in raw:
        if key not in SECTIONS and key != "imports":
            raise unknown_key("", key, [*SECTIONS, "imports"])
        if key != "imports" and not isinstance(raw[key], Mapping):
            raise FedriskError(f"{key} must be a table ([{key}]); got {format_value(raw[key])}")
    values["imports"] = _check_fixed("", {"imports": raw.get("imports", [])})["imports"]
    if "data" not in raw:
        raise FedriskError(
            'the config needs a [data] table with at least dataset = "..."; valid datasets: '
            + ", ".join(registry_names("datasets"))
        )
    values["data"] = _resolve_data(raw["data"])
    values["model"] = _resolve_model(raw.get("model", {}))
    algorithm = _resolve_algorithm(raw.get("algorithm", {}))
    values["objective"] = _resolve_objective(raw.get("objective", {}), algorithm)
    values["algorithm"] = algorithm
    if "attack" in raw:
        values["attack"] = _resolve_attack(raw["attack"], values["data"]["num_clients"])
    values["run"] = _resolve_run(raw.get("run", {}), values["data"])
    _check_stage_rounds(algorithm, values["run"]["rounds"])
    values["output"] = _check_fixed("output", raw.get("output", {}))
    values["sweep"] = _resolve_sweep(raw.get("sweep", {}))
    return ExperimentConfig(values=values, raw=raw, source=source)


STAGE_ROUND_FIELDS = ("warmup_rounds", "fedavg_rounds")
"""Algorithm hyper-parameters that count rounds of a first stage (PERM's warm-up, two-stage
PERM's FedAvg stage): the run must be longer."""


def _check_stage_rounds(algorithm: Mapping[str, Any], rounds: int) -> None:
    for key in STAGE_ROUND_FIELDS:
        value = algorithm.get(key)
        if isinstance(value, int) and value >= rounds:
            raise FedriskError(
                f"algorithm.{key} = {value} is not below run.rounds = {rounds}: the run would end before "
                f"{algorithm.get('name')!r} starts personalising; lower {key} or raise run.rounds"
            )


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


def _check_value(dotted: str, option: Option, value: Any) -> Any:
    if option.type == "table":
        if option.default is None and value == NONE:
            return None
        if not isinstance(value, Mapping):
            raise FedriskError(f"{dotted} = {format_value(value)} has the wrong type; allowed: a table")
        return dict(value)
    value = coerce(dotted, value, option.spec)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and (option.low is not None or option.high is not None):
        check_range(
            dotted,
            value,
            option.low,
            option.high,
            low_inclusive=option.low_inclusive,
            high_inclusive=option.high_inclusive,
        )
    choices = _choices(option)
    if choices:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item not in choices:
                raise unknown_choice(dotted, item, choices)
    return value


def _check_fixed(
    section: str, table: Mapping[str, Any], extra_ok: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """Check the fixed keys of ``section`` and fill defaults; other keys are an error unless
    ``extra_ok(key)``.  Returns the fixed keys only."""
    if not isinstance(table, Mapping):
        raise FedriskError(f"[{section}] must be a table; got {format_value(table)}")
    schema = _schema(section)
    for key in table:
        if key not in schema and not (extra_ok and extra_ok(key)):
            raise unknown_key(section, key, schema)
    out: dict[str, Any] = {}
    for key, option in schema.items():
        dotted = f"{section}.{key}" if section else key
        if key in table:
            out[key] = _check_value(dotted, option, table[key])
        elif option.default is REQUIRED:
            hint = ""
            if option.choices:
                hint = "; valid choices: " + ", ".join(_choices(option))
            raise FedriskError(f"missing required key {dotted!r}{hint}")
        else:
            out[key] = copy.deepcopy(option.default)
    return out


# ----------------------------------------------------------------------------- [data]


def signature_options(
    fn: Callable[..., Any], exclude: Iterable[str] = (), skip_positional: int = 0
) -> dict[str, tuple[TypeSpec, Any]]:
    """``name -> (type, default or REQUIRED)`` of the keyword-settable parameters of ``fn``."""
    out: dict[str, tuple[TypeSpec, Any]] = {}
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        if i < skip_positional or p.name in exclude:
            continue
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            continue
        default = REQUIRED if p.default is inspect.Parameter.empty else p.default
        spec = parse_type(p.annotation) if p.annotation is not inspect.Parameter.empty else infer_type(default)
        if not spec.plain and default is not REQUIRED and is_plain_value(default):
            spec = infer_type(default)
        out[p.name] = (spec, default)
    return out


def _check_options(
    what: str, dotted: str, given: Mapping[str, Any], allowed: Mapping[str, tuple[TypeSpec, Any]], fill: bool
) -> dict[str, Any]:
    """Check open options against ``allowed``; with ``fill`` add the defaults of the rest."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {dotted + '.' + close[0]!r}?)" if close else ""
            raise FedriskError(
                f"unknown key {dotted + '.' + key!r}{hint}; valid options of {what}: "
                f"{', '.join(sorted(allowed)) or '(none)'}"
            )
        spec, _ = allowed[key]
        out[key] = coerce(f"{dotted}.{key}", value, spec) if spec.plain else value
    missing = [k for k, (_, d) in allowed.items() if d is REQUIRED and k not in given]
    if missing:
        raise FedriskError(f"{what} needs {', '.join(repr(dotted + '.' + m) for m in missing)}")
    if fill:
        for key, (_, default) in allowed.items():
            if key not in out and is_plain_value(default):
                out[key] = list(default) if isinstance(default, tuple) else default
    return out


def _resolve_data(table: Mapping[str, Any]) -> dict[str, Any]:
    from fedrisk.data import DATASETS, PARTITIONERS

    out = _check_fixed("data", table)
    seed = out["seed"]
    if isinstance(seed, str) and seed != RUN_SEED:
        raise FedriskError(f'data.seed = {format_value(seed)} is not allowed; allowed: "{RUN_SEED}" or an integer >= 0')
    if isinstance(seed, int):
        check_range("data.seed", seed, 0)
    loader = DATASETS.get(out["dataset"])
    loader_opts = signature_options(loader, exclude=("data_root",))
    out["dataset_options"] = _check_options(
        f"dataset {out['dataset']!r}", "data.dataset_options", out["dataset_options"], loader_opts, fill=False
    )
    partitioner = PARTITIONERS.get(out["partition"])
    part_opts = signature_options(partitioner, exclude=("num_clients", "seed"), skip_positional=1)
    part_opts["on"] = (parse_type("str | None"), None)
    out["partition_options"] = _check_options(
        f"partitioner {out['partition']!r}", "data.partition_options", out["partition_options"], part_opts, fill=False
    )
    for name in ("binarize", "feature_noise", "label_noise"):
        if out[name] is not None:
            out[name] = _check_fixed(f"data.{name}", out[name])
    return out


# ----------------------------------------------------------------------------- [model]


def _resolve_model(table: Mapping[str, Any]) -> dict[str, Any]:
    from fedrisk.models import MODELS

    schema = _schema("model")
    out = _check_fixed("model", table, extra_ok=lambda k: True)
    factory = MODELS.get(out["name"])
    opts = signature_options(factory, skip_positional=2)
    opts = {k: v for k, v in opts.items() if k not in ("input_shape", "num_outputs")}
    nout = out["num_outputs"]
    if isinstance(nout, str) and nout != AUTO:
        raise FedriskError(
            f'model.num_outputs = {format_value(nout)} is not allowed; allowed: "{AUTO}" or an integer >= 1'
        )
    if isinstance(nout, int):
        check_range("model.num_outputs", nout, 1)
    extra = {k: v for k, v in table.items() if k not in schema}
    out.update(_check_options(f"model {out['name']!r}", "model", extra, opts, fill=True))
    return out


def model_options(model: Mapping[str, Any]) -> dict[str, Any]:
    """The factory options of a resolved ``[model]`` table (without name / num_outputs)."""
    return {k: v for k, v in model.items() if k not in _schema("model")}


# ----------------------------------------------------------------------------- [algorithm]


@dataclass(frozen=True)
class AlgorithmFields:
    """How the fields of an algorithm dataclass map onto the config.

    Attributes:
        hyper: settable hyper-parameters ``name -> (type, default or REQUIRED)``.
        loss: the name of the field holding the loss function (None if the algorithm has none).
        aggregator: the name of the aggregator field (None if none).
        server_opt: the name of the server-optimiser field (None if none).
        fixed: fields the config cannot set (they keep their Python default).
    """

    hyper: dict[str, tuple[TypeSpec, Any]]
    loss: str | None
    aggregator: str | None
    server_opt: str | None
    fixed: tuple[str, ...]


def algorithm_fields(cls: type) -> AlgorithmFields:
    """Classify the dataclass fields of algorithm ``cls`` (see the module docstring).

    Example:
        >>> from fedrisk.algorithms import FedAvg
        >>> f = algorithm_fields(FedAvg)
        >>> sorted(f.hyper)[:3], f.loss, f.aggregator, f.server_opt
        (['batch_size', 'clients_per_round', 'local_steps'], 'loss', 'aggregator', 'server_opt')
    """
    hyper: dict[str, tuple[TypeSpec, Any]] = {}
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
        spec = parse_type(f.type)
        if "ServerOpt" in text:
            server_opt = f.name
        elif "Aggregator" in text:
            aggregator = f.name
        elif "LossFn" in text or (f.name == "loss" and not spec.plain):
            loss = f.name
        elif spec.plain:
            hyper[f.name] = (spec, default)
        elif default is not REQUIRED and is_plain_value(default) and default is not None:
            hyper[f.name] = (infer_type(default), default)
        elif default is REQUIRED:
            raise FedriskError(
                f"algorithm {getattr(cls, 'name', cls.__name__)!r}: field {f.name!r} ({text}) has no default and "
                "cannot be set from a config"
            )
        else:
            fixed.append(f.name)
    return AlgorithmFields(hyper, loss, aggregator, server_opt, tuple(fixed))


_SERVER_KEYS = ("server_lr", "server_momentum", "server_nesterov", "server_optimizer")


def _resolve_algorithm(table: Mapping[str, Any]) -> dict[str, Any]:
    from fedrisk.algorithms import ALGORITHMS

    if not isinstance(table, Mapping):
        raise FedriskError(f"[algorithm] must be a table; got {format_value(table)}")
    schema = _schema("algorithm")
    name = _check_value("algorithm.name", schema["name"], table.get("name", schema["name"].default))
    cls = ALGORITHMS.get(name)
    fields = algorithm_fields(cls)
    valid = {"name", *fields.hyper}
    if fields.aggregator:
        valid.add("aggregator")
    if fields.server_opt:
        valid.update(_SERVER_KEYS)
    for key in table:
        if key not in valid:
            if key in schema:
                what = "aggregator" if key == "aggregator" else "server optimiser"
                raise FedriskError(
                    f"algorithm.{key} is not allowed for algorithm {name!r} (it has no {what}); "
                    f"valid keys in [algorithm]: {', '.join(sorted(valid))}"
                )
            raise unknown_key("algorithm", key, valid)
    out: dict[str, Any] = {"name": name}
    for key, (spec, default) in fields.hyper.items():
        if key in table:
            out[key] = coerce(f"algorithm.{key}", table[key], spec)
        elif default is REQUIRED:
            raise FedriskError(f"algorithm {name!r} needs the hyper-parameter 'algorithm.{key}' ({spec.describe()})")
        else:
            out[key] = default
    if fields.aggregator:
        out["aggregator"] = _resolve_aggregator(table.get("aggregator"), cls, fields.aggregator)
    if fields.server_opt:
        for key in _SERVER_KEYS:
            out[key] = _check_value(f"algorithm.{key}", schema[key], table.get(key, schema[key].default))
        if out["server_optimizer"] == "adam" and (out["server_momentum"] or out["server_nesterov"]):
            raise FedriskError(
                'algorithm.server_optimizer = "adam" takes only server_lr (Adam\'s betas are 0.9, 0.999); '
                "remove algorithm.server_momentum / algorithm.server_nesterov"
            )
        if out["server_optimizer"] == "sgd":  # the default stays out: checkpoints written before the key resume
            del out["server_optimizer"]
    _precheck_algorithm(cls, out, fields)
    return out


def _resolve_aggregator(value: Any, cls: type, field_name: str) -> Any:
    from fedrisk.aggregators import AGGREGATORS

    if value is None:
        default = next(f for f in dataclasses.fields(cls) if f.name == field_name)
        obj = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default
        name = getattr(obj, "name", None)
        return name if name in AGGREGATORS else NONE
    if isinstance(value, str):
        name, options = value, {}
    elif isinstance(value, Mapping):
        if "name" not in value:
            raise FedriskError(
                'algorithm.aggregator table needs a name, e.g. aggregator = {name = "median"}; '
                f"valid choices: {', '.join(AGGREGATORS.names())}"
            )
        name, options = value["name"], {k: v for k, v in value.items() if k != "name"}
    else:
        raise FedriskError(
            f"algorithm.aggregator = {format_value(value)} has the wrong type; allowed: a name or a table with a name"
        )
    if name not in AGGREGATORS:
        raise unknown_choice("algorithm.aggregator", name, AGGREGATORS.names())
    allowed = signature_options(AGGREGATORS.get(name))
    options = _check_options(f"aggregator {name!r}", "algorithm.aggregator", options, allowed, fill=True)
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


def _resolve_objective(table: Mapping[str, Any], algorithm: Mapping[str, Any]) -> dict[str, Any]:
    from fedrisk.algorithms import ALGORITHMS

    out = _check_fixed("objective", table)
    fields = algorithm_fields(ALGORITHMS.get(algorithm["name"]))
    if fields.loss is None and out["name"] != AUTO:
        raise FedriskError(
            f"objective.name = {format_value(out['name'])} is not allowed: algorithm {algorithm['name']!r} defines its "
            f"own objective through its hyper-parameters (see `fedrisk list algorithms {algorithm['name']}`); "
            f'remove [objective] or set name = "{AUTO}"'
        )
    return out


# ----------------------------------------------------------------------------- [attack]


def _resolve_attack(table: Mapping[str, Any], num_clients: int) -> dict[str, Any]:
    reg = attack_registry()
    if reg is None or not reg.names():
        raise FedriskError("[attack]: no attacks are registered in this installation (fedrisk.attacks.ATTACKS)")
    out = _check_fixed("attack", table, extra_ok=lambda k: True)
    schema = _schema("attack")
    if out["byzantine"] and out["num_byzantine"]:
        raise FedriskError("[attack]: give either byzantine (client ids) or num_byzantine, not both")
    ids = out["byzantine"] or list(range(out["num_byzantine"]))
    bad = [k for k in ids if not 0 <= k < num_clients]
    if bad or len(set(ids)) != len(ids):
        raise FedriskError(
            f"attack.byzantine = {format_value(ids)} is not allowed; "
            f"allowed: distinct client ids in [0, {num_clients - 1}]"
        )
    if not ids:
        raise FedriskError("[attack] needs Byzantine clients: set byzantine = [ids] or num_byzantine = N")
    factory = reg.get(out["name"])
    allowed = signature_options(factory)
    extra = {k: v for k, v in table.items() if k not in schema}
    out.update(_check_options(f"attack {out['name']!r}", "attack", extra, allowed, fill=True))
    return out


# ----------------------------------------------------------------------------- [run], [sweep]


def _resolve_run(table: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    from fedrisk.metrics import parse_metric

    out = _check_fixed("run", table)
    for m in out["metrics"]:
        try:
            parse_metric(m)
        except FedriskError as exc:
            raise FedriskError(f"run.metrics: {exc}") from None
    if "validation" in out["splits"] and data["validation_fraction"] <= 0:
        raise FedriskError(
            'run.splits includes "validation" but data.validation_fraction = 0.0; allowed: set '
            'data.validation_fraction in (0, 1) or evaluate on ["test"] only'
        )
    if len(set(out["seeds"])) != len(out["seeds"]) or any(s < 0 for s in out["seeds"]):
        raise FedriskError(f"run.seeds = {format_value(out['seeds'])} is not allowed; allowed: distinct integers >= 0")
    return out


def _resolve_sweep(table: Mapping[str, Any]) -> dict[str, Any]:
    out = _check_fixed("sweep", table)
    seeds = out["seeds"]
    if isinstance(seeds, int):
        check_range("sweep.seeds", seeds, 1)
    elif not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise FedriskError(f"sweep.seeds = {format_value(seeds)} is not allowed; allowed: distinct integers >= 0")
    grid = flatten(out["grid"])
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise FedriskError(
                f"sweep.grid.{key} = {format_value(values)} has the wrong type; allowed: a non-empty list of values"
            )
    out["grid"] = grid
    variants = {}
    for name, over in out["variants"].items():
        if not isinstance(over, Mapping) or not over:
            raise FedriskError(
                f"sweep.variants.{name} = {format_value(over)} has the wrong type; allowed: a table of overrides "
                'such as {"algorithm.name" = "scaffold"}'
            )
        variants[name] = flatten(over)
    out["variants"] = variants
    return out


def resolve_seeds(spec: int | Sequence[int], base: int = 0) -> list[int]:
    """``N`` -> ``[base, ..., base + N - 1]``; a list is taken as it is."""
    if isinstance(spec, int):
        return list(range(base, base + spec))
    return list(spec)


# ============================================================================= reference


def _allowed_text(o: Option) -> str:
    if isinstance(o.choices, str):
        return f"`fedrisk list {o.choices}`"
    if o.choices:
        return ", ".join(f'"{c}"' for c in o.choices)
    if o.low is None and o.high is None:
        return ""
    lb = "[" if o.low_inclusive and o.low is not None else "("
    rb = "]" if o.high_inclusive and o.high is not None else ")"
    lo = "-inf" if o.low is None else repr(o.low)
    hi = "inf" if o.high is None else repr(o.high)
    return f"{lb}{lo}, {hi}{rb}"


def reference_markdown() -> str:
    """The key tables of ``docs/config-reference.md``, generated from :data:`SCHEMA` (a test
    checks that the document contains exactly this text)."""
    blocks = []
    for section, options in SCHEMA.items():
        title = "top level" if not section else f"[{section}]"
        lines = [f"### {title}", "", "| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for o in options:
            if o.default is REQUIRED:
                default = "(required)"
            elif o.type == "table" and o.default is None:
                default = "(absent)"
            elif isinstance(o.default, str) and o.default.startswith("("):
                default = o.default
            else:
                default = f"`{format_value(o.default)}`"
            doc = o.doc.replace("|", "\\|")
            kind = o.spec.short().replace(" | ", " or ")
            lines.append(f"| `{o.key}` | {kind} | {default} | {_allowed_text(o)} | {doc} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
