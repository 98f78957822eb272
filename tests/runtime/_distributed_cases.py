"""Tiny federated runs shared by the distributed equivalence test and its torchrun worker.

Each case is built identically in every process (the test process runs it with the sequential
executor; every rank of ``distributed_worker.py`` with the distributed one) and summarised by
:func:`run_case` into plain data (final server and client states, the evaluation history and
the per-round reports) that :func:`assert_same` compares.

Cases:

* ``alg/<name>`` — every algorithm of ``fedrisk.algorithms.ALGORITHMS``, built through the
  experiment layer (:func:`fedrisk.experiment.config.resolve_config` +
  :func:`fedrisk.experiment.runner.build_simulation`, so that each gets the model and objective
  a config would give it) on scikit-learn's wine data, 7 clients, an MLP with 8 hidden units,
  float64, 3 rounds, small step counts; a binarised wine (with one model output if needed)
  when the algorithm refuses 3 classes (AUC algorithms), one pooled client when it refuses
  several (centralised training: the distributed executor must then refuse the world size).
  ``alg/<name>/partial`` adds ``clients_per_round = 3`` where the algorithm has that
  hyper-parameter (and runs on several clients).
* ``alg/<name>/<variant>`` — the AUC family through stage boundaries (with the default
  ``stage_iters`` every round of ``alg/<name>`` is a ``train`` round): CODASCA with Alg. 4's
  random stage output, a control-variate reset at every stage end, the margin loss and
  ``η_g = 1.5``; CODASCA with the official code's per-client prox rule and growing windows and
  rounds; CODA with its dual-reset round; a CODASCA run checkpointed and resumed in the middle
  of a stage.
* ``toy/<name>`` — the contract toys of ``tests/conformance/toy_algorithms.py`` (persistent
  client state with partial participation, per-client payloads, a server pool gathered from
  replies, a median aggregator with and without an omniscient attack, round kinds, no
  communication, and client / server failures under both failure policies).
* ``own/shuffle`` — :class:`Shuffle` below: per-client payloads drawn by a server-side
  permutation (PERM's shuffle), tensor client states, a gather-kind median in rounds chosen
  from the server state, an integer reply leaf summed, 2 clients per round (so that some rank
  has no client in a round and contributes zeros to the sums); ``own/shuffle-skip`` /
  ``own/shuffle-raise``: client 1 replies NaN in round 1 (skipped / stopping the run).
* ``faults/<name>`` — SCAFFOLD, CODASCA and local training with clients that raise, miss the
  deadline or reply NaN / inf (``fedrisk.runtime.faults``), skipped.
* ``fedavg/attack`` — FedAvg with an omniscient attack (:class:`NegatedMean`, reads
  ``Replies.as_dict``) on clients 0 and 4.
* ``fedavg/float32`` — FedAvg in float32 (compared to 1e-5 relative).
* ``fedavg/resume`` — FedAvg, 2 rounds, checkpoint, a fresh Simulation loads it, 2 more rounds
  (compared with an uninterrupted 4-round run).
* ``batchnorm/<policy>`` — FedAvg of an MLP with BatchNorm, its running statistics averaged,
  local (FedBN) or frozen (``fedrisk.runtime.norm_stats``); ``batchnorm/resume`` checkpointed.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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
from fedrisk.rng import ClientRNG
from fedrisk.runtime.evaluation import predict
from fedrisk.runtime.executor import Executor
from fedrisk.runtime.simulation import Simulation
from fedrisk.tree import Tree, tensor_leaves, tree_map

NUM_CLIENTS = 7
FEATURES = 4
CLASSES = 3
SEED = 7

Built = tuple[Algorithm, Federation, dict[str, Any]]


def federation(num_clients: int = NUM_CLIENTS, poison_client: int | None = None, classes: int = CLASSES) -> Federation:
    """Clients of 6..12 rows (unequal sizes), Gaussian classes, per-client test splits, a test set.

    ``attrs["poison"]`` is NaN on every row of ``poison_client`` and 1 elsewhere.
    """
    g = torch.Generator().manual_seed(1234)
    centers = torch.randn(classes, FEATURES, generator=g, dtype=torch.float64) * 2

    def samples(n: int, poison: bool = False) -> Samples:
        y = torch.arange(n) % classes  # every class on every client
        x = centers[y] + torch.randn(n, FEATURES, generator=g, dtype=torch.float64)
        return Samples(x, y, {"poison": torch.full((n,), math.nan if poison else 1.0, dtype=torch.float64)})

    clients = [samples(6 + k % 7, k == poison_client) for k in range(num_clients)]
    tests = [samples(6) for _ in range(num_clients)]
    return Federation("gauss", clients, classes, client_tests=tests, test=samples(40))


def model(features: int = FEATURES, outputs: int = CLASSES) -> FunctionalModel:
    return FunctionalModel(build_model("mlp", (features,), outputs, hidden=(5,)))


# -- every registered algorithm, built as a config would build it ---------------------------
SMALL = {"lr": 0.05, "local_steps": 2, "batch_size": 4}
SHORT_RUN = {"fedavg_rounds": 1}  # PERM two-stage: FedAvg in round 0 only, then personalise


def config_algorithm(name: str, partial: bool = False, extra: Mapping[str, Any] | None = None) -> Built:
    """``name`` through the experiment layer on wine (multi-class, else binarised, else pooled);
    ``extra``: more ``[algorithm]`` settings."""
    from fedrisk.experiment.config import algorithm_fields, resolve_config
    from fedrisk.experiment.runner import build_simulation

    hyper = algorithm_fields(ALGORITHMS.get(name)).hyper
    algorithm = {"name": name, **{k: v for k, v in {**SMALL, **SHORT_RUN}.items() if k in hyper}, **(extra or {})}
    if partial:
        algorithm["clients_per_round"] = 3
    # (data, model.num_outputs): multi-class; binarised with one output (AUC algorithms, which
    # refuse several classes at check time and several outputs only when they run); binarised;
    # pooled (centralised training).
    attempts = [
        ({"num_clients": NUM_CLIENTS}, "auto"),
        ({"num_clients": NUM_CLIENTS, "binarize": {}}, 1),
        ({"num_clients": NUM_CLIENTS, "binarize": {}}, "auto"),
    ]
    if not partial:
        attempts += [({"num_clients": 1}, "auto"), ({"num_clients": 1, "binarize": {}}, "auto")]
    errors = []
    for data, outputs in attempts:
        raw = {
            "data": {"dataset": "wine", "client_test_fraction": 0.25, **data},
            "model": {"name": "mlp", "hidden": [8], "num_outputs": outputs},
            "algorithm": algorithm,
            "run": {"dtype": "float64", "seed": SEED, "executor": "sequential"},
        }
        try:
            sim = build_simulation(resolve_config(raw)).simulation
        except FedriskError as exc:
            errors.append(str(exc))
            continue
        return sim.algorithm, sim.federation, {}
    raise FedriskError(f"cannot build {name} on wine: " + " | ".join(errors))


# -- a toy algorithm of our own --------------------------------------------------------------
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
    clients_per_round: int = 2

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        slots = torch.randn(ctx.fed.num_clients, 3, generator=gen).to(tensor_leaves(params)[0].dtype)
        return {"params": params, "slots": slots, "rounds": torch.zeros((), dtype=torch.int64)}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        dtype = tensor_leaves(params)[0].dtype
        return {"visits": torch.zeros((), dtype=torch.int64), "trace": torch.zeros(3, dtype=dtype)}

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = sample_clients(gen, ctx.fed.num_clients, self.clients_per_round)
        perm = torch.randperm(ctx.fed.num_clients, generator=gen).tolist()
        kind = "robust" if int(server_state["rounds"]) % 3 == 2 else "train"
        per_client = {k: {"slot": server_state["slots"][perm[k]], "index": torch.tensor(perm[k])} for k in clients}
        return RoundPlan(clients, {"params": server_state["params"]}, per_client, kind)

    def draw(self, ctx: RoundContext, client: int, num_samples: int, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size)}

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
        count = replies.sum("ones")  # an integer sum: the number of replies
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

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        everyone = replies.as_dict()
        honest = InMemoryReplies({k: v for k, v in everyone.items() if k not in byzantine})
        bad = tree_map(lambda x: -x, honest.mean("params"))
        return InMemoryReplies({k: ({"params": bad} if k in byzantine else v) for k, v in everyone.items()})


# -- the AUC family across stage boundaries ----------------------------------------------------
AUC_STAGES = {"window": 2, "stage_iters": 4}


def _auc_stage_cases() -> list[Case]:
    """Stage ends, CODA's dual reset, Alg. 4's random output, a control-variate reset, growing
    windows, the code's prox rule and a mid-stage resume (rounds 1 and 3 end stages)."""

    def auc(name: str, **extra: Any) -> Callable[[], Built]:
        return lambda: config_algorithm(name, extra={**AUC_STAGES, **extra})

    reset = {"stage_output": "random", "reset_control_variates": True, "auc_loss": "margin", "global_lr": 1.5}
    code = {"stage_output": "last_local_average_ref", "window_growth": 2.0, "lr_decay": 2.0, "rounds_growth": 1.5}
    return [
        Case("alg/codasca/stages-reset", auc("codasca", **reset), rounds=5),
        Case("alg/codasca/stages-code", auc("codasca", **code), rounds=6),
        Case("alg/coda/dual-reset", auc("coda", reset_batch_size=4), rounds=5),
        Case("alg/codasca/resume-mid-stage", auc("codasca", stage_iters=6), rounds=5, resume_at=2),
    ]


