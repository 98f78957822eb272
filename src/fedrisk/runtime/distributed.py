"""The distributed executor: SPMD processes on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Launch the same command once per process with ``torchrun``::

    torchrun --nproc-per-node 2 -m fedrisk run CONFIG --set run.executor=distributed

Design (see ``docs/distributed.md`` for launching on several machines and under Ray Train):

* **Every rank builds the same Simulation.**  The same config and seed give every process the
  same federation, initial parameters and server state; ``configure`` draws from the server
  generator of (seed, round), so every rank computes the same :class:`RoundPlan`.
* **Each rank owns a fixed shard of the clients**: client ``k`` belongs to rank
  ``k % world_size`` (round-robin, as pfl-research shards cohorts).  Round-robin rather than
  contiguous blocks because client ids are often sorted by size or label (by-size and
  pathological partitions) and partial participation draws a sorted subset: striding spreads
  the work evenly.  The shard never changes during a run.
* **Only the replies travel.**  A rank runs ``client_update`` for its own participating clients
  (each with ``client_generator(seed, round, k)``, exactly like the sequential executor, so the
  numbers do not depend on the number of processes), through a *local* executor
  (``"sequential"`` or ``"vectorized"``).  ``aggregate`` then runs on every rank over a
  :class:`~fedrisk.runtime.distributed_replies.DistributedReplies` view (that module packs what
  travels between the ranks):

  - ``sum`` / ``mean`` (sum-kind aggregators): the local weighted sum, then **one**
    ``all_reduce(SUM)`` per dtype of all leaves flattened into one buffer;
  - ``gather`` / ``stacked`` / ``as_dict`` (gather-kind aggregators, omniscient attacks):
    one ``all_gather`` of the packed bytes of every reply, returned in global client order
    with the original dtypes and shapes (bit-exact).

  The reduced values are identical on every rank, so every rank's ``aggregate`` produces the
  same new server state: **the server state is replicated**.  Consequently per-client
  payloads (``plan.per_client``: PERM hands each client the model it hosts, i.e. its
  shuffle) are computed locally on every rank from the replicated state and need no
  point-to-point or ``all_to_all`` traffic.  The trade-off is memory: every rank holds the
  whole server state (for PERM, all N personal models), plus the whole federation's data.
* **Client states are replicated too.**  After each round the new states of the round's
  clients are all-gathered (one ``all_gather`` of packed bytes; nothing when the states hold
  no tensors, as in FedAvg).  Evaluation of personalised models reads every client's state,
  so rank 0's metrics equal the sequential executor's, ``Simulation.state_dict()`` needs no
  collective, and a resumed run simply loads the same checkpoint on every rank.  (A design
  where states stay on their owner would need a collective before every evaluation and
  checkpoint; we judged the per-round traffic, which equals one gather of the participants'
  states, the better price for a runner that needs no special cases.)
* **Per-round bookkeeping** (which clients replied, which failed and why, the training
  metrics, the reply byte counts) is exchanged in the same ``all_gather`` as the states, so
  every rank builds an identical :class:`~fedrisk.runtime.simulation.RoundReport`.
* **Errors never leave ranks waiting.**  A client error on one rank is caught, exchanged,
  and raised on every rank (the original exception on the rank where it happened).
* **Rank 0 is primary** (:attr:`DistributedExecutor.is_primary`): the experiment layer writes
  metrics, plots and checkpoints only there.  Every rank still evaluates (no collectives are
  involved, so skipping evaluation off rank 0 is a pure saving the runner may take).
  :meth:`DistributedExecutor.run_on_primary` and :meth:`DistributedExecutor.any_rank` help a
  runner decide things once (the run directory, a checkpoint, a stop signal) for all ranks.

Resolved details:

* ``sum`` adds the shards' partial sums, so it may differ from the sequential executor in the
  last bits (the equivalence tests allow 1e-9 in float64); all ranks get the same bits.
* A weighted ``sum`` of an *integer* reply leaf is floating here even when every weight is 1.0
  (the sequential executor keeps integers then): every rank must pick the reduction dtype
  without seeing the others' replies.
* Under ``on_client_failure="skip"``, when *every* client of one rank fails, the local
  executor reports them together; their reasons in ``RoundReport.failed`` are that combined
  message rather than one message per client.

Example (world size 1; ``torchrun`` sets the same variables for every process):

    >>> import os, torch
    >>> from fedrisk.algorithms.fedavg import FedAvg
    >>> from fedrisk.data.federation import Federation, Samples
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> from fedrisk.runtime.simulation import Simulation
    >>> env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    >>> os.environ.update(env)
    >>> g = torch.Generator().manual_seed(0)
    >>> s = Samples(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    >>> fed = Federation("toy", [s.subset(range(20)), s.subset(range(20, 40))], num_classes=2)
    >>> alg = FedAvg(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, batch_size=5)
    >>> sim = Simulation(alg, fed, executor="distributed")
    >>> sim.step().clients, sim.executor.world_size, sim.executor.is_primary
    ([0, 1], 1, True)
    >>> sim.executor.close()
    >>> for key in env: del os.environ[key]
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, LocalData, RoundContext, RoundPlan
from fedrisk.errors import FedriskError, unknown_name
from fedrisk.runtime.distributed_replies import (
    DistributedReplies,
    _digest,
    _metric_in,
    _metric_out,
    _skeleton,
    _unpack,
)
from fedrisk.runtime.executor import ClientFailure, Executor, RoundOutput
from fedrisk.tree import Tree, tree_nbytes

#: The command shown when ``executor=distributed`` runs outside ``torchrun``.
LAUNCH_COMMAND = "torchrun --nproc-per-node 2 -m fedrisk run CONFIG --set run.executor=distributed"
#: The variables ``torchrun`` (and Ray Train) set for every process.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKENDS = ("gloo", "nccl")
T = TypeVar("T")
LOCAL_EXECUTORS = ("sequential", "vectorized")


def shard_of(client: int, world_size: int) -> int:
    """The rank that owns ``client``: ``client % world_size`` (fixed for the whole run).

    >>> [shard_of(k, 3) for k in range(7)]
    [0, 1, 2, 0, 1, 2, 0]
    """
    return client % world_size


def shard_clients(clients: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The clients of ``clients`` that ``rank`` runs.

    >>> shard_clients([0, 2, 3, 5, 8], rank=2, world_size=3)
    [2, 5, 8]
    """
    return [k for k in clients if shard_of(k, world_size) == rank]


