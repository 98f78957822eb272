"""Every fixed key of a config, one pydantic model per table (:data:`SCHEMA`).

A key is one annotated line: its type, :func:`~fedrisk.experiment.schema.key` with the
default (``...`` = required), the line of ``docs/config-reference.md``, a range (``ge`` /
``gt`` / ``le`` / ``lt``) and ``semantic=False`` for keys that do not change a run's numbers;
``Annotated[str, OneOf("executors")]`` restricts a name to a registry (or a tuple).  **Adding a
key** to ``[run]`` is one line in :class:`Run`::

    select_by: str = key("", 'metric that picks the reported round; "" = the last round')

then regenerate the reference (:func:`reference_markdown` below;
``tests/experiment/test_docs.py`` says when it is stale).  A rule between keys goes in the
section's ``resolve_*`` function in :mod:`fedrisk.experiment.section_rules`.  A new table is a
:class:`~fedrisk.experiment.schema.Section` subclass here, a field of that type in its parent
(``binarize: Binarize | None``) and an entry in :data:`SCHEMA`; a new top-level table is
an entry in :data:`SCHEMA` and :data:`SECTIONS` (``resolve_config`` then validates it and
adds it to the resolved config; a rule between its keys goes in a ``resolve_<table>``
function called there).  The options of named components (an algorithm's
hyper-parameters, a dataset's or model's options) are not listed here: they are derived from
the registered dataclass / function (:mod:`fedrisk.experiment.schema`).

Example:
    >>> from fedrisk.experiment.schema import validate
    >>> validate(Run, {"rounds": 3}, "run")[0].rounds
    3
    >>> validate(Data, {"dataset": "digits", "binarize": {"imratio": 1}}, "data")[1]
    ['data.binarize.imratio = 1.0 is out of range; allowed: (0.0, 1.0)']
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic_core import PydanticUndefined

from fedrisk.experiment.schema import (
    AUTO,
    RUN_SEED,
    SHOWN_DEFAULT,
    OneOf,
    Section,
    format_value,
    interval,
    key,
    short,
)

DTYPES = ("float32", "float64")
SPLITS = ("test", "validation")
FAILURE_POLICIES = ("raise", "skip")
CLIENT_STATES = ("memory", "disk")
SERVER_OPTIMIZERS = ("sgd", "adam")
ONE_OUTPUT_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_probs", "mse")


# ============================================================================= the schema


class TopLevel(Section):
    imports: list[str] = key([], "modules imported before validation (they may register algorithms, datasets, ...)")


class Binarize(Section):
    positive_classes: int | list[int] | None = key(
        None, 'classes mapped to label 1; "none" = the upper half of the classes'
    )
    imratio: float | None = key(
        None, 'target positive fraction of the training set (positives subsampled); "none" = keep all', gt=0.0, lt=1.0
    )
    per_class: bool = key(False, "spread the positive budget over the positive classes in proportion to their sizes")
    balanced_test: bool = key(False, "subsample the test set to equal class counts")


class FeatureNoise(Section):
    std: float = key(..., "noise standard deviation", ge=0.0)
    mean: float = key(0.0, "noise mean of the middle client")
    mean_step: float = key(0.0, "client k's mean is mean + (k - K//2) * mean_step")


class LabelNoise(Section):
    rate: float = key(0.0, "probability of replacing a client's training label by a random other class", ge=0.0, le=1.0)


class Data(Section):
    dataset: Annotated[str, OneOf("datasets")] = key(..., "dataset name")
    partition: Annotated[str, OneOf("partitioners")] = key("iid", "partitioner name")
    num_clients: int = key(10, "number of clients K", ge=1)
    seed: int | str = key(
        RUN_SEED, 'seed of the data pipeline; "run" = the run\'s seed, an integer fixes the split across seeds'
    )
    data_root: str = key("", 'folder with user-supplied files (MNIST, CIFAR, ...); "" = none')
    client_test_fraction: float = key(0.0, "share of each client's rows kept as its personal test set", ge=0.0, lt=1.0)
    validation_fraction: float = key(
        0.0, "share of the training set held out as the global validation set", ge=0.0, lt=1.0
    )
    client_validation_fraction: float = key(  # issue 24
        0.0,
        "share of each client's training rows (after its test split) held out as its personal validation set "
        "(stratified, seeded by the run's seed)",
        ge=0.0,
        lt=1.0,
    )
    dataset_options: dict[str, Any] = key(
        {}, "options of the dataset loader (checked against it; `fedrisk list datasets`)"
    )
    partition_options: dict[str, Any] = key(
        {}, "options of the partitioner (alpha, min_size, classes_per_client, ..., on)"
    )
    binarize: Binarize | None = key(None, "optional [data.binarize] table: classes -> {0, 1}")
    feature_noise: FeatureNoise | None = key(
        None, "optional [data.feature_noise] table: per-client Gaussian input noise"
    )
    label_noise: LabelNoise | None = key(
        None, "optional [data.label_noise] table: symmetric label noise on client rows"
    )


class Model(Section):
    name: Annotated[str, OneOf("models")] = key("logreg", "model name (its options go beside it, e.g. hidden = [64])")
    num_outputs: int | str = key(AUTO, '"auto" (classes, or 1 for one-output objectives / scorers) or an integer')
    # -- issue 30: BatchNorm running statistics, the two-stage recipe's new head
    norm_stats: Annotated[str, OneOf((AUTO, "averaged", "local", "frozen"))] = key(
        AUTO,
        'BatchNorm running statistics: "averaged" (the default for models with BatchNorm), "local" (FedBN) '
        'or "frozen"; "auto" = averaged, or none for models without BatchNorm',
    )
    reset_head: bool = key(False, "re-initialise the last layer after run.init_from (pre-train, new head)")


class DualModel(Section):  # issue 30: the dual player of the min-max family as a network
    name: Annotated[str, OneOf("models")] = key(
        ..., "the dual player's model (a discriminator, an adversary; its options go beside it, as in [model])"
    )
    num_outputs: int = key(1, "outputs of the dual model (1: one score per row)", ge=1)


class Objective(Section):
    name: Annotated[str, OneOf("objectives")] = key(AUTO, '"auto" or a loss name (`fedrisk list objectives`)')


class AlgorithmName(Section):
    name: Annotated[str, OneOf("algorithms")] = key(
        "fedavg", "algorithm name (its hyper-parameters go beside it; `fedrisk list algorithms NAME`)"
    )


class AggregatorKey(Section):
    aggregator: str | dict[str, Any] = key(
        None,
        'aggregator name, or {name = "...", option = ...} (algorithms with an aggregator field)',
        shown="(algorithm default)",
    )


class ServerStep(Section):
    server_lr: float = key(
        1.0, "server learning rate on the averaged delta (algorithms with a server_opt field)", gt=0.0
    )
    server_momentum: float = key(
        0.0, "server momentum beta (FedAvgM; algorithms with a server_opt field)", ge=0.0, lt=1.0
    )
    server_nesterov: bool = key(False, "Nesterov form of the server momentum")
    server_optimizer: Annotated[str, OneOf(SERVER_OPTIMIZERS)] = key(
        "sgd", 'server step: "sgd" (server_lr, server_momentum) or "adam" (Adam with lr server_lr on -delta)'
    )


class Algorithm(ServerStep, AggregatorKey, AlgorithmName):
    """The fixed keys of ``[algorithm]``; an algorithm's own table is :func:`algorithm_section`."""