# -- the conformance suite's toys -------------------------------------------------------------
def _toys() -> Any:
    """``tests/conformance/toy_algorithms.py`` as a module (None when it is not there)."""
    folder = Path(__file__).resolve().parents[1] / "conformance"
    if not (folder / "toy_algorithms.py").exists():
        return None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    import toy_algorithms

    return toy_algorithms


def toy_federation(num_clients: int = NUM_CLIENTS, features: int = 3) -> Federation:
    """Binary labels, ``features`` columns, sizes 3..9, a global test set (for the toys' ``x @ w``)."""
    g = torch.Generator().manual_seed(5)
    clients = []
    for k in range(num_clients):
        x = torch.randn(3 + k, features, generator=g, dtype=torch.float64) + 0.5 * k
        clients.append(Samples(x, (torch.arange(3 + k) % 2)))
    xt = torch.randn(16, features, generator=g, dtype=torch.float64)
    return Federation("toys", clients, num_classes=2, test=Samples(xt, torch.arange(16) % 2))


def _toy_cases() -> list[Case]:
    T = _toys()
    if T is None:
        return [Case("toy/*", _unbuildable, skip="tests/conformance/toy_algorithms.py is not there")]
    fed = toy_federation
    skip = {"on_client_failure": "skip"}
    return [
        Case("toy/control_counter", lambda: (T.ControlCounter(per_round=3), fed(), {}), rounds=4),
        Case("toy/shuffle", lambda: (T.Shuffle(), fed(), {}), rounds=3),
        Case("toy/score_pool", lambda: (T.ScorePool(), fed(), {}), rounds=3),
        Case("toy/robust", lambda: (T.Robust(aggregator="median"), fed(), {})),
        Case("toy/robust+attack", lambda: (T.Robust(), fed(), {"attack": T.NegativeMean(), "byzantine": [0, 3]})),
        Case("toy/kinds", lambda: (T.Kinds(), fed(), {}), rounds=4),
        Case("toy/silent", lambda: (T.Silent(), fed(), {})),
        Case("toy/faulty-nan-skip", lambda: (T.Faulty(mode="nan_reply", client=4), fed(), skip)),
        Case("toy/faulty-update-skip", lambda: (T.Faulty(mode="raise_in_update", client=2), fed(), skip)),
        Case(
            "toy/faulty-draw-raise",
            lambda: (T.Faulty(mode="raise_in_draw", client=2), fed(), {}),
            raises="client 2 failed in round 1: RuntimeError('injected failure in draw')",
        ),
        Case(
            "toy/faulty-server-nan",
            lambda: (T.Faulty(mode="server_nan"), fed(), skip),
            raises="the server state became NaN/inf in round 1 (faulty)",
        ),
    ]


