"""Build a run from a validated config: federation, model, objective, algorithm (with its
aggregator and server optimiser) and attack, as a fresh
:class:`~fedrisk.runtime.simulation.Simulation`.

This module owns turning a config into the objects of a run; running them (outputs,
checkpoints, resume, the summary) is :mod:`fedrisk.experiment.runner`'s.
:func:`build_simulation` resolves the "auto" values (``model.num_outputs``, ``objective.name``)
from the data and the algorithm and returns them in :class:`Built`; :func:`build_algorithm`
builds the algorithm and its model from those values without any dataset (what a Flower node
does, see ``fedrisk.deploy.node``); :func:`load_init_params` reads ``run.init_from`` (a
finished run's :data:`MODEL_FILE` or a ``.pt`` file); :func:`build_aggregator`,
:func:`build_server_opt` and :func:`build_attack` build the named components from their
resolved config tables.

Example:
    >>> from fedrisk.experiment.config import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "wine", "num_clients": 2}, "run": {"seeds": [4]}})
    >>> run_seed(cfg)
    4
    >>> built = build_simulation(cfg)
    >>> built.resolved["seed"], built.resolved["federation"] == built.simulation.federation.name
    (4, True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedrisk.algorithms.base import Algorithm
from fedrisk.errors import FedriskError
from fedrisk.experiment.config import ExperimentConfig
from fedrisk.experiment.schema import AUTO, NONE, RUN_SEED, algorithm_fields
from fedrisk.experiment.section_rules import model_options
from fedrisk.experiment.sections import ONE_OUTPUT_LOSSES
from fedrisk.runtime.device import resolve_device
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.norm_stats import with_norm_stats
from fedrisk.runtime.simulation import Simulation, make_executor

__all__ = [
    "MODEL_FILE",
    "Built",
    "build_aggregator",
    "build_algorithm",
    "build_attack",
    "build_server_opt",
    "build_simulation",
    "load_init_params",
    "run_seed",
    "wants_scorer",
]


@dataclass
class Built:
    """What :func:`build_simulation` made, plus the values it decided ("auto" resolved)."""

    simulation: Simulation
    resolved: dict[str, Any]


def run_seed(cfg: ExperimentConfig) -> int:
    """The seed of a single run: ``run.seeds[0]`` when exactly one is listed, else ``run.seed``."""
    seeds = cfg["run.seeds"]
    if len(seeds) > 1:
        raise FedriskError(
            f"run.seeds = {seeds} lists several seeds; a single run takes one (use `fedrisk run`, which runs each "
            "seed into DIR/seed=<s>, or `fedrisk sweep`)"
        )
    return seeds[0] if seeds else cfg["run.seed"]


def build_simulation(
    cfg: ExperimentConfig,
    seed: int | None = None,
    executor: Executor | None = None,
    client_store: Path | None = None,
) -> Built:
    """Federation, model, objective, algorithm (and attack) of ``cfg`` as a fresh Simulation.

    ``client_store`` is the folder for the client states when ``run.client_states = "disk"``
    (the runner passes ``<run dir>/client_states``); None keeps them in memory.

    Example:
        >>> from fedrisk.experiment.config import resolve_config
        >>> built = build_simulation(resolve_config({"data": {"dataset": "wine", "num_clients": 2}}))
        >>> built.simulation.federation.num_clients, built.resolved["num_outputs"], built.resolved["objective"]
        (2, 3, 'cross_entropy')
    """
    from fedrisk.algorithms import ALGORITHMS
    from fedrisk.data import build_federation

    seed = run_seed(cfg) if seed is None else seed
    data = cfg.section("data")
    fed = build_federation(
        data["dataset"],
        data["partition"],
        data["num_clients"],
        seed=seed if data["seed"] == RUN_SEED else data["seed"],
        data_root=data["data_root"] or None,
        dataset_options=data["dataset_options"],
        partition_options=data["partition_options"],
        binarize=data["binarize"],
        client_test_fraction=data["client_test_fraction"],
        validation_fraction=data["validation_fraction"],
        client_validation_fraction=data["client_validation_fraction"],
        feature_noise=data["feature_noise"],
        label_noise=data["label_noise"],
    )
    regression = fed.info.get("task") == "regression"

    cls = ALGORITHMS.get(cfg["algorithm.name"])
    if getattr(cls, "requires_pooled_data", False):
        from fedrisk.algorithms.local_only import centralized

        fed = centralized(fed)
    fields = algorithm_fields(cls)
    objective = cfg["objective.name"]
    num_outputs = cfg["model.num_outputs"]
    if num_outputs == AUTO:
        num_outputs = (
            1 if regression or objective in ONE_OUTPUT_LOSSES or wants_scorer(cls, fed.num_classes) else fed.num_classes
        )
    if fields.loss is not None and objective == AUTO:
        objective = "mse" if regression else ("binary_cross_entropy" if num_outputs == 1 else "cross_entropy")

    input_shape = tuple(int(d) for d in fed.clients[0].x.shape[1:])
    algorithm, module = build_algorithm(cfg, input_shape, num_outputs, objective)

    attack, byzantine = None, ()
    if "attack" in cfg.values:
        attack, byzantine = build_attack(cfg.section("attack"))

    dtype = {"float32": torch.float32, "float64": torch.float64}[cfg["run.dtype"]]
    init_params = None
    reset_head = bool(cfg.section("model").get("reset_head", False))
    if reset_head and not cfg["run.init_from"]:
        raise FedriskError("model.reset_head = true needs run.init_from (the model whose head it replaces)")
    if cfg["run.init_from"]:  # e.g. the two-stage recipe: cross-entropy pre-training, then CODASCA
        from fedrisk.rng import generator

        fresh = algorithm.init_params(generator(seed, "init"))  # what the run would start from
        head = algorithm.model.head_names() if reset_head else ()  # type: ignore[attr-defined]
        init_params = load_init_params(cfg["run.init_from"], fresh, reset=head)
    run_executor = executor if executor is not None else make_executor(cfg["run.executor"])
    if cfg["run.client_states"] == "disk" and run_executor.name == "distributed":
        raise FedriskError(
            'run.client_states = "disk" works with the sequential and vectorized executors only (the '
            "distributed executor replicates every client's state on every rank); use run.executor = "
            '"vectorized" or run.client_states = "memory"'
        )
    sim = Simulation(
        algorithm,
        fed,
        seed=seed,
        executor=run_executor,
        dtype=dtype,
        attack=attack,
        byzantine=byzantine,
        on_client_failure=cfg["run.on_client_failure"],
        min_replies=cfg["run.min_replies"],
        init_params=init_params,
        client_store=client_store if cfg["run.client_states"] == "disk" else None,
        device=resolve_device(cfg["run.device"], "run.device"),
    )
    resolved = {
        "seed": seed,
        "input_shape": list(input_shape),
        "num_outputs": num_outputs,
        "objective": objective if fields.loss is not None else f"(defined by {cfg['algorithm.name']})",
        "num_params": sum(p.numel() for p in module.parameters()),
        "federation": fed.name,
    }
    return Built(sim, resolved)


def build_algorithm(
    cfg: ExperimentConfig, input_shape: tuple[int, ...], num_outputs: int, objective: str
) -> tuple[Algorithm, torch.nn.Module]:
    """The algorithm of ``cfg`` (and its model's module) for data of ``input_shape`` with "auto"
    resolved (``num_outputs``, ``objective``) as :func:`build_simulation` resolves them; needs no
    dataset (a Flower node rebuilds its algorithm from these, see ``fedrisk.deploy.node``).

    Example:
        >>> from fedrisk.experiment.config import resolve_config
        >>> cfg = resolve_config({"data": {"dataset": "wine", "num_clients": 2}, "model": {"name": "logreg"}})
        >>> algorithm, module = build_algorithm(cfg, (13,), 3, "cross_entropy")
        >>> algorithm.name, sum(p.numel() for p in module.parameters())
        ('fedavg', 42)
    """
    from fedrisk.algorithms import ALGORITHMS
    from fedrisk.models import FunctionalModel, build_model
    from fedrisk.objectives.supervised import LOSSES

    alg_cfg = cfg.section("algorithm")
    cls = ALGORITHMS.get(alg_cfg["name"])
    fields = algorithm_fields(cls)
    model_cfg = cfg.section("model")
    noise_dim = alg_cfg.get("noise_dim", 0)  # a GAN's generator maps noise, not data rows
    model_input = (noise_dim,) if noise_dim else input_shape
    module = build_model(model_cfg["name"], model_input, num_outputs, **model_options(model_cfg))
    norm_stats = model_cfg.get("norm_stats", AUTO)
    model = FunctionalModel(module, norm_stats=None if norm_stats == AUTO else norm_stats)

    kwargs: dict[str, Any] = {k: alg_cfg[k] for k in fields.hyper}
    kwargs["model"] = model
    if cfg.values.get("dual_model"):  # issue 30: the dual player is a network on the data rows
        dual = cfg.section("dual_model")
        dual_module = build_model(dual["name"], input_shape, dual["num_outputs"], **model_options(dual))
        kwargs["dual_model"] = FunctionalModel(dual_module)
    if fields.loss is not None:
        kwargs[fields.loss] = LOSSES[objective][0]
    if fields.aggregator is not None and alg_cfg["aggregator"] != NONE:
        kwargs[fields.aggregator] = build_aggregator(alg_cfg["aggregator"])
    if fields.server_opt is not None:
        kwargs[fields.server_opt] = build_server_opt(
            alg_cfg["server_lr"],
            alg_cfg["server_momentum"],
            alg_cfg["server_nesterov"],
            alg_cfg.get("server_optimizer", "sgd"),
        )
    try:
        return with_norm_stats(cls(**kwargs)), module
    except FedriskError as exc:
        raise FedriskError(f"[algorithm] {alg_cfg['name']}: {exc}") from None


MODEL_FILE = "model.pt"
"""A finished run's global model parameters (``algorithm.global_params``), for ``run.init_from``."""


def load_init_params(source: str, expected: Any, reset: Sequence[str] = ()) -> Any:
    """The model parameters stored by a finished run (``<dir>/model.pt``) or in a ``.pt`` file
    (e.g. a ``state_dict`` of the same architecture), checked against the parameter tree
    ``expected`` (names and shapes; the offending tensor is named); an AUC-family run's
    ``{"model", "a", "b", "alpha"}`` contributes its ``"model"``, and a ``state_dict``'s
    ``num_batches_tracked`` counters are ignored.  The names in ``reset`` (``model.reset_head``:
    the last layer) keep ``expected``'s values and may differ in shape (a new head for a new
    task).  Read with ``torch.load(..., weights_only=True)`` (tensors and containers only).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "w.pt"
        >>> torch.save({"model": {"w": torch.ones(2)}, "alpha": torch.zeros(())}, path)
        >>> load_init_params(str(path), {"w": torch.zeros(2)})
        {'w': tensor([1., 1.])}
        >>> torch.save({"w": torch.ones(2), "head": torch.ones(10)}, path)
        >>> load_init_params(str(path), {"w": torch.zeros(2), "head": torch.zeros(1)}, reset=["head"])
        {'w': tensor([1., 1.]), 'head': tensor([0.])}
    """
    path = Path(source)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise FedriskError(
            f"run.init_from = {source!r}: {path} does not exist; allowed: a finished run's directory (holding "
            f"{MODEL_FILE}) or a .pt file of model parameters"
        )
    try:
        tree = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise FedriskError(f"run.init_from: cannot read {path}: {exc}") from None
    if isinstance(tree, Mapping) and isinstance(tree.get("model"), Mapping):  # an AUC run: {"model", "a", ...}
        tree = tree["model"]
    if not isinstance(expected, Mapping) or not isinstance(tree, Mapping):
        raise FedriskError(f"run.init_from: {path} holds {type(tree).__name__}, not a mapping of parameter names")
    got = {
        k: tuple(v.shape)
        for k, v in tree.items()
        if isinstance(v, torch.Tensor) and not str(k).endswith("num_batches_tracked") and k not in reset
    }
    want = {k: tuple(v.shape) for k, v in expected.items() if k not in reset}
    hint = "build the same model (model.* keys, num_outputs) as the run it comes from"
    for k in want:
        if k in got and got[k] != want[k]:
            raise FedriskError(
                f"run.init_from: tensor {k!r} has shape {list(got[k])} in {path} but {list(want[k])} in this model; "
                + (f"{hint}, or set model.reset_head = true if it is the head" if not reset else hint)
            )
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise FedriskError(
            f"run.init_from: the parameters in {path} do not fit this model (missing: {missing[:4]}, "
            f"not in this model: {extra[:4]}); {hint}"
        )
    return {k: expected[k] if k in reset else tree[k].to(expected[k].dtype) for k in expected}


def wants_scorer(cls: type, num_classes: int) -> bool:
    """Whether algorithm ``cls`` trains a one-output scorer on a ``num_classes`` task.

    An algorithm may say so with a class attribute ``scorer``; without one, an algorithm that
    defines its own objective (no ``loss`` field, e.g. the AUC min-max family) on a binary task
    is taken to want a scorer.
    """
    declared = getattr(cls, "scorer", None)
    if declared is not None:
        return bool(declared) and num_classes == 2
    return algorithm_fields(cls).loss is None and num_classes == 2


def build_aggregator(spec: str | Mapping[str, Any]) -> Any:
    """An aggregator from a resolved ``algorithm.aggregator`` (a name or a table with one)."""
    from fedrisk.aggregators import AGGREGATORS

    if isinstance(spec, str):
        return AGGREGATORS.get(spec)()
    options = {k: v for k, v in spec.items() if k != "name"}
    return AGGREGATORS.get(spec["name"])(**options)


def build_server_opt(lr: float, momentum: float, nesterov: bool, optimizer: str = "sgd") -> Any:
    """``chain(server_momentum(beta), server_lr(eta))`` without the identity parts, or ``server_adam(lr)``."""
    from fedrisk.algorithms.server_opt import chain, identity, server_adam, server_lr, server_momentum

    if optimizer == "adam":
        return server_adam(lr)

    parts = []
    if momentum > 0:
        parts.append(server_momentum(momentum, nesterov))
    if lr != 1.0:
        parts.append(server_lr(lr))
    if not parts:
        return identity()
    return parts[0] if len(parts) == 1 else chain(*parts)


def build_attack(spec: Mapping[str, Any]) -> tuple[Any, list[int]]:
    from fedrisk.experiment.schema import attack_registry
    from fedrisk.experiment.sections import Attack

    reg = attack_registry()
    options = {k: v for k, v in spec.items() if k not in Attack.model_fields}
    ids = list(spec["byzantine"]) or list(range(spec["num_byzantine"]))
    try:
        return reg.get(spec["name"])(**options), ids
    except FedriskError as exc:
        raise FedriskError(f"[attack] {spec['name']}: {exc}") from None