class Attack(Section):
    name: Annotated[str, OneOf("attacks")] = key(..., "attack name (its options go beside it)")
    byzantine: list[int] = key([], "ids of the Byzantine clients")
    num_byzantine: int = key(0, "alternatively: the first num_byzantine clients are Byzantine", ge=0)


class Run(Section):
    rounds: int = key(10, "communication rounds", ge=1)
    seed: int = key(0, "the root of every random stream (data, initialisation, clients)", ge=0)
    seeds: list[int] = key([], "several seeds: `fedrisk run` runs each into DIR/seed=<s>")
    executor: Annotated[str, OneOf("executors")] = key("sequential", "how clients are run")
    eval_every: int = key(1, "evaluate every this many rounds (and after the last)", ge=1)
    eval_at_start: bool = key(False, "also evaluate the initial model (round 0)")
    metrics: list[str] = key([], "metric names; [] = accuracy/log_loss, or auroc/auprc for one-output binary models")
    splits: Annotated[list[str], OneOf(SPLITS)] = key(["test"], "global splits to evaluate on")
    select_by: str = key(  # issue 24
        AUTO,
        'the validation metric that selects the reported round and the saved model: "validation_<metric>", '
        '"personal_<metric>_<stat>" (each client\'s own validation split), "none", or "auto" = validation_<first '
        "metric> with a validation split, else personal_<first metric>_mean with per-client validation splits, "
        'else none; a game\'s exact metric of its iterate ("grad_phi_norm", "generator_error") needs no split',
    )
    dtype: Annotated[str, OneOf(DTYPES)] = key("float32", "floating dtype of data and parameters")
    on_client_failure: Annotated[str, OneOf(FAILURE_POLICIES)] = key(
        "raise", "a failing / NaN client stops the run or is skipped"
    )
    min_replies: int = key(1, "a round with fewer valid client replies stops the run (never counted)", ge=1)
    client_states: Annotated[str, OneOf(CLIENT_STATES)] = key(
        "memory",
        'where per-client states live: "memory", or "disk" (one file per client in DIR/client_states; '
        "checkpoints link the files instead of loading them; for large federations)",
        semantic=False,
    )
    checkpoint_every: int = key(
        0, "also write a checkpoint every this many rounds (0 = no round interval)", ge=0, semantic=False
    )
    checkpoint_seconds: float = key(
        30.0,
        "write a checkpoint after a round once this many seconds have passed since the last one "
        "(0 = no time interval); checkpoints are always written at the end and on SIGINT/SIGTERM",
        ge=0,
        semantic=False,
    )
    threads: int = key(0, "torch threads (0 = torch's default)", ge=0, semantic=False)
    device: str = key(
        "cpu",
        'where data, parameters and states live: "cpu", "cuda" (under torchrun: the GPU LOCAL_RANK), "cuda:N" '
        'or "auto" (CUDA when available); random draws stay on the CPU generators, so a seed gives the same '
        "streams on every device (numbers agree to rounding)",
        semantic=False,
    )
    init_from: str = key(
        "", 'start from a finished run\'s model: its directory (model.pt) or a .pt file; "" = random init'
    )