def faulty(name: str) -> Built:
    """``name`` (as a config builds it) whose clients raise, miss the deadline or reply NaN / inf
    in rounds 0 and 1, under ``on_client_failure = "skip"``."""
    from fedrisk.runtime.faults import Fault, FaultInjected

    alg, fed, _ = config_algorithm(name)
    faults = [Fault(0, 0, "nan"), Fault(1, 0, "raise"), Fault(2, 1, "deadline"), Fault(3, 1, "inf")]
    return FaultInjected(alg, faults), fed, {"on_client_failure": "skip"}


# -- cases -----------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    build: Callable[[], Built]
    rounds: int = 3
    dtype: torch.dtype = torch.float64
    resume_at: int | None = None
    skip: str = ""
    raises: str = ""  # the FedriskError the run must stop with ("" = it must finish)


def _unbuildable() -> Built:
    raise AssertionError("a skipped case is never built")


def cases() -> list[Case]:
    from fedrisk.experiment.config import algorithm_fields

    out: list[Case] = []
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        hyper = algorithm_fields(cls).hyper  # a registered algorithm the config layer cannot read is a bug
        out.append(Case(f"alg/{name}", lambda name=name: config_algorithm(name)))
        # partial participation of one pooled client (centralised training) is not a case
        if "clients_per_round" in hyper and not getattr(cls, "requires_pooled_data", False):
            out.append(Case(f"alg/{name}/partial", lambda name=name: config_algorithm(name, partial=True)))
    out.extend(_auc_stage_cases())
    for name in ("frpg", "lfrpg"):  # full-batch slots: masked means over clients of unequal size
        out.append(Case(f"alg/{name}/full-batch", lambda name=name: config_algorithm(name, extra={"full_batch": True})))
    out.extend(_toy_cases())
    poisoned = lambda **kw: (Shuffle(model(), clients_per_round=NUM_CLIENTS), federation(poison_client=1), kw)  # noqa: E731
    out.append(Case("own/shuffle", lambda: (Shuffle(model()), federation(), {}), rounds=4))
    out.append(Case("own/shuffle-skip", lambda: poisoned(on_client_failure="skip")))
    out.append(
        Case(
            "own/shuffle-raise",
            lambda: poisoned(),
            raises=(
                "client 1 replied with NaN/inf values in round 1 "
                "(reply or new client state; first non-finite leaf: slot)"
            ),
        )
    )
    for name in ("scaffold", "codasca", "local_only"):  # failing clients under skip (tests/runtime/test_faults.py)
        out.append(Case(f"faults/{name}", lambda name=name: faulty(name)))
    fedavg = lambda: FedAvg(model=model(), loss=cross_entropy, **SMALL)  # noqa: E731
    out.append(Case("fedavg/attack", lambda: (fedavg(), federation(), {"attack": NegatedMean(), "byzantine": [0, 4]})))
    out.append(Case("fedavg/float32", lambda: (fedavg(), federation(), {}), dtype=torch.float32))
    out.append(Case("fedavg/resume", lambda: (fedavg(), federation(), {}), rounds=4, resume_at=2))
    for policy in ("averaged", "local", "frozen"):  # BatchNorm running statistics (fedrisk.runtime.norm_stats)
        out.append(Case(f"batchnorm/{policy}", lambda policy=policy: (batchnorm_fedavg(policy), federation(), {})))
    out.append(
        Case("batchnorm/resume", lambda: (batchnorm_fedavg("averaged"), federation(), {}), rounds=4, resume_at=2)
    )
    return out


