"""Tiny federated runs shared by the distributed equivalence test and its torchrun worker.

Each case is built identically in every process (the test process runs it with the sequential
executor; every rank of ``distributed_worker.py`` with the distributed one) and summarised by
:func:`run_case` into plain data (final server and client states, the evaluation history and
the per-round reports) that :func:`assert_same` compares.

Cases:

* ``alg/<name>`` — every algorithm of ``fedrisk.algorithms.ALGORITHMS`` that can be built from
  a model and a loss (their other hyper-parameters keep their defaults except a few small
  ones), float64, 3 rounds; ``alg/<name>/partial`` with ``clients_per_round = 3`` where the
  algorithm has that field (ranks with no client in a round contribute zeros to sums).
  An algorithm whose ``check`` refuses the 7-client federation runs on the pooled one-client
  federation (``centralized``): the distributed executor must refuse it (world size > clients).
* ``toy/shuffle`` — :class:`Shuffle` below: per-client payloads drawn by a server-side
  permutation (PERM's shuffle), persistent tensor client states, a gather-kind median in
  "robust" rounds chosen from the server state, an integer reply leaf, partial participation.
* ``toy/shuffle-skip`` — the same with client 1 replying NaN in round 1 under
  ``on_client_failure="skip"``.
* ``toy/shuffle-raise`` — the same under ``on_client_failure="raise"``: the run stops.
* ``fedavg/attack`` — FedAvg with an omniscient attack (:class:`NegatedMean`, reads
  ``Replies.as_dict``) on clients 0 and 4.
* ``fedavg/float32`` — FedAvg in float32 (compared to 1e-5 relative).
* ``fedavg/resume`` — FedAvg, 2 rounds, checkpoint, a fresh Simulation loads it, 2 more rounds
  (compared with an uninterrupted 4-round run).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms import ALGORITHMS
from fedrisk.algorithms.base import Algorithm, ClientResult, LocalData, RoundContext, RoundPlan, sample_clients
from fedrisk.algorithms.fedavg import FedAvg
from fedrisk.algorithms.local import sample_batches, sgd_steps, supervised_objective
from fedrisk.api import Callback, run_simulation
from fedrisk.attacks.base import Attack
from fedrisk.data.federation import Federation, Samples
from fedrisk.errors import FedriskError
from fedrisk.models import FunctionalModel, build_model
from fedrisk.objectives.supervised import cross_entropy
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.simulation import Simulation, fed_info
from fedrisk.tree import Tree, tensor_leaves, tree_map

NUM_CLIENTS = 7
FEATURES = 4
CLASSES = 3
METRICS = ("accuracy", "worst_class_accuracy")


def federation(num_clients: int = NUM_CLIENTS, poison_client: int | None = None) -> Federation:
    """Clients of 6..12 rows (unequal sizes), 3 classes, per-client test splits, a test set.

    ``attrs["poison"]`` is NaN on every row of ``poison_client`` and 1 elsewhere.
    """
    g = torch.Generator().manual_seed(1234)
    centers = torch.randn(CLASSES, FEATURES, generator=g, dtype=torch.float64) * 2

    def samples(n: int, poison: bool = False) -> Samples:
        y = torch.randint(0, CLASSES, (n,), generator=g)
        x = centers[y] + torch.randn(n, FEATURES, generator=g, dtype=torch.float64)
        return Samples(x, y, {"poison": torch.full((n,), math.nan if poison else 1.0, dtype=torch.float64)})

    clients = [samples(6 + k % 7, k == poison_client) for k in range(num_clients)]
    tests = [samples(5) for _ in range(num_clients)]
    return Federation("gauss", clients, CLASSES, client_tests=tests, test=samples(40))


def model() -> FunctionalModel:
    return FunctionalModel(build_model("mlp", (FEATURES,), CLASSES, hidden=(5,)))


# -- a toy algorithm covering what FedAvg does not -----------------------------------------
def _median(replies: Replies, key: str) -> Tree:
    """Coordinate-wise median of the replies (a gather-kind aggregator)."""
    return tree_map(lambda x: x.median(dim=0).values, replies.stacked(key))


@dataclass(frozen=True)
class Shuffle(Algorithm):
    """PERM-like toy: the server keeps one vector per client slot and hands slot ``perm[k]`` to
    client ``k`` (a fresh permutation each round); replies go back to their slots (gather).
    Every third round (decided from the server state's counter) aggregates the model with a
    coordinate-wise median (gather kind) instead of the weighted mean (sum kind)."""

    name: ClassVar[str] = "toy_shuffle"
    model: Any
    lr: float = 0.1
    local_steps: int = 2
    batch_size: int = 4
    clients_per_round: int = 5

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        slots = torch.randn(ctx.fed.num_clients, 3, generator=gen).to(tensor_leaves(params)[0].dtype)
        return {"params": params, "slots": slots, "rounds": torch.zeros((), dtype=torch.int64)}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"visits": torch.zeros((), dtype=torch.int64), "trace": torch.zeros(3, dtype=tensor_leaves(params)[0].dtype)}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        perm = torch.randperm(ctx.fed.num_clients, generator=gen).tolist()
        kind = "robust" if int(server_state["rounds"]) % 3 == 2 else "train"
        per_client = {k: {"slot": server_state["slots"][perm[k]], "index": torch.tensor(perm[k])} for k in clients}
        return RoundPlan(clients, {"params": server_state["params"]}, per_client, kind)

    def draw(self, ctx: RoundContext, client: int, num_samples: int, gen: torch.Generator) -> Tree:
        return {"batches": sample_batches(gen, num_samples, self.local_steps, self.batch_size)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        objective = supervised_objective(self.model.apply, cross_entropy)
        params, loss = sgd_steps(objective, payload["params"], data, draws["batches"], self.lr)
        scale = data.attrs["poison"][0] if ctx.round == 1 else 1.0  # NaN for the poisoned client in round 1
        slot = payload["slot"] * 0.5 + data.x[0, :3] * scale
        reply = {"params": params, "slot": slot, "ones": torch.ones((), dtype=torch.int64)}
        state = {"visits": state["visits"] + 1, "trace": state["trace"] + slot}
        return ClientResult(reply, state, {"loss": loss, "slot_norm": slot.norm()})

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        if ctx.kind == "robust":
            params = _median(replies, "params")
        else:
            params = replies.mean("params", ctx.fed.size_weights(replies.clients))
        count = replies.sum("ones")  # integer sum: the number of replies
        assert count.dtype == torch.int64 and int(count) == len(replies.clients), count
        slots = server_state["slots"].clone()
        for k, slot in zip(replies.clients, replies.gather("slot")):
            slots[int(plan.per_client[k]["index"])] = slot
        return {"params": params, "slots": slots, "rounds": server_state["rounds"] + 1}

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["params"]


class NegatedMean(Attack):
    """Omniscient attack: Byzantine clients reply minus the honest clients' mean."""

    name = "negated_mean"

    def apply(self, ctx: RoundContext, replies: Replies, byzantine, gen: torch.Generator) -> Replies:
        everyone = replies.as_dict()
        honest = InMemoryReplies({k: v for k, v in everyone.items() if k not in byzantine})
        bad = tree_map(lambda x: -x, honest.mean("params"))
        return InMemoryReplies({k: ({"params": bad} if k in byzantine else v) for k, v in everyone.items()})


# -- cases ---------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    build: Callable[[], tuple[Algorithm, Federation, dict[str, Any]]]
    rounds: int = 3
    dtype: torch.dtype = torch.float64
    resume_at: int | None = None
    skip: str = ""


def _unbuildable() -> tuple[Algorithm, Federation, dict[str, Any]]:
    raise AssertionError("a skipped case is never built")


SMALL = {"lr": 0.1, "local_steps": 2, "batch_size": 4}


def generic_algorithm(name: str, **overrides: Any) -> Algorithm:
    """``ALGORITHMS[name]`` with a small MLP and cross-entropy; FedriskError if it needs more."""
    cls = ALGORITHMS.get(name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {"model": model(), "loss": cross_entropy}
    kwargs.update({k: v for k, v in {**SMALL, **overrides}.items() if k in fields})
    kwargs = {k: v for k, v in kwargs.items() if k in fields}
    missing = [
        f.name
        for f in fields.values()
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise FedriskError(f"cannot build {name} generically: required fields {missing}")
    return cls(**kwargs)


def _needs_pooling(alg: Algorithm) -> bool:
    """True when ``alg`` refuses the 7-client federation (centralised training wants one client)."""
    try:
        alg.check(fed_info(federation()))
    except FedriskError:
        return True
    return False


def _algorithm_case(name: str, partial: bool) -> Case:
    def build() -> tuple[Algorithm, Federation, dict[str, Any]]:
        alg = generic_algorithm(name, **({"clients_per_round": 3} if partial else {}))
        fed = federation()
        if _needs_pooling(alg):
            fed = Federation(fed.name, [fed.pooled()], fed.num_classes, test=fed.test)
        return alg, fed, {}

    return Case(f"alg/{name}" + ("/partial" if partial else ""), build)


def cases() -> list[Case]:
    out: list[Case] = []
    for name in ALGORITHMS.names():
        try:
            alg = generic_algorithm(name)
        except FedriskError as exc:
            out.append(Case(f"alg/{name}", _unbuildable, skip=str(exc)))
            continue
        out.append(_algorithm_case(name, partial=False))
        if "clients_per_round" in {f.name for f in dataclasses.fields(alg)} and not _needs_pooling(alg):
            out.append(_algorithm_case(name, partial=True))
    out.append(Case("toy/shuffle", lambda: (Shuffle(model()), federation(), {}), rounds=4))
    out.append(
        Case(
            "toy/shuffle-skip",
            lambda: (Shuffle(model(), clients_per_round=NUM_CLIENTS), federation(poison_client=1), {"on_client_failure": "skip"}),
            rounds=3,
        )
    )
    out.append(
        Case(
            "toy/shuffle-raise",  # every rank must raise, naming the client, instead of waiting forever
            lambda: (Shuffle(model(), clients_per_round=NUM_CLIENTS), federation(poison_client=1), {}),
            rounds=3,
        )
    )
    fedavg = lambda: FedAvg(model=model(), loss=cross_entropy, **SMALL)  # noqa: E731
    out.append(Case("fedavg/attack", lambda: (fedavg(), federation(), {"attack": NegatedMean(), "byzantine": [0, 4]})))
    out.append(Case("fedavg/float32", lambda: (fedavg(), federation(), {}), dtype=torch.float32))
    out.append(Case("fedavg/resume", lambda: (fedavg(), federation(), {}), rounds=4, resume_at=2))
    return out


# -- running and comparing -----------------------------------------------------------------
class _Reports(Callback):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_round_end(self, sim: Simulation, report: Any) -> None:
        self.rows.append(dataclasses.asdict(report))


def run_case(
    case: Case, executor: Callable[[], Executor | str], checkpoint: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Run ``case`` and summarise it.  ``checkpoint(state) -> state`` stands for writing the
    checkpoint (rank 0) and reading it back (every rank) in a resumed run."""
    alg, fed, kwargs = case.build()
    reports = _Reports()

    def new_sim() -> Simulation:
        return Simulation(alg, fed, seed=7, executor=executor(), dtype=case.dtype, **kwargs)

    sim = new_sim()
    if case.resume_at is not None:
        history = run_simulation(sim, case.resume_at, metrics=METRICS, callbacks=[reports])
        state = sim.state_dict()
        state = checkpoint(state) if checkpoint is not None else state
        sim = new_sim()
        sim.load_state_dict(state)
        history = run_simulation(sim, case.rounds, metrics=METRICS, callbacks=[reports], history=history)
    else:
        history = run_simulation(sim, case.rounds, metrics=METRICS, callbacks=[reports])
    records = [{k: v for k, v in r.items() if k != "wall_time"} for r in history.records]
    return {
        "server_state": sim.server_state,
        "client_states": dict(sorted(sim.client_states.items())),
        "records": records,
        "reports": reports.rows,
        "ledger": sim.ledger.state_dict(),
    }


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-9, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}


def assert_same(a: Any, b: Any, rtol: float, atol: float, path: str = "") -> None:
    """Tensors and floats equal to the tolerance, everything else exactly."""
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor), f"{path}: {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"{path}: {a} vs {b}"
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and list(a) == list(b), f"{path}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_same(a[k], b[k], rtol, atol, f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, rtol, atol, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"
