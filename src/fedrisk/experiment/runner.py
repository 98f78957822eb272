"""Run one experiment from a validated config: build, run with progress, write outputs,
checkpoint, resume.

:func:`build_simulation` turns a config into a :class:`~fedrisk.runtime.simulation.Simulation`
(``build_federation`` -> model -> objective -> algorithm).  :func:`run_experiment` runs it
through :func:`fedrisk.api.run_simulation` with these callbacks: :class:`TrainMetrics` (the
round's training metrics into each evaluation record),
:class:`~fedrisk.experiment.selection.WorkMeter` (local steps per client and samples seen),
:class:`~fedrisk.experiment.selection.Selector` (model selection on validation,
``run.select_by``: ``DIR/selected.pt``), :class:`MetricsWriter` (``metrics.jsonl``),
:class:`~fedrisk.experiment.progress.Progress` and :class:`Checkpointer`.

Under the distributed executor (``torchrun ... -m fedrisk run CONFIG --set
run.executor=distributed``) every process runs this same code: the run directory is checked
and the checkpoint read once by rank 0 (``run_on_primary``), only rank 0 writes and shows
progress, and a signal seen by any process stops all of them after the same round
(``any_rank``).

Checkpoints and exact resume.  Every random draw of a run comes from a generator derived from
``(seed, round, client, stream)`` by :mod:`fedrisk.rng`, so the random state of a run *is* its
seed and its round.  A checkpoint therefore holds the round, the seed, the server state, every
client's state, the communication ledger and the evaluation history (plus the global
torch / NumPy / Python generator states, so that code drawing from them resumes too), and
``--resume`` continues bit-exactly: a run of 10 rounds and a run interrupted after 5 and
resumed end with identical metrics.  Checkpoints are written after a round once
``run.checkpoint_seconds`` (30 s) have passed since the last one, every ``run.checkpoint_every``
rounds if set, at the end, and on SIGINT / SIGTERM: the handler only sets a flag, the current round
(and its evaluation, if one is due) finishes, the checkpoint is written and the run stops with
:class:`RunInterrupted` (exit code 130 / 143 from the CLI).  A second SIGINT stops at once.
Checkpoint files carry a SHA-256 manifest, the previous one is kept as ``checkpoint.pt.prev``
and they are read without running code (:mod:`fedrisk.experiment.checkpoint`): a damaged newest
file falls back to the previous one with a warning, so ``kill -9`` at any moment is safe.

Example:
    >>> import tempfile
    >>> from fedrisk.experiment.config import resolve_config
    >>> cfg = resolve_config({"data": {"dataset": "digits", "num_clients": 3},
    ...                       "run": {"rounds": 2}, "output": {"plots": False}})
    >>> result = run_experiment(cfg, tempfile.mkdtemp(), progress="none")
    >>> result.summary["status"], result.summary["rounds"], "test_accuracy" in result.summary["final"]
    ('finished', 2, True)
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

import fedrisk
from fedrisk.algorithms.base import Algorithm
from fedrisk.api import Callback, History, resolve_metrics, run_simulation
from fedrisk.errors import FedriskError
from fedrisk.experiment.checkpoint import (
    load_newest,
    pack_global_rng,
    previous_path,
    read_manifest,
    replace_with_previous,
    unpack_global_rng,
    verify,
    write_checkpoint,
)
from fedrisk.experiment.config import ExperimentConfig, diff_configs
from fedrisk.experiment.outputs import (
    FAILURE,
    RECORD_KEYS,
    SELECTED_MODEL,
    RunDir,
    append_jsonl,
    atomic_torch_save,
    atomic_write_text,
    best_round,
    load_run,
    write_json,
    write_jsonl,
)
from fedrisk.experiment.progress import Progress
from fedrisk.experiment.schema import AUTO, NONE, RUN_SEED, algorithm_fields
from fedrisk.experiment.sections import ONE_OUTPUT_LOSSES, check_select_by, model_options
from fedrisk.experiment.selection import (
    Selector,
    WorkMeter,
    budget,
    lower_is_better,
    record_key,
    selected_record,
)
from fedrisk.experiment.tracking import open_tracking
from fedrisk.runtime.client_store import DiskClientStates, is_snapshot_ref, snapshot_problem
from fedrisk.runtime.device import resolve_device
from fedrisk.runtime.evaluation import check_client_splits
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.norm_stats import with_norm_stats
from fedrisk.runtime.simulation import RoundReport, Simulation, make_executor

CHECKPOINT_FORMAT = 1
RESUMABLE_ACROSS = ("run.executor",)
"""Config keys that may differ between a checkpoint and its resumed run (numbers then agree to
rounding, not bit for bit)."""
SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class RunInterrupted(Exception):
    """A run stopped on SIGINT / SIGTERM after writing its checkpoint."""

    def __init__(self, signum: int, round: int, run_dir: RunDir) -> None:
        self.signum = signum
        self.round = round
        self.path = run_dir.path
        name = SIGNAL_NAMES.get(signum, f"signal {signum}")
        super().__init__(
            f"{name} received: stopped after round {round}; checkpoint written to {run_dir.checkpoint}. "
            f"Continue with: fedrisk run {run_dir.config} --out {run_dir.path} --resume"
        )

    @property
    def exit_code(self) -> int:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum)


# ============================================================================= building


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
    from fedrisk.experiment.sections import Attack, attack_registry

    reg = attack_registry()
    options = {k: v for k, v in spec.items() if k not in Attack.model_fields}
    ids = list(spec["byzantine"]) or list(range(spec["num_byzantine"]))
    try:
        return reg.get(spec["name"])(**options), ids
    except FedriskError as exc:
        raise FedriskError(f"[attack] {spec['name']}: {exc}") from None


# ============================================================================= callbacks


class MetricsWriter(Callback):
    """Appends every evaluation record to ``metrics.jsonl`` (flushed line by line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        append_jsonl(self.path, record)


class TrainMetrics(Callback):
    """Adds the last round's mean training metrics to each evaluation record as
    ``train_<name>`` (e.g. ``train_loss``: the mean over the round's participating clients of
    their mean local loss).  The record is the one the history keeps, so ``metrics.jsonl``,
    the history and the checkpoint agree."""

    def __init__(self) -> None:
        self._last: tuple[int, dict[str, float]] | None = None

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        self._last = (sim.round, dict(report.train_metrics))

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        if self._last is not None and self._last[0] == record.get("round"):
            for name, value in self._last[1].items():
                record[f"train_{name}"] = value


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


class SignalGuard:
    """Within ``with``: SIGINT / SIGTERM only set :attr:`signum` (the run finishes its round);
    a second SIGINT raises ``KeyboardInterrupt``.  Handlers are installed only in the main
    thread and restored on exit."""

    def __init__(self, stream: TextIO | None = None, newline: bool = False) -> None:
        self.signum: int | None = None
        self.stream = stream
        self.newline = newline  # end a progress bar's line before the message
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        if self.stream is not None:
            try:
                self.stream.write(
                    ("\n" if self.newline else "")
                    + f"{SIGNAL_NAMES.get(signum, signum)} received: finishing the current round, then writing a "
                    "checkpoint (press Ctrl-C again to stop at once)\n"
                )
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Checkpointer(Callback):
    """Writes checkpoints after completed rounds: every ``every`` rounds, after the first round
    that ends ``seconds`` or more after the last checkpoint (wall clock; 0 = never, likewise
    ``every = 0``) and, when ``guard`` has seen a signal, once more before stopping the run.
    A time interval keeps the cost of checkpoints small whatever a round costs: a run of many
    millisecond rounds writes one every 30 s, not every 10 rounds.

    A round counts as completed after its evaluation when one is due, so the checkpoint's
    history always holds every evaluation up to its round.  With ``agree`` (the distributed
    executor's ``any_rank``) a signal seen by any process stops every process after the same
    round; only the primary process writes.
    """

    def __init__(
        self,
        path: Path,
        config: Mapping[str, Any],
        rounds: int,
        eval_every: int,
        every: int,
        guard: SignalGuard | None,
        history: History,
        elapsed: Any,
        agree: Callable[[bool], bool] | None = None,
        seconds: float = 0.0,
        extra: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.path = path
        self.extra = extra
        self.seconds = seconds
        self._last = time.monotonic()
        self.agree = agree
        self.config = dict(config)
        self.rounds = rounds
        self.eval_every = eval_every
        self.every = every
        self.guard = guard
        self.history = history
        self.elapsed = elapsed

    def _is_eval_round(self, r: int) -> bool:
        return r % self.eval_every == 0 or r == self.rounds

    def on_round_end(self, sim: Simulation, report: RoundReport) -> None:
        if not self._is_eval_round(sim.round):
            self._completed(sim)

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        if sim.round > 0 and record.get("round") == sim.round:
            self._completed(sim)

    def _completed(self, sim: Simulation) -> None:
        seen = self.guard is not None and self.guard.signum is not None
        if self.agree is not None:  # every process stops after the same round
            seen = self.agree(seen)
        if seen:
            self.save(sim)
            signum = self.guard.signum if self.guard is not None and self.guard.signum is not None else signal.SIGTERM
            raise _Stop(signum)
        due = bool(self.every) and sim.round % self.every == 0
        due = due or (self.seconds > 0 and time.monotonic() - self._last >= self.seconds)
        if due and sim.round < self.rounds:
            self.save(sim)

    def save(self, sim: Simulation) -> None:
        self._last = time.monotonic()
        if not sim.executor.is_primary:
            return
        save_checkpoint(self.path, sim, self.config, self.history, self.elapsed(), self.extra() if self.extra else None)


def save_checkpoint(
    path: Path,
    sim: Simulation,
    config: Mapping[str, Any],
    history: History,
    elapsed: float,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write the checkpoint of ``sim`` atomically (see the module docstring for its content);
    ``extra`` adds the run's own bookkeeping (the work counters, the selected model)."""
    state = sim.state_dict()  # client states on disk: a snapshot of linked files, not loaded
    disk = isinstance(sim.client_states, DiskClientStates)
    if not disk:
        state["client_states"] = sim.executor.collect_states(sim.client_states)
    write_checkpoint(
        path,
        {
            "format": CHECKPOINT_FORMAT,
            "fedrisk_version": fedrisk.__version__,
            "config": dict(config),
            "round": sim.round,
            "simulation": state,
            "history": [dict(r) for r in history.records],
            "elapsed": float(elapsed),
            "rng": pack_global_rng(),
            **dict(extra or {}),
        },
        format=CHECKPOINT_FORMAT,
        round=sim.round,
        **({"states_snapshot": state["client_states"]["snapshot"]} if disk else {}),
    )
    if disk:  # keep the snapshots of the newest and the previous checkpoint only
        keep = [read_manifest(p).get("states_snapshot") for p in (path, previous_path(path))]
        sim.client_states.prune(name for name in keep if name)


def load_checkpoint(path: Path, states_folder: Path | None = None) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (checked and loaded without running
    code; a bad newest file falls back to the previous one with a warning, see
    :mod:`fedrisk.experiment.checkpoint`).

    With client states on disk (in ``states_folder``), a checkpoint is good only if every file of
    its snapshot is there with its recorded SHA-256: when the newest one's snapshot is damaged,
    the previous checkpoint and its snapshot are used with a warning, and the newest file is
    replaced by the previous one (so that the next checkpoint keeps a usable previous one)."""

    newest = path

    def snapshot_ok(ckpt: Any) -> str | None:
        states = ckpt.get("simulation", {}).get("client_states") if isinstance(ckpt, dict) else None
        if states_folder is None or not is_snapshot_ref(states):
            return None
        problem = snapshot_problem(states_folder, states)
        return None if problem is None else f"{newest}: {problem}"

    ckpt, path = load_newest(newest, check=snapshot_ok)
    if path != newest and newest.is_file() and verify(newest) is None:  # whole file, unusable snapshot
        replace_with_previous(newest)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise FedriskError(f"{path} is not a fedrisk checkpoint (format {CHECKPOINT_FORMAT})")
    return ckpt


# ============================================================================= running


@dataclass
class RunResult:
    """A finished run: its directory, ``summary.json`` content and history."""

    path: Path
    summary: dict[str, Any]
    history: History
    primary: bool = True  # False in the non-writing processes of a distributed run
    signal: int | None = None  # SIGINT / SIGTERM that arrived after the last round: the caller should stop


def default_out_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg["output.dir"] or f"runs/{cfg.name}")


def check_out_dir(rd: RunDir, *, resume: bool, overwrite: bool) -> str:
    """Refuse to clobber or to resume what is not there; returns the directory's status."""
    status = rd.status()
    where = str(rd.path)
    if resume and overwrite:
        raise FedriskError(
            "--resume and --overwrite exclude each other: resume continues a run, overwrite starts again"
        )
    if resume:
        if status == "finished":
            raise FedriskError(f"{where} holds a finished run; nothing to resume (use --overwrite to run it again)")
        if status != "checkpointed":
            raise FedriskError(
                f"{where} holds no checkpoint ({rd.checkpoint.name}); nothing to resume - "
                "start the run without --resume"
            )
        return status
    if status == "finished" and not overwrite:
        raise FedriskError(
            f"{where} already holds a finished run; choose another --out or pass --overwrite to replace it"
        )
    if status == "checkpointed" and not overwrite:
        raise FedriskError(
            f"{where} holds an interrupted run with a checkpoint; "
            "continue it with --resume or start again with --overwrite"
        )
    if status == "started" and not overwrite:
        raise FedriskError(f"{where} holds an unfinished run without a checkpoint; pass --overwrite to start again")
    return status


def run_experiment(
    cfg: ExperimentConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: str = "auto",
    stream: TextIO | None = None,
    label: str = "",
    seed: int | None = None,
    executor: Executor | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """Run ``cfg`` into ``out`` (default ``output.dir`` or ``runs/<config name>``).

    Args:
        cfg: a validated config.
        out: the run directory.
        resume: continue from ``out``'s checkpoint (the config must match the checkpoint's).
        overwrite: replace a run already in ``out``.
        progress: ``"auto"``, ``"bar"``, ``"plain"`` or ``"none"``.
        stream: where progress goes (default standard error).
        label: a prefix for the progress line.
        seed: the run seed (default ``run.seed`` / the single entry of ``run.seeds``).
        executor: an executor object instead of ``run.executor`` (e.g. fedrisk.deploy's Flower executor).
        callbacks: more callbacks, called after the runner's own (``fedrisk tune`` reports each evaluation to
            Optuna and stops a pruned trial by raising from ``on_evaluation``).

    Raises:
        FedriskError: bad input (the directory, the checkpoint, the config).
        RunInterrupted: SIGINT / SIGTERM; the checkpoint was written.
    """
    seed = run_seed(cfg) if seed is None else seed
    if cfg["run.seeds"] or cfg["run.seed"] != seed:
        cfg = cfg.with_overrides({"run.seed": seed, "run.seeds": []})
    rd = RunDir(out if out is not None else default_out_dir(cfg))
    executor = make_executor(executor if executor is not None else cfg["run.executor"])
    # the run directory is decided (and the checkpoint read) once, by the primary process
    ckpt = executor.run_on_primary(lambda: _prepare_dir(rd, cfg, resume=resume, overwrite=overwrite))

    threads_before = torch.get_num_threads()
    if cfg["run.threads"]:
        torch.set_num_threads(cfg["run.threads"])
    show = Progress(cfg["run.rounds"], mode=progress if executor.is_primary else "none", stream=stream, label=label)
    try:
        with SignalGuard(stream=show.stream if show.mode != "none" else None, newline=show.mode == "bar") as guard:
            return _run(cfg, rd, ckpt, seed, executor, show, guard, callbacks)
    finally:
        torch.set_num_threads(threads_before)


def _prepare_dir(rd: RunDir, cfg: ExperimentConfig, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run directory; clear it for --overwrite; return the checkpoint for --resume."""
    check_out_dir(rd, resume=resume, overwrite=overwrite)
    if not resume:
        if overwrite:
            rd.clear()
        return None
    ckpt = load_checkpoint(rd.checkpoint, rd.client_states)
    # a checkpoint holds every client's state whatever wrote it: it resumes under any executor
    diffs = [d for d in diff_configs(ckpt["config"], cfg.semantic()) if d[0] not in RESUMABLE_ACROSS]
    if diffs:
        lines = ", ".join(f"{k} (checkpoint: {_show(a)}, now: {_show(b)})" for k, a, b in diffs)
        raise FedriskError(
            f"the config differs from the checkpoint's in {rd.path}: {lines}. Resume with the same config "
            f"(e.g. {rd.config}) or start again with --overwrite"
        )
    return ckpt


def _run(
    cfg: ExperimentConfig,
    rd: RunDir,
    ckpt: dict[str, Any] | None,
    seed: int,
    executor: Executor,
    show: Progress,
    guard: SignalGuard,
    user_callbacks: Sequence[Callback] = (),
) -> RunResult:
    built = build_simulation(cfg, seed, executor=executor, client_store=rd.client_states)
    sim = built.simulation
    primary = executor.is_primary
    if primary:
        rd.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(rd.config, cfg.to_toml())
        _write_partition(rd, sim)

    history = History()
    elapsed_before = 0.0
    if ckpt is not None:
        sim.load_state_dict(ckpt["simulation"])
        history.records = [dict(r) for r in ckpt["history"]]
        elapsed_before = float(ckpt["elapsed"])
        unpack_global_rng(ckpt["rng"])
    if primary:
        write_jsonl(rd.metrics, history.records)

    rounds = cfg["run.rounds"]
    show.elapsed_before = elapsed_before
    metrics = cfg["run.metrics"] or resolve_metrics(sim, None)
    select_key = check_select_by(cfg["run.select_by"], cfg.section("data"), metrics)
    splits = list(cfg["run.splits"])
    if select_key.startswith("validation_") and not select_key.startswith("validation_personal_"):
        splits += [] if "validation" in splits else ["validation"]  # selection needs it evaluated
    check_client_splits(sim.federation, metrics, splits)
    work = WorkMeter()
    selector = Selector(select_key, rd.path / SELECTED_MODEL, primary) if select_key else None
    if ckpt is not None:
        work.load_state_dict(ckpt.get("work"), history.records)
        if selector is not None:
            selector.load_state_dict(ckpt.get("selected"), history.records)

    def extra() -> dict[str, Any]:
        out: dict[str, Any] = {"work": work.state_dict()}
        if selector is not None:
            out["selected"] = selector.state_dict()
        return out

    checkpointer = Checkpointer(
        rd.checkpoint,
        cfg.semantic(),
        rounds,
        cfg["run.eval_every"],
        cfg["run.checkpoint_every"],
        guard,
        history,
        show.elapsed,
        agree=executor.any_rank,
        seconds=cfg["run.checkpoint_seconds"],
        extra=extra,
    )
    callbacks: list[Callback] = [TrainMetrics(), work]
    if selector is not None:
        callbacks.append(selector)
    tracking = None
    if primary:
        callbacks.append(MetricsWriter(rd.metrics))
        from fedrisk.experiment.personal_outputs import personal_callbacks  # clients.csv, alpha.csv

        callbacks += personal_callbacks(rd.path, stream=None if show.mode == "none" else show.stream)
        from fedrisk.experiment.game_samples import game_callbacks  # a GAN's samples over the rounds

        callbacks += game_callbacks(sim, rd.path, cfg["output.plots"])
        tracking = open_tracking(cfg, rd.path, seed=seed, resume_round=None if ckpt is None else sim.round)
        if tracking is not None:  # TensorBoard / MLflow ([output] tensorboard, mlflow)
            callbacks.append(tracking)
    callbacks += [show, checkpointer, *user_callbacks]
    finished = False
    (rd.path / FAILURE).unlink(missing_ok=True)
    try:
        run_simulation(
            sim,
            rounds,
            eval_every=cfg["run.eval_every"],
            eval_at_start=cfg["run.eval_at_start"],
            metrics=metrics,
            splits=splits,
            callbacks=callbacks,
            history=history,
            elapsed_before=elapsed_before,
        )
        finished = True
    except _Stop as stop:
        show.close()
        raise RunInterrupted(stop.signum, sim.round, rd) from None
    except FedriskError as exc:  # e.g. NaN/inf replies that the aggregation refuses: reports show it
        if primary:
            write_json(rd.path / FAILURE, {"round": sim.round, "error": str(exc), "type": type(exc).__name__})
        raise
    finally:
        if tracking is not None:
            tracking.close(finished)
    checkpointer.save(sim)
    summary = make_summary(cfg, built.resolved, sim, history, select_key)
    if primary:
        params = sim.algorithm.global_params(sim.server_state)
        if params is not None:  # what run.init_from of a later run reads
            atomic_torch_save(params, rd.path / MODEL_FILE)
        write_json(rd.summary, summary)
        if cfg["output.plots"] and history.records:
            from fedrisk.experiment.plots import plot_run

            plot_run(load_run(rd.path), rd.plots)
    return RunResult(rd.path, summary, history, primary, guard.signum)


def _show(value: Any) -> str:
    from fedrisk.experiment.schema import format_value

    return "(absent)" if not isinstance(value, (str, int, float, bool, list, dict)) else format_value(value)


def _write_partition(rd: RunDir, sim: Simulation) -> None:
    fed = sim.federation
    report: dict[str, Any] = {"name": fed.name, "client_sizes": list(fed.client_sizes)}
    if all(not c.y.is_floating_point() for c in fed.clients):
        part = fed.partition_report()
        report.update(part.to_dict())
        atomic_write_text(rd.partition_md, f"# Partition: {fed.name}\n\n{part.to_markdown()}\n")
    report["info"] = fed.info
    atomic_write_text(rd.partition_json, json.dumps(report, indent=2, default=str) + "\n")


def best_values(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per evaluation metric: the best value over the evaluations and its round (min for
    losses).  Training metrics (``train_*``) have no "best" and are left out."""
    best: dict[str, dict[str, Any]] = {}
    for r in records:
        for k, v in r.items():
            if k in RECORD_KEYS or k.startswith("train_") or not isinstance(v, (int, float)) or v != v:
                continue
            lower = lower_is_better(k)
            cur = best.get(k)
            if cur is None or (v < cur["value"] if lower else v > cur["value"]):
                best[k] = {"value": v, "round": r["round"]}
    return best


def make_summary(
    cfg: ExperimentConfig,
    resolved: Mapping[str, Any],
    sim: Simulation,
    history: History,
    select_key: str = "",
) -> dict[str, Any]:
    last = history.records[-1] if history.records else {}
    chosen = selected_record(history.records, select_key)
    selected = None
    if chosen is not None:
        selected = {
            "round": chosen["round"],
            "selected_by": select_key,
            "value": chosen.get(record_key(chosen, select_key)),
            "metrics": {k: v for k, v in chosen.items() if k not in RECORD_KEYS},
            "budget": budget(chosen),
        }
    return {
        "status": "finished",
        "fedrisk_version": fedrisk.__version__,
        "algorithm": cfg["algorithm.name"],
        "dataset": cfg["data.dataset"],
        "seed": resolved["seed"],
        "rounds": sim.round,
        "evaluations": len(history.records),
        "final": {k: v for k, v in last.items() if k not in RECORD_KEYS},
        "selected": selected,  # the round chosen on validation (run.select_by); None without selection
        "budget": budget(last),
        # the best of every metric over the rounds, test included: an oracle, not a result
        "oracle": best_values(history.records),
        "oracle_round": best_round(history.records),  # personalised runs: every client statistic at one round
        "bytes_down": sim.ledger.total_down,
        "bytes_up": sim.ledger.total_up,
        "wall_time": last.get("wall_time"),
        "resolved": dict(resolved),
    }