def batchnorm_fedavg(policy: str) -> FedAvg:
    """FedAvg of an MLP with a BatchNorm layer, its running statistics under ``policy``."""
    module = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, CLASSES)
    )
    return FedAvg(model=FunctionalModel(module, norm_stats=policy), loss=cross_entropy, **SMALL)


# -- running and comparing -----------------------------------------------------------------
class _Reports(Callback):
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_round_end(self, sim: Simulation, report: Any) -> None:
        self.rows.append(dataclasses.asdict(report))


def metrics_for(sim: Simulation) -> tuple[str, ...]:
    """AUROC for one-output scorers, accuracy (and worst-class accuracy) otherwise."""
    alg = sim.algorithm
    params = alg.global_params(sim.server_state)
    if params is None:
        params = alg.personal_params(sim.server_state, sim.client_states[0], 0)
    if params is None:
        return ()
    out = predict(alg, params, sim.federation.clients[0].x[:2])
    return ("auroc",) if out.reshape(2, -1).shape[1] == 1 else ("accuracy", "worst_class_accuracy")


Checkpoint = Callable[[dict[str, Any]], dict[str, Any]]


def run_case(
    case: Case, executor: Callable[[], Executor | str], checkpoint: Checkpoint | None = None
) -> dict[str, Any]:
    """Run ``case`` and summarise it; a FedriskError becomes ``{"error": message}`` (the
    distributed worker records it per rank; :func:`check_outcome` says whether it was expected).

    ``checkpoint(state) -> state`` stands for writing the checkpoint (rank 0) and reading it back
    (every rank) in a resumed run."""
    try:
        alg, fed, kwargs = case.build()
        reports = _Reports()

        def new_sim() -> Simulation:
            return Simulation(alg, fed, seed=SEED, executor=executor(), dtype=case.dtype, **kwargs)

        sim = new_sim()
        metrics = metrics_for(sim)
        if case.resume_at is not None:
            history = run_simulation(sim, case.resume_at, metrics=metrics, callbacks=[reports])
            state = sim.state_dict()
            state = checkpoint(state) if checkpoint is not None else state
            sim = new_sim()
            sim.load_state_dict(state)
            history = run_simulation(sim, case.rounds, metrics=metrics, callbacks=[reports], history=history)
        else:
            history = run_simulation(sim, case.rounds, metrics=metrics, callbacks=[reports])
    except FedriskError as exc:
        return {"error": str(exc)}
    records = [{k: v for k, v in r.items() if k != "wall_time"} for r in history.records]
    return {
        "num_clients": fed.num_clients,
        "metrics": list(metrics),
        "server_state": sim.server_state,
        "client_states": dict(sorted(sim.client_states.items())),
        "records": records,
        "reports": reports.rows,
        "ledger": sim.ledger.state_dict(),
    }


def check_outcome(case: Case, result: dict[str, Any]) -> None:
    """A case finishes unless it declares ``raises``, and then it stops with that error: a
    regression that makes a case fail (on every executor alike) or an unbuildable case fails
    the test instead of passing or being skipped."""
    if case.raises:
        assert "error" in result, f"{case.name}: finished, but it must stop with {case.raises!r}"
        assert case.raises in result["error"], f"{case.name}: {result['error']!r} lacks {case.raises!r}"
    else:
        assert "error" not in result, f"{case.name}: {result.get('error')}"


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """float64: 1e-9 relative; float32: 1e-5 relative (absolute floors for values near 0)."""
    return {"rtol": 1e-9, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}


def assert_same(a: Any, b: Any, rtol: float, atol: float, path: str = "") -> None:
    """Tensors and floats equal to the tolerance, everything else exactly."""
    if isinstance(a, Tensor):
        assert isinstance(b, Tensor), f"{path}: {type(b)}"
        same = a.dtype == b.dtype and a.shape == b.shape
        assert same, f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, float) and isinstance(b, float):
        close = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
        assert close, f"{path}: {a} vs {b}"
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
