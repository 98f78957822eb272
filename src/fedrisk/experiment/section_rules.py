"""The rules between the keys of a config, one ``resolve_*`` function per table of
:data:`~fedrisk.experiment.sections.SCHEMA`: what a section's pydantic model cannot say alone (a
named component's own options, keys that depend on each other), every problem collected.
``fedrisk.experiment.config.resolve_config`` calls them; :mod:`fedrisk.experiment.sections`
holds the models.

Example:
    >>> problems = []
    >>> resolve_run({"rounds": 0}, None, problems), problems
    (None, ['run.rounds = 0 is out of range; allowed: [1, inf)'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedrisk.errors import FedriskError, check_range
from fedrisk.experiment.schema import (
    AUTO,
    NONE,
    RUN_SEED,
    AlgorithmFields,
    Section,
    algorithm_fields,
    attack_registry,
    derived_section,
    field_names,
    flatten,
    format_value,
    is_plain_value,
    options_section,
    registry_names,
    section_values,
    signature_options,
    unknown_choice,
    validate,
)
from fedrisk.experiment.sections import (
    Algorithm,
    AlgorithmName,
    Attack,
    Data,
    DualModel,
    Model,
    Objective,
    Run,
    ServerStep,
    Sweep,
)

# ============================================================================= rules between keys
# Each section's table is validated by its model (sections.py); the functions below add what a model
# cannot say alone (a name's own options, rules between keys) and collect every problem.


def table_values(model: type[Section], table: Any, name: str, problems: list[str]) -> dict[str, Any] | None:
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
    values = table_values(model, table, name, problems) or {}
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


def resolve_data(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.data import DATASETS, PARTITIONERS

    out = table_values(Data, table, "data", problems)
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


def resolve_model(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.models import MODELS

    fixed, given = _split(table, Model)
    out = table_values(Model, fixed, "model", problems)
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


def resolve_dual_model(
    table: Mapping[str, Any], algorithm: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    """``[dual_model]``: a zoo model with its options, as ``[model]``, for an algorithm with a
    ``dual_model`` field (the SGDA family) playing a network game (``game = "gan"``, ...)."""
    from fedrisk.algorithms import ALGORITHMS
    from fedrisk.models import MODELS

    fixed, given = _split(table, DualModel)
    out = table_values(DualModel, fixed, "dual_model", problems)
    if algorithm is not None and "dual_model" not in algorithm_fields(ALGORITHMS.get(algorithm["name"])).fixed:
        problems.append(
            f"[dual_model] is not allowed for algorithm {algorithm['name']!r} (it has no dual player); "
            "allowed with: local_sgda, local_sgda_plus, fsgda, fessgda, fessgda_ncc, fed_norm_sgda(_plus), sagda"
        )
    if (name := _valid_name(table, "name", None, "models")) is None:
        return None
    model = options_section(f"model {name!r}", MODELS.get(name), ("input_shape", "num_outputs"), 2)
    options = _options(model, given, "dual_model", problems, fill=True)
    return None if out is None else {**out, **options}


def check_dual_model(algorithm: Mapping[str, Any] | None, dual: bool) -> list[str]:
    """A network game (a registered game name) needs ``[dual_model]``, a vector game refuses it."""
    from fedrisk.objectives.adversarial import GAME_REGISTRY

    if algorithm is None or "game" not in algorithm:
        return []
    network = algorithm["game"] in GAME_REGISTRY
    if network and not dual:
        return [
            f"algorithm.game = {format_value(algorithm['game'])} is played by a network dual: add a [dual_model] "
            'table (e.g. name = "mlp", hidden = [64])'
        ]
    if not network and dual:
        return [
            f"[dual_model] is for network games ({', '.join(GAME_REGISTRY.names())}); algorithm.game = "
            f"{format_value(algorithm['game'])} has a vector y (remove [dual_model] or change algorithm.game)"
        ]
    return []


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
            hyper["aggregator"] = (None, None)  # a name or a table: checked by resolve_aggregator
        phrase = f"algorithm {name!r} needs the hyper-parameter '{{key}}' ({{type}})"
        cached = _ALGORITHM_SECTIONS[cls] = derived_section(f"Algorithm[{name}]", bases, hyper, required=phrase)
    return cached


_ALGORITHM_SECTIONS: dict[type, type[Section]] = {}


def resolve_algorithm(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.algorithms import ALGORITHMS

    if not isinstance(table, Mapping):
        problems.append(f"[algorithm] must be a table; got {format_value(table)}")
        return None
    head = table_values(AlgorithmName, {"name": table["name"]} if "name" in table else {}, "algorithm", problems)
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
    values = table_values(model, table, "algorithm", problems)
    if fields.aggregator:  # checked even when another key is wrong
        aggregator = resolve_aggregator(table.get("aggregator"), cls, fields.aggregator, problems)
    if values is None:
        return None
    out = {"name": values["name"], **{k: values[k] for k in fields.hyper}}
    if fields.aggregator:
        out["aggregator"] = aggregator
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


def resolve_aggregator(value: Any, cls: type, field_name: str, problems: list[str]) -> Any:
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
    if not isinstance(name, str):
        problems.append(f"algorithm.aggregator.name = {format_value(name)} has the wrong type; allowed: a string")
        return None
    if name not in AGGREGATORS:
        problems.append(unknown_choice("algorithm.aggregator", name, AGGREGATORS.names()))
        return None
    from fedrisk.aggregators.robust import RobustAggregator

    make = AGGREGATORS.get(name)
    robust = isinstance(make, type) and issubclass(make, RobustAggregator)
    own = signature_options(make)  # rules with their own __init__ hide the shared keys behind **kw
    extra = tuple(k for k in ROBUST_AGGREGATOR_KEYS if k[0] not in own) if robust else ()
    model = options_section(f"aggregator {name!r}", make, extra=extra)
    options = _options(model, options, "algorithm.aggregator", problems, fill=True)
    if options:  # the shared keys stay out of the resolved table at their defaults
        options = {k: v for k, v in options.items() if (k, type(v), v) not in extra}
    return {"name": name, **options} if options else name


ROBUST_AGGREGATOR_KEYS = (("nonfinite", str, "raise"), ("pre", str, "none"), ("bucket_size", int, 2))
"""Options of every robust aggregator (:class:`~fedrisk.aggregators.robust.RobustAggregator`)
beside its rule's own: ``nonfinite = "raise" | "exclude"``, ``pre = "none" | "bucketing" | "nnm"
| "arc"`` and ``bucket_size``, e.g. ``aggregator = { name = "krum", f = 4, nonfinite = "exclude" }``."""


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


def resolve_objective(
    table: Mapping[str, Any], algorithm: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    from fedrisk.algorithms import ALGORITHMS

    out = table_values(Objective, table, "objective", problems)
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


def resolve_attack(
    table: Mapping[str, Any], data: Mapping[str, Any] | None, problems: list[str]
) -> dict[str, Any] | None:
    reg = attack_registry()
    if reg is None or not reg.names():
        problems.append("[attack]: no attacks are registered in this installation (fedrisk.attacks.ATTACKS)")
        return None
    fixed, given = _split(table, Attack)
    out = table_values(Attack, fixed, "attack", problems)
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


CLIENT_STATS = ("mean", "wmean", "std", "bottom10", "worst")
EXACT_GAME_METRICS = ("generator_error", "grad_phi_norm")
"""Metrics a min-max game computes exactly from its server iterate (the WGAN's distance to the
true generator, the NC-SC game's ``||∇Φ(x)||``): population quantities with no data split behind
them, so selecting or tuning on them looks at no test data (issue 25: tuned FESS-GDA rows)."""
"""The per-client summaries of ``fedrisk.runtime.evaluation`` (kept here: no torch import)."""


def check_select_by(select_by: str, data: Mapping[str, Any], metrics: Sequence[str] = ()) -> str:
    """The record key that ``run.select_by`` selects on (``""`` for none), checked against the
    data's validation splits and, when given, the evaluated ``metrics`` (issue 24).

    ``personal_<metric>_<stat>`` names the per-client validation summaries
    (``validation_personal_<metric>_<stat>``); a ``test_*`` or training metric is refused.

    Example:
        >>> check_select_by("personal_auroc_mean", {"validation_fraction": 0.0, "client_validation_fraction": 0.2})
        'validation_personal_auroc_mean'
        >>> check_select_by("auto", {"validation_fraction": 0.1, "client_validation_fraction": 0.0}, ["auroc"])
        'validation_auroc'
        >>> check_select_by("grad_phi_norm", {"validation_fraction": 0.0})  # an exact game metric
        'grad_phi_norm'
    """
    glob, per_client = data["validation_fraction"] > 0, data.get("client_validation_fraction", 0.0) > 0
    if select_by == NONE or (select_by == AUTO and not metrics):
        return ""
    if select_by == AUTO:
        if glob:
            return f"validation_{metrics[0]}"
        return f"validation_personal_{metrics[0]}_mean" if per_client else ""
    if select_by in EXACT_GAME_METRICS:
        return select_by
    key = "validation_" + select_by if select_by.startswith("personal_") else select_by
    personal = key.startswith("validation_personal_")
    stat = key.rsplit("_", 1)[-1]
    if not key.startswith("validation_") or (personal and stat not in CLIENT_STATS):
        raise FedriskError(
            f'run.select_by = {select_by!r} is not a validation metric; allowed: "validation_<metric>", '
            f'"personal_<metric>_<stat>" (stat: {", ".join(CLIENT_STATS)}), an exact game metric '
            f'({", ".join(EXACT_GAME_METRICS)}), "auto" or "none" (selecting on '
            "test data would report an oracle)"
        )
    if personal and not per_client:
        raise FedriskError(
            f"run.select_by = {select_by!r} needs per-client validation splits but data.client_validation_fraction "
            "= 0.0; allowed: set data.client_validation_fraction in (0, 1), or select on validation_<metric>"
        )
    if not personal and not glob:
        raise FedriskError(
            f"run.select_by = {select_by!r} needs a validation split but data.validation_fraction = 0.0; "
            'allowed: set data.validation_fraction in (0, 1), or run.select_by = "none"'
        )
    metric = key.removeprefix("validation_personal_").rsplit("_", 1)[0] if personal else key[len("validation_") :]
    if metrics and metric not in metrics:
        raise FedriskError(
            f"run.select_by = {select_by!r}: metric {metric!r} is not evaluated on validation; evaluated: "
            f"{', '.join(metrics)} (add it to run.metrics)"
        )
    return key


def resolve_run(table: Mapping[str, Any], data: Mapping[str, Any] | None, problems: list[str]) -> dict[str, Any] | None:
    from fedrisk.metrics import parse_metric
    from fedrisk.runtime.device import check_device_spec

    out = table_values(Run, table, "run", problems)
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
    if data is not None:
        try:
            check_select_by(out["select_by"], data, out["metrics"])  # issue 24
        except FedriskError as exc:
            problems.append(str(exc))
    device_problem = check_device_spec(out["device"], "run.device")
    if device_problem:
        problems.append(device_problem)
    if len(set(out["seeds"])) != len(out["seeds"]) or any(s < 0 for s in out["seeds"]):
        problems.append(f"run.seeds = {format_value(out['seeds'])} is not allowed; allowed: distinct integers >= 0")
    return out


def resolve_sweep(table: Mapping[str, Any], problems: list[str]) -> dict[str, Any] | None:
    out = table_values(Sweep, table, "sweep", problems)
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