def free_port() -> int:
    """A TCP port that is free on this machine now (for ``MASTER_PORT`` in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _home_device(plan: RoundPlan, default: torch.device) -> torch.device:
    """Where gathered / reduced values go (:func:`~fedrisk.runtime.device.plan_device`; ``default``:
    the data's device)."""
    from fedrisk.runtime.device import plan_device

    return plan_device(plan, default)


# -- the executor --------------------------------------------------------------------------
TIMEOUT_ENV = "FEDRISK_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 60.0


def collective_timeout() -> timedelta:
    """How long any collective (and the rendezvous) waits for the other processes before it
    fails: ``$FEDRISK_COLLECTIVE_TIMEOUT_S`` seconds, default 60 (torch's own defaults are 10
    and 30 minutes).  A rank that dies therefore stops the others within this bound even when
    nothing else notices (torchrun normally stops them at once).

    Example:
        >>> collective_timeout().total_seconds()
        60.0
    """
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise FedriskError(f"{TIMEOUT_ENV} = {text!r} is not a number of seconds > 0")
    return timedelta(seconds=seconds)


class RankFailure(FedriskError):
    """A collective failed because a process of the run died or stopped answering."""


_PROC_KEY = "fedrisk/process/{rank}"


def _register_process() -> None:
    """Record this rank's host and pid in the process group's store (for :func:`dead_ranks`)."""
    with contextlib.suppress(Exception):  # a store without set (or none): the message is vaguer
        store = dist.distributed_c10d._get_default_store()
        info = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
        store.set(_PROC_KEY.format(rank=dist.get_rank()), info)


def _pid_alive(pid: int) -> bool:
    """True when process ``pid`` runs on this machine (a zombie, killed but not yet reaped, is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


def dead_ranks(world_size: int, me: int) -> str:
    """Which other ranks have died, as a phrase for an error message: ranks on this machine are
    checked by pid (recorded in the store when the executor joined the group); the others are
    named as not checkable.  The store is asked with a short timeout: it may have died too."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=5))
        here = socket.gethostname()
        dead, unknown = [], []
        for r in range(world_size):
            if r == me:
                continue
            key = _PROC_KEY.format(rank=r)
            if not store.check([key]):
                unknown.append(f"rank {r} (never registered)")
                continue
            info = json.loads(store.get(key))
            if info["host"] != here:
                unknown.append(f"rank {r} (pid {info['pid']} on {info['host']})")
            elif not _pid_alive(int(info["pid"])):
                dead.append(f"rank {r} (pid {info['pid']})")
    except Exception as exc:  # the store's host (rank 0, or torchrun's agent) is gone too
        return (
            f"the rendezvous store cannot be reached either ({type(exc).__name__}), so the process that hosts it "
            "(rank 0, or torchrun) has probably died"
        )
    parts = []
    if dead:
        parts.append(f"{', '.join(dead)} {'has' if len(dead) == 1 else 'have'} died")
    if unknown:
        parts.append(f"not checked (another machine or unknown): {', '.join(unknown)}")
    return "; ".join(parts) if parts else "every other rank of this machine is still running (one may hang)"


class DistributedExecutor(Executor):
    """Runs each rank's shard of the clients and reduces the replies with ``torch.distributed``.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; None picks NCCL when the clients' data are on a GPU,
            else gloo.  Ignored when a process group already exists (e.g. created by Ray Train).
        local: how a rank runs its own clients: ``"sequential"`` (default), ``"vectorized"``
            (``torch.func.vmap`` over the shard) or an :class:`Executor` instance.
        check_replicas: hash every round's plan (clients, kind, payload bytes) on every rank and
            raise if the ranks disagree (costs one hash of the payload per round; for debugging
            and tests — disagreement means the ranks were started with different configs).

    The process group is created in :meth:`prepare` from ``torchrun``'s environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``) and destroyed
    at interpreter exit (or by :meth:`close`).  Several simulations in one process (sweeps,
    tests) share it.
    """

    name = "distributed"

    def __init__(
        self, backend: str | None = None, local: str | Executor = "sequential", check_replicas: bool = False
    ) -> None:
        if backend is not None and backend not in BACKENDS:
            raise unknown_name("distributed backend", backend, BACKENDS)
        if isinstance(local, str) and local not in LOCAL_EXECUTORS:
            raise unknown_name("local executor of the distributed executor", local, LOCAL_EXECUTORS)
        if isinstance(local, DistributedExecutor):
            raise FedriskError("the local executor of the distributed executor cannot be distributed itself")
        self.backend = backend
        self.local = local
        self.check_replicas = bool(check_replicas)
        self._local: Executor | None = None
        self._comm_device = torch.device("cpu")
        self._data_device = torch.device("cpu")  # set by prepare: where the round's replies live by default
        self._registered = False

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """Turn a failed collective (a rank died, or a timeout) into a :class:`RankFailure`
        that names the dead rank(s)."""
        try:
            yield
        except RuntimeError as exc:  # DistBackendError and gloo's connection errors
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise RankFailure(
                f"rank {self.rank} of {self.world_size}: {what} failed: {dead_ranks(self.world_size, self.rank)} "
                f"({type(exc).__name__}: {first}). The run stops; resume from its last checkpoint with --resume"
            ) from None

    # -- process group --------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank (from the process group, else from ``RANK``, else 0)."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        """The number of processes (from the process group, else from ``WORLD_SIZE``, else 1)."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def is_primary(self) -> bool:
        """True on rank 0, the process that writes logs, metrics and checkpoints."""
        return self.rank == 0

    def _init_process_group(self, data_device: torch.device | None = None) -> None:
        """Join the existing process group, or create one from torchrun's environment.

        Backend when none was given: NCCL when the data live on a GPU (or, before the data are
        known, when CUDA is available), else gloo — collectives then run where the tensors are.
        """
        if not dist.is_available():
            raise FedriskError("executor 'distributed' needs a PyTorch build with torch.distributed")
        if dist.is_initialized():  # a second simulation in this process, a helper call, Ray Train
            self._comm_device = _comm_device(dist.get_backend())
            if not self._registered:
                _register_process()
                self._registered = True
            return
        missing = [v for v in TORCHRUN_ENV if v not in os.environ]
        if missing:
            raise FedriskError(
                "executor 'distributed' must be launched by torchrun (missing environment "
                f"variables {', '.join(missing)}); run for example\n    {LAUNCH_COMMAND}\n"
                "(see docs/distributed.md for several machines and Ray Train)"
            )
        on_gpu = data_device.type == "cuda" if data_device is not None else torch.cuda.is_available()
        backend = self.backend or ("nccl" if on_gpu else "gloo")
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise FedriskError(
                    "distributed backend 'nccl' needs CUDA GPUs, and none is available; use backend 'gloo' on CPU"
                )
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group(backend, timeout=collective_timeout())
        atexit.register(_destroy_group)
        self._comm_device = _comm_device(backend)
        _register_process()
        self._registered = True

    def close(self) -> None:
        """Destroy the process group (every rank must call it; optional, done at exit)."""
        _destroy_group()

    # -- helpers for the experiment layer (collectives: every rank must call them) ---------
    def run_on_primary(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 only and return its result on every rank; a FedriskError it
        raises is raised on every rank (so no rank is left waiting in a collective).

        For decisions about the run directory (refuse to overwrite, find the checkpoint) and
        for reading a checkpoint once: ``ckpt = executor.run_on_primary(lambda: load(path))``
        also spares the other ranks (and nodes) from needing the file.  Joins the process group
        if :meth:`prepare` has not run yet.
        """
        self._init_process_group()
        outcome: list[Any] = [None]
        if self.rank == 0:
            try:
                outcome[0] = ("ok", fn())
            except FedriskError as exc:
                outcome[0] = ("error", str(exc))
        with self._collective("a broadcast from rank 0"):
            dist.broadcast_object_list(outcome, src=0)
        status, value = outcome[0]
        if status == "error":
            raise FedriskError(value)
        return value

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank (e.g. a SIGINT seen by one
        rank: all ranks must stop after the same round)."""
        self._init_process_group()
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self._comm_device)
        with self._collective("the agreement on a stop signal"):
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    # -- the executor contract ------------------------------------------------------------
    def prepare(self, algorithm: Algorithm, data: Sequence[LocalData]) -> None:
        """Join the process group, check the world against the federation, prepare the local executor."""
        self._init_process_group(data[0].x.device if data else None)
        self._data_device = data[0].x.device if data else torch.device("cpu")
        world, num_clients = self.world_size, len(data)
        if world > num_clients:
            raise FedriskError(
                f"world size {world} is larger than the number of clients {num_clients}: every process "
                f"must own at least one client; launch at most {num_clients} processes "
                f"(torchrun --nproc-per-node {num_clients} ...) or use more clients"
            )
        mine = (algorithm.name, num_clients, tuple(int(d.size) for d in data))
        every = self._all_gather_object(mine)
        if any(x != mine for x in every):
            described = "; ".join(f"rank {r}: {x[0]} on {x[1]} clients" for r, x in enumerate(every))
            raise FedriskError(
                "the processes built different algorithms or federations (every rank must run the same "
                f"config): {described}"
            )
        self._local = self._make_local()
        self._local.prepare(algorithm, data)

    def _make_local(self) -> Executor:
        if isinstance(self.local, Executor):
            return self.local
        from fedrisk.runtime import EXECUTORS

        if self.local not in EXECUTORS:
            raise unknown_name("local executor of the distributed executor", self.local, EXECUTORS.names())
        return EXECUTORS.get(self.local)()

    def collect_states(self, states: Mapping[int, Tree]) -> dict[int, Tree]:
        """Every client's state: already on every rank (states are replicated after each round)."""
        return dict(states)

    def run_round(
        self,
        algorithm: Algorithm,
        ctx: RoundContext,
        plan: RoundPlan,
        states: Mapping[int, Tree],
        data: Sequence[LocalData],
        seed: int,
        on_failure: str = "raise",
    ) -> RoundOutput:
        if self._local is None:
            raise RuntimeError("DistributedExecutor.prepare was not called")
        rank, world = self.rank, self.world_size
        home = _home_device(plan, self._data_device)
        mine = shard_clients(plan.clients, rank, world)
        local_replies: Replies | None = None
        new_states: dict[int, Tree] = {}
        metrics: dict[int, dict[str, Tensor]] = {}
        failed: dict[int, str] = {}
        error: tuple[str, str, bool] | None = None
        original: BaseException | None = None
        if mine:
            per_client = None if plan.per_client is None else {k: plan.per_client[k] for k in mine}
            sub = RoundPlan(mine, plan.broadcast, per_client, plan.kind)
            try:
                out = self._local.run_round(algorithm, ctx, sub, states, data, seed, on_failure)
            except ClientFailure as exc:
                if on_failure == "raise":
                    error, original = (type(exc).__name__, str(exc), True), exc
                else:  # 'skip': the local executor raises only when every local client failed
                    failed = {k: str(exc) for k in mine}
            except Exception as exc:  # exchanged below so that no rank waits forever
                user = isinstance(exc, FedriskError)  # a user error: its message; a bug: its traceback
                message = str(exc) if user else f"{exc!r}\n{traceback.format_exc()}"
                error, original = (type(exc).__name__, message, user), exc
            else:
                local_replies, new_states, metrics, failed = out.replies, out.states, out.metrics, out.failed
        ok = list(local_replies.clients) if local_replies is not None else []
        replies_dict = local_replies.as_dict() if ok else {}
        info = {
            "ok": ok,
            "failed": failed,
            "metrics": {k: {n: _metric_out(v) for n, v in m.items()} for k, m in metrics.items()},
            "nbytes": {k: tree_nbytes(r) for k, r in replies_dict.items()},
            "spec": {key: _skeleton(v) for key, v in replies_dict[ok[0]].items()} if ok else None,
            "plan": _digest(plan) if self.check_replicas else (plan.kind, tuple(plan.clients)),
            "error": error,
        }
        gathered, infos = self._exchange({k: new_states[k] for k in ok}, info, home)

        for r, inf in enumerate(infos):  # errors first: every rank raises
            if inf["error"] is not None:
                name, message, user = inf["error"]
                if original is not None and r == rank:
                    raise original
                text = f"rank {r} failed in round {ctx.round} with {name}: {message}"
                raise (ClientFailure(text) if user else RuntimeError(text))
        plans = [inf["plan"] for inf in infos]
        if any(p != plans[0] for p in plans):
            raise RuntimeError(
                f"the ranks disagree on the plan of round {ctx.round} ({algorithm.name}): their server states "
                "diverged or they run different configs/seeds"
            )
        all_failed = {k: v for inf in infos for k, v in inf["failed"].items()}
        owners = {k: r for r, inf in enumerate(infos) for k in inf["ok"]}
        if not owners:
            raise ClientFailure(f"every client failed in round {ctx.round}: {dict(sorted(all_failed.items()))}")
        all_states = {k: new_states[k] if k in new_states else gathered[k] for k in sorted(owners)}
        all_metrics = {k: {n: _metric_in(v) for n, v in infos[owners[k]]["metrics"][k].items()} for k in sorted(owners)}
        replies = DistributedReplies(
            self,
            local_replies if ok else None,
            owners=owners,
            spec=next(inf["spec"] for inf in infos if inf["spec"] is not None),
            nbytes={k: infos[owners[k]]["nbytes"][k] for k in sorted(owners)},
            device=home,
        )
        return RoundOutput(replies, all_states, all_metrics, dict(sorted(all_failed.items())))

    # -- collectives ----------------------------------------------------------------------
    def _all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        with self._collective("an all_gather of round data"):
            dist.all_gather_object(out, obj)
        return out

    def _exchange(
        self, items: Mapping[int, Tree], extra: Any, device: torch.device
    ) -> tuple[dict[int, Tree], list[Any]]:
        """All-gather trees keyed by client (bit-exact) and one small picklable ``extra`` per rank.

        One ``all_gather_object`` carries the extras and the trees' skeletons (structure,
        dtypes, shapes); one ``all_gather`` of a padded uint8 buffer carries the tensor bytes
        (skipped when no rank has any).  Trees come back on ``device``.
        """
        chunks: list[Tensor] = []
        skeletons = {k: _skeleton(tree, chunks) for k, tree in items.items()}
        size = sum(int(c.numel()) for c in chunks)
        metas = self._all_gather_object((skeletons, size, extra))
        longest = max(m[1] for m in metas)
        out: dict[int, Tree] = {}
        if longest == 0:
            for m in metas:
                for k, skel in m[0].items():
                    out[k] = _unpack(skel, torch.empty(0, dtype=torch.uint8), 0, device)[0]
            return out, [m[2] for m in metas]
        buf = torch.zeros(longest, dtype=torch.uint8, device=self._comm_device)
        if chunks:
            buf[:size] = torch.cat([c.to(self._comm_device) for c in chunks])
        bufs = [torch.empty_like(buf) for _ in metas]
        with self._collective("an all_gather of client states"):
            dist.all_gather(bufs, buf)
        for m, b in zip(metas, bufs):
            pos = 0
            for k, skel in m[0].items():
                out[k], pos = _unpack(skel, b, pos, device)
        return out, [m[2] for m in metas]

    def _all_reduce_leaves(self, leaves: list[Tensor]) -> list[Tensor]:
        """``all_reduce(SUM)`` of tensors: one flat buffer (and one call) per dtype."""
        result: list[Tensor] = list(leaves)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, x in enumerate(leaves):
            by_dtype.setdefault(x.dtype, []).append(i)
        for _dtype, idx in sorted(by_dtype.items(), key=lambda kv: str(kv[0])):  # same order on every rank
            flat = torch.cat([leaves[i].reshape(-1) for i in idx]).to(self._comm_device)
            with self._collective("an all_reduce of the replies"):
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            pos = 0
            for i in idx:
                n = leaves[i].numel()
                result[i] = flat[pos : pos + n].reshape(leaves[i].shape).to(leaves[i].device)
                pos += n
        return result


def _comm_device(backend: str) -> torch.device:
    if str(backend).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
