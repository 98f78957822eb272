"""A federated run as explicit state: the server state, every client's state, the round and
the communication ledger.  :meth:`Simulation.step` runs one round; ``state_dict`` /
``load_state_dict`` checkpoint and restore it exactly.

Example:
    >>> import torch
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(20)), s.subset(range(20, 40))], num_classes=2)
    >>> model = FunctionalModel(build_model("logreg", (4,), 2))
    >>> sim = Simulation(FedAvg(model=model, loss=cross_entropy, lr=0.1, local_steps=2, batch_size=5), fed, seed=0)
    >>> report = sim.step()
    >>> report.round, report.clients, sim.round
    (0, [0, 1], 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedrisk.algorithms.base import Algorithm, FedInfo, LocalData, RoundContext
from fedrisk.attacks.base import Attack
from fedrisk.data.federation import Federation, Samples
from fedrisk.data.validate import check_federation
from fedrisk.errors import FedriskError, unknown_name
from fedrisk.rng import generator, server_generator
from fedrisk.runtime.device import resolve_device, to_device
from fedrisk.runtime.executor import ClientFailure, Executor
from fedrisk.runtime.ledger import CommLedger
from fedrisk.runtime.norm_stats import with_norm_stats
from fedrisk.tree import Tree, tree_all_finite, tree_nbytes, tree_to

FAILURE_POLICIES = ("raise", "skip")


def fed_info(federation: Federation) -> FedInfo:
    counts: tuple[tuple[int, ...], ...] = ()
    if all(not c.y.is_floating_point() for c in federation.clients):
        counts = tuple(tuple(r) for r in federation.class_counts())
    return FedInfo(
        num_clients=federation.num_clients,
        client_sizes=federation.client_sizes,
        num_classes=federation.num_classes,
        class_counts=counts,
    )


def local_data(samples: Samples) -> LocalData:
    return LocalData(samples.x, samples.y, torch.tensor(len(samples)), dict(samples.attrs))


def _data_device(federation: Federation) -> torch.device:
    return federation.clients[0].x.device if federation.clients else torch.device("cpu")


def make_executor(executor: Executor | str) -> Executor:
    if isinstance(executor, Executor):
        return executor
    from fedrisk.runtime import EXECUTORS

    return EXECUTORS.get(executor)()


@dataclass
class RoundReport:
    """What happened in one round: who took part, bytes moved, mean training metrics."""

    round: int
    kind: str
    clients: list[int]
    bytes_down: int
    bytes_up: int
    train_metrics: dict[str, float] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


class Simulation:
    """Runs ``algorithm`` on ``federation`` round by round.

    Args:
        algorithm: the federated algorithm (hyper-parameters, model, loss).
        federation: the clients' data.
        seed: the root of every random stream of the run.
        executor: ``"sequential"``, ``"vectorized"``, ``"distributed"`` or an Executor.
        dtype: floating dtype of data and parameters (float64 for exactness tests).
        attack: optional Byzantine attack applied to the replies of ``byzantine`` clients.
        byzantine: ids of the Byzantine clients.
        on_client_failure: ``"raise"`` (default) stops the run naming the client when it raises
            or replies with NaN/inf; ``"skip"`` drops that client's reply for the round.
        client_store: a folder for the client states (one file per client, see
            :mod:`fedrisk.runtime.client_store`); default: in memory.
        min_replies: the fewest valid replies a round needs; a round with fewer stops the run
            with a :class:`~fedrisk.runtime.executor.ClientFailure` before anything is updated
            (the round is not counted as completed).
        init_params: initial model parameters (default: ``algorithm.init_params``).
        device: where the data, parameters and server / client states live: None (default:
            leave the federation where it is, the CPU for a built one), ``"cpu"``, ``"cuda"``,
            ``"cuda:N"``, ``"auto"`` (CUDA when available) or a :class:`torch.device` (see
            :mod:`fedrisk.runtime.device`).  Random draws still come from the CPU generators of
            :mod:`fedrisk.rng` (the same streams on every device) and are moved to the device.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        federation: Federation,
        *,
        seed: int = 0,
        executor: Executor | str = "sequential",
        dtype: torch.dtype = torch.float32,
        attack: Attack | None = None,
        byzantine: Sequence[int] = (),
        on_client_failure: str = "raise",
        init_params: Tree | None = None,
        min_replies: int = 1,
        client_store: str | Path | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        if on_client_failure not in FAILURE_POLICIES:
            raise unknown_name("on_client_failure policy", on_client_failure, FAILURE_POLICIES)
        if int(min_replies) < 1:
            raise FedriskError(f"min_replies = {min_replies} is out of range; allowed: an integer >= 1")
        self.min_replies = int(min_replies)
        algorithm = with_norm_stats(algorithm)  # BatchNorm running statistics as federated state
        bad = [k for k in byzantine if not 0 <= k < federation.num_clients]
        if bad:
            raise FedriskError(f"byzantine client ids {bad} out of range [0, {federation.num_clients - 1}]")
        self.algorithm = algorithm
        if attack is not None:  # data attacks (label flipping) change the Byzantine clients' data once
            federation = attack.poison(federation, sorted(set(int(k) for k in byzantine)))
        target = None if device is None else resolve_device(device)
        self.federation = federation.to(dtype, target)
        # tensors made on the CPU by an algorithm (a configure / aggregate / client_update that
        # builds a counter or an index from a generator) are moved here after each step
        self.device: torch.device = target if target is not None else _data_device(self.federation)
        self._move = self.device.type != "cpu"
        check_federation(self.federation)
        self.seed = int(seed)
        self.dtype = dtype
        self.attack = attack
        self.byzantine = sorted(set(int(k) for k in byzantine))
        self.on_client_failure = on_client_failure
        self.info = fed_info(self.federation)
        algorithm.check(self.info)
        self.data = [local_data(s) for s in self.federation.clients]
        algorithm.check_data(self.info, self.data)
        if attack is not None:  # adaptive attacks read the defence; every attack checks the breakdown point
            attack.prepare(algorithm, self.info, self.byzantine)
        self.executor = make_executor(executor)
        self.executor.prepare(algorithm, self.data)
        ctx = RoundContext(0, self.info, "init")
        if init_params is None:
            params = algorithm.init_params(generator(seed, "init"))
        else:
            model = getattr(algorithm, "model", None)
            if model is not None and hasattr(model, "init_params"):  # names and shapes checked
                stats = getattr(model, "stat_names", None) or ()
                check_init_params(init_params, algorithm.init_params(generator(seed, "init")), optional=stats)
            params = init_params
        params = tree_to(params, dtype, self.device if self._move else None)
        server = algorithm.init_server(ctx, params, server_generator(seed, -1, "init"))
        self.server_state: Tree = self._here(server)
        self.client_states: MutableMapping[int, Tree]
        if client_store is None:
            self.client_states = {
                k: self._here(algorithm.init_client(ctx, k, params)) for k in range(self.info.num_clients)
            }
        else:  # one file per client, written when the client first takes part
            from fedrisk.runtime.client_store import DiskClientStates

            initial = lambda k: self._here(algorithm.init_client(ctx, k, params))  # noqa: E731
            self.client_states = DiskClientStates(client_store, self.info.num_clients, initial, self.device)
        self.round = 0
        self.ledger = CommLedger()
        self.client_scores: list[dict[str, float]] = []  # per-client values of the latest evaluation

    # -- one round ----------------------------------------------------------------------
    def step(self) -> RoundReport:
        alg, r = self.algorithm, self.round
        plan = alg.configure(RoundContext(r, self.info), self.server_state, server_generator(self.seed, r, "configure"))
        ctx = RoundContext(r, self.info, plan.kind)
        if self._move:  # e.g. PERM's shuffle, drawn on the CPU, handed to the clients
            plan = dataclasses.replace(
                plan,
                broadcast=self._here(plan.broadcast),
                per_client=None if plan.per_client is None else self._here(plan.per_client),
            )
        out = self.executor.run_round(alg, ctx, plan, self.client_states, self.data, self.seed, self.on_client_failure)
        replies = out.replies
        if len(replies.clients) < self.min_replies:
            raise ClientFailure(
                f"round {r} ({alg.name}): {len(replies.clients)} of {len(plan.clients)} clients replied, fewer than "
                f"min_replies = {self.min_replies} (failed: {out.failed}); the round was not applied and the run "
                "stops here (its last checkpoint is intact)"
            )
        if self.attack is not None:
            byz = [k for k in self.byzantine if k in replies.clients]
            if byz:
                replies = self.attack.apply(ctx, replies, byz, server_generator(self.seed, r, "attack"))
        down = self._bytes_down(plan, replies.clients)
        up = replies.nbytes()
        new_server = alg.aggregate(ctx, self.server_state, plan, replies, server_generator(self.seed, r, "aggregate"))
        if not tree_all_finite(new_server):
            forged = [k for k in self.byzantine if k in replies.clients and not tree_all_finite(replies.as_dict()[k])]
            if forged:
                raise ClientFailure(
                    f"the server state became NaN/inf in round {r} ({alg.name}): the Byzantine clients {forged} sent "
                    "NaN/inf replies that the aggregation let through; use a robust aggregator with "
                    "nonfinite = 'exclude' (or the default 'raise')"
                )
            raise ClientFailure(
                f"the server state became NaN/inf in round {r} ({alg.name}); the run diverged - "
                "lower the learning rate(s) or check the data"
            )
        self.server_state = self._here(new_server)
        self.client_states.update(self._here(out.states) if self._move else out.states)
        self.ledger.record(r, down, up)
        self.round += 1
        return RoundReport(
            round=r,
            kind=plan.kind,
            clients=list(replies.clients),
            bytes_down=sum(down.values()),
            bytes_up=sum(up.values()),
            train_metrics=_mean_metrics(out.metrics),
            failed=out.failed,
        )

    def _here(self, tree: Any) -> Any:
        """``tree`` on the simulation's device (unchanged on the CPU)."""
        return to_device(tree, self.device) if self._move else tree

    def _bytes_down(self, plan: Any, clients: Sequence[int]) -> dict[int, int]:
        if plan.per_client is None:
            b = tree_nbytes(dict(plan.broadcast))
            return {k: b for k in plan.clients}
        return {k: tree_nbytes(plan.payload(k)) for k in plan.clients}

    # -- checkpointing ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run's state.  With a disk store, ``client_states`` is a snapshot reference
        (:meth:`DiskClientStates.snapshot`: the states are linked, not loaded)."""
        from fedrisk.runtime.client_store import DiskClientStates

        if isinstance(self.client_states, DiskClientStates):
            states: Any = self.client_states.snapshot()
        else:
            states = self.executor.collect_states(self.client_states)
        return {
            "round": self.round,
            "seed": self.seed,
            "server_state": self.server_state,
            "client_states": states,
            "ledger": self.ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed:
            raise FedriskError(f"checkpoint was made with seed {state['seed']}, this run uses seed {self.seed}")
        self.round = int(state["round"])
        self.server_state = self._here(state["server_state"])  # checkpoints load on the CPU
        from fedrisk.runtime.client_store import DiskClientStates, is_snapshot_ref

        if is_snapshot_ref(state["client_states"]):
            if not isinstance(self.client_states, DiskClientStates):
                raise FedriskError(
                    "the checkpoint keeps its client states on disk (run.client_states = 'disk'); resume it "
                    "with client states on disk, in the run directory that wrote it"
                )
            self.client_states.restore(state["client_states"])
        else:
            states = {int(k): self._here(v) for k, v in state["client_states"].items()}
            if isinstance(self.client_states, dict):
                self.client_states = states
            else:  # a disk store keeps its folder
                self.client_states.update(states)
        self.ledger.load_state_dict(state["ledger"])


def check_init_params(given: Any, expected: Any, optional: Sequence[str] = (), path: str = "") -> None:
    """Raise a one-line FedriskError naming the first tensor of ``given`` whose name or shape
    differs from ``expected`` (the algorithm's own initial parameters); names in ``optional``
    (BatchNorm running statistics) may be left out.

    Example:
        >>> check_init_params({"w": torch.zeros(2, 3)}, {"w": torch.zeros(3, 2)})
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: init_params: tensor 'w' has shape [2, 3]; the model's is [3, 2]
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(given, torch.Tensor):
            raise FedriskError(f"init_params: {path!r} is a {type(given).__name__}; the model has a tensor there")
        if given.shape != expected.shape:
            raise FedriskError(
                f"init_params: tensor {path!r} has shape {list(given.shape)}; the model's is {list(expected.shape)}"
            )
        return
    if isinstance(expected, dict):
        if not isinstance(given, dict):
            raise FedriskError(f"init_params: {path or 'the tree'} is a {type(given).__name__}; expected a dict")
        extra = sorted(set(given) - set(expected))
        missing = sorted(k for k in set(expected) - set(given) if k not in optional)
        if extra or missing:
            where = f" in {path!r}" if path else ""
            raise FedriskError(f"init_params{where}: unknown tensors {extra[:4]}, missing tensors {missing[:4]}")
        for k, v in given.items():
            check_init_params(v, expected[k], optional, f"{path}.{k}" if path else str(k))


def _mean_metrics(metrics: dict[int, dict[str, torch.Tensor]]) -> dict[str, float]:
    if not metrics:
        return {}
    keys = set().union(*(m.keys() for m in metrics.values()))
    out = {}
    for key in sorted(keys):
        vals = [m[key] for m in metrics.values() if key in m]
        same_kind = len({(v.dtype, v.device) for v in vals if isinstance(v, torch.Tensor)}) == 1
        if same_kind and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals):
            floats = torch.stack(vals).tolist()  # the same numbers as float(v), in one call
        else:
            floats = [float(v) for v in vals]
        out[key] = sum(floats) / len(floats)
    return out