class Output(Section):
    dir: str = key("", 'the run directory; "" = runs/<config file name>', semantic=False)
    plots: bool = key(True, "write PNG plots at the end of the run (and `fedrisk tune`'s history.png)", semantic=False)
    tensorboard: bool = key(
        False,
        "also log every evaluation and the config to TensorBoard event files in DIR/tensorboard "
        "(needs fedrisk[tracking])",
        semantic=False,
    )
    mlflow: bool = key(
        False, "also log every evaluation and the config to MLflow (needs fedrisk[tracking])", semantic=False
    )
    mlflow_tracking_uri: str = key("", 'the MLflow tracking URI; "" = a local file store in DIR/mlruns', semantic=False)
    mlflow_experiment: str = key("", 'the MLflow experiment name; "" = the config file\'s name', semantic=False)


class Sweep(Section):
    seeds: int | list[int] = key(1, "an integer N (seeds run.seed .. run.seed+N-1) or a list of seeds", semantic=False)
    jobs: int = key(1, "runs in parallel (subprocesses)", ge=1, semantic=False)
    grid: dict[str, Any] = key(
        {}, 'key -> list of values, e.g. "algorithm.lr" = [0.03, 0.1]; every combination runs', semantic=False
    )
    variants: dict[str, Any] = key(
        {}, "name -> table of overrides; every variant runs with every grid point", semantic=False
    )


# ---- [tune] (fedrisk tune, sweep --tune; the space is parsed and checked by fedrisk.experiment.tune_space)
class Tune(Section):
    space: dict[str, Any] = key(
        {},
        'key -> search space, e.g. "algorithm.lr" = "log:1e-3:1" (also "float:LO:HI", "int:LO:HI", '
        '"logint:LO:HI", "choice:A,B,C")',
        semantic=False,
    )
    keys: list[str] = key(
        [], "the keys of space that are tuned ([] = all); a sweep variant sets its own", semantic=False
    )
    trials: int = key(16, "trials per study (per variant under `sweep --tune`)", ge=1, semantic=False)
    metric: str = key(
        "",
        'the validation metric to optimise, e.g. "validation_auroc", or a game\'s exact "grad_phi_norm" / '
        '"generator_error" (required to tune)',
        semantic=False,
    )
    pruner: Annotated[str, OneOf(("median", "halving", "none"))] = key(
        "median", "stop unpromising trials early", semantic=False
    )
    sampler: Annotated[str, OneOf(("tpe", "random"))] = key(
        "tpe", "how trials are proposed (seeded with run.seed)", semantic=False
    )
    jobs: int = key(1, "trials in parallel (worker processes)", ge=1, semantic=False)


# ---- end [tune]


SCHEMA: dict[str, type[Section]] = {
    "": TopLevel,
    "data": Data,
    "data.binarize": Binarize,
    "data.feature_noise": FeatureNoise,
    "data.label_noise": LabelNoise,
    "model": Model,
    "dual_model": DualModel,
    "objective": Objective,
    "algorithm": Algorithm,
    "attack": Attack,
    "run": Run,
    "output": Output,
    "sweep": Sweep,
    "tune": Tune,
}
"""Every table of a config (``""`` = top level).  ``[model]``, ``[algorithm]`` and ``[attack]``
also take the named object's own options; ``data.dataset_options`` and
``data.partition_options`` are checked against the named loader / partitioner."""

SECTIONS = ("data", "model", "dual_model", "objective", "algorithm", "attack", "run", "output", "sweep", "tune")
NOT_RUN_SECTIONS = ("sweep", "tune")
"""Sections that describe how runs are driven (sweeps, tuning), not one run: left out of run configs."""
OPTIONAL_TABLES = {"data.binarize", "data.feature_noise", "data.label_noise"}


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


# the rules between keys live in section_rules.py; their names stay importable from here
_RULES = (
    "CLIENT_STATS",
    "EXACT_GAME_METRICS",
    "ROBUST_AGGREGATOR_KEYS",
    "algorithm_section",
    "check_dual_model",
    "check_select_by",
    "model_options",
    "resolve_aggregator",
    "resolve_algorithm",
    "resolve_attack",
    "resolve_data",
    "resolve_dual_model",
    "resolve_model",
    "resolve_objective",
    "resolve_run",
    "resolve_sweep",
    "table_values",
)


def __getattr__(name: str) -> Any:
    """``from fedrisk.experiment.sections import check_select_by`` (and the other rules) as before
    the rules moved to :mod:`fedrisk.experiment.section_rules` (a lazy import: that module imports
    this one)."""
    if name in _RULES:
        from fedrisk.experiment import section_rules

        return getattr(section_rules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
