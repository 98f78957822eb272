"""FRPG and LFRPG (Dong et al., paper 002); its baselines RSA and robust SGD: :mod:`~fedrisk.algorithms.frpg_baselines`.

Problem (5): ``min F(w) = sum_n [f_n(w_n) + lambda p(w_0 - w_n)] + f_0(w_0)`` with the Huber
penalty ``p`` of eq. (30) (:mod:`fedrisk.objectives.penalties`), worker losses
``f_n(w) = E CE(w; x) + (delta/2)||w||^2`` and the server regulariser
``f_0(w) = (delta_0/2)||w||^2`` (section V).  All vectors below are the model parameters
flattened into one vector (the penalty is on the l2 norm of the whole difference).

FRPG, Algorithm 1 — one slot k = one communication round (k = round + 1)::

    beta_k = 2/(k+2),  alpha_{0,k} = (delta_0/14)(k+2)^2 + 1.5 L_0,  alpha_{n,k} = (3 delta/14)(k+2)^2 + L   (16)-(17)
    server:  u_0 = (1-beta) w_0 + beta v_0                                          (6a)
             w_0 <- u_0 - grad f_0(u_0) / alpha_0          broadcast w_0             (6b)
    worker:  u_n = (1-beta) w_n + beta v_n                                          (8a)
             s = grad f(u_n; x)   (one minibatch per slot, ridge included)
             w_n <- w_0 - prox_{(lambda/alpha_n) p}(w_0 - u_n + s/alpha_n)          (8b)
             g_n = lambda grad p(w_0 - w_n)                upload g_n                (7)
             v_n <- v_n - [delta (v_n - u_n) + s - g_n] / (delta + alpha_n beta)    (8c)
    server:  g_n <- g_n min(1, lambda sqrt(G) / ||g_n||)   (projection, spec A5; G = 1)
             v_0 <- v_0 - [delta_0 (v_0 - u_0) + grad f_0(u_0) + sum_n g_n] / (delta_0 + alpha_0 beta)   (6c)

LFRPG, Algorithm 2 — one frame i of T local slots = one communication round, with the frame
index in the schedules (27)-(28) and ``w_0`` fixed for the frame (19a-b); each worker runs
(21a-c) T times and uploads the mean ``(1/T) sum_k g_{n,k}``; the server then updates ``v_0``
by (19c).  Eq. (21a) literally reads ``u_{n,k}^i = (1-beta) w_{n,k}^{i-1} + beta v_{n,k-1}^i``
(slot k of the *previous* frame): ``variant = "lit"`` implements that (each worker stores T
models); ``variant = "seq"`` (default) uses ``w_{n,k-1}^i`` with ``w_{n,0}^i = w_{n,T}^{i-1}``
(spec ambiguity A1: with full gradients seq converges monotonically while lit oscillates like
FRPG, and seq needs one stored model, not T).

Beyond the paper (defaults reproduce it): ``pre`` runs a pre-aggregation of
:mod:`fedrisk.aggregators.preaggregation` on the received messages before the projection (the
sum of its m rows scaled by n / m), ``lam_schedule`` replaces lambda by ``lambda_k``
(:func:`frpg_lam`) in (7), (8b) and the projection, ``nonfinite`` raises on or drops NaN/inf
messages; Theorems 1-2 do not cover the first two (docs/byzantine.md).

RSA and SGD with a robust aggregator, the paper's baselines, are
:mod:`fedrisk.algorithms.frpg_baselines`.

Example:
    >>> import torch
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.objectives.supervised import cross_entropy
    >>> alg = FRPG(model=FunctionalModel(build_model("logreg", (4,), 3)), loss=cross_entropy, lipschitz=2.0)
    >>> [round(v, 4) for v in frpg_schedule(1, alg.delta_server, alg.delta, alg.lipschitz, alg.lipschitz)]
    [0.6667, 3.0019, 2.0058]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.aggregators.preaggregation import PRE_AGGREGATIONS, pre_aggregate
from fedrisk.aggregators.rows import clip_rows
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.local import (
    batch,
    check_sampling,
    full_batch_objective,
    sample_batches,
    supervised_objective,
)
from fedrisk.autodiff import value_and_grad
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.penalties import check_positive, huber_l2_grad, huber_l2_prox
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_flatten_vector, tree_map, tree_unflatten_vector, tree_zeros_like

__all__ = [
    "FRPG",
    "LAM_SCHEDULES",
    "LFRPG",
    "LFRPG_VARIANTS",
    "frpg_lam",
    "frpg_schedule",
    "frpg_server_post",
    "frpg_server_pre",
    "frpg_worker_slot",
]

LFRPG_VARIANTS = ("seq", "lit")
LAM_SCHEDULES = ("constant", "geometric", "sqrt", "list")
NONFINITE = ("raise", "exclude")


# ============================================================================= pure steps
def frpg_schedule(
    k: int, delta_server: float, delta: float, lipschitz_server: float, lipschitz: float
) -> tuple[float, float, float]:
    """``(beta_k, alpha_{0,k}, alpha_{n,k})`` of eqs. (16)-(17) (LFRPG: (27)-(28) with k = frame).

    Example:
        >>> frpg_schedule(1, 0.003, 0.003, 1.0, 1.0) == (2 / 3, 9 * 0.003 / 14 + 1.5, 27 * 0.003 / 14 + 1.0)
        True
    """
    if k < 1:
        raise FedriskError(f"FRPG slots are numbered from 1; got k = {k}")
    beta = 2.0 / (k + 2)
    alpha0 = delta_server / 14 * (k + 2) ** 2 + 1.5 * lipschitz_server
    alpha = 3 * delta / 14 * (k + 2) ** 2 + lipschitz
    return beta, alpha0, alpha


def frpg_lam(k: int, lam: float, schedule: str = "constant", decay: float = 1.0, values: Sequence[float] = ()) -> float:
    """``lambda_k`` of slot (FRPG) or frame (LFRPG) ``k >= 1``: ``lam`` (``"constant"``, the paper),
    ``lam * decay^(k-1)`` (``"geometric"``), ``lam * sqrt(k)`` (``"sqrt"``) or ``values[k-1]``
    (``"list"``; the last value is kept after the list ends).

    Example:
        >>> [frpg_lam(k, 2.0, "geometric", 0.5) for k in (1, 2, 3)], frpg_lam(4, 1.0, "list", values=(3.0, 2.0))
        ([2.0, 1.0, 0.5], 2.0)
    """
    if schedule == "constant":
        return lam
    if schedule == "geometric":
        return lam * decay ** (k - 1)
    if schedule == "sqrt":
        return lam * math.sqrt(k)
    if schedule == "list":
        return float(values[min(k, len(values)) - 1])
    raise unknown_name("lam_schedule", schedule, LAM_SCHEDULES)


def frpg_server_pre(w0: Tensor, v0: Tensor, beta: float, alpha0: float, delta_server: float) -> tuple[Tensor, Tensor]:
    """Eqs. (6a)-(6b): ``u_0 = (1-beta) w_0 + beta v_0`` and ``w_0 = u_0 - grad f_0(u_0)/alpha_0``.

    No penalty term and no prox at the server (pitfall P2).

    Example:
        >>> [t.tolist() for t in frpg_server_pre(torch.tensor([1.0]), torch.tensor([4.0]), 0.5, 2.0, 1.0)]
        [[2.5], [1.25]]
    """
    u0 = (1 - beta) * w0 + beta * v0
    return u0, u0 - (delta_server * u0) / alpha0


def frpg_worker_slot(
    u: Tensor, v: Tensor, w0: Tensor, s: Tensor, alpha: float, beta: float, delta: float, lam: float, mu: float
) -> tuple[Tensor, Tensor, Tensor]:
    """One reliable worker's slot after (8a): ``(w_n, g_n, v_n)`` of (8b), (7), (8c).

    ``s`` is the stochastic gradient at ``u`` (ridge included), reused by (8b) and (8c).
    ``w_n`` minimises ``<s, w - u> + (alpha/2)||w - u||^2 + lambda p(w_0 - w)`` (32), i.e.
    ``alpha (u - w_n) = s - g_n`` (33).

    Example:
        >>> zero, w0 = torch.zeros(2, dtype=torch.float64), torch.tensor([3.0, 4.0], dtype=torch.float64)
        >>> w, g, v = frpg_worker_slot(zero, zero, w0, zero, alpha=1.0, beta=0.5, delta=0.0, lam=1.0, mu=1e-3)
        >>> [[round(t, 6) for t in r.tolist()] for r in (w, g, v)]
        [[0.6, 0.8], [0.6, 0.8], [1.2, 1.6]]
    """
    y = w0 - u + s / alpha
    z = huber_l2_prox(y, lam / alpha, mu)
    w_new = w0 - z  # (8b)
    g = lam * huber_l2_grad(z, mu)  # (7): lambda grad_{w0} p(w_0 - w_n) = lambda grad p(z)
    v_new = v - (delta * (v - u) + s - g) / (delta + alpha * beta)  # (8c)
    return w_new, g, v_new


def frpg_server_post(v0: Tensor, u0: Tensor, g_sum: Tensor, alpha0: float, beta: float, delta_server: float) -> Tensor:
    """Eq. (6c) / (19c): ``v_0 - [delta_0 (v_0 - u_0) + grad f_0(u_0) + sum_n g_n] / (delta_0 + alpha_0 beta)``.

    Example:
        >>> frpg_server_post(torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([2.0]), 1.0, 1.0, 0.0).tolist()
        [-1.0]
    """
    return v0 - (delta_server * (v0 - u0) + delta_server * u0 + g_sum) / (delta_server + alpha0 * beta)


def _vec(t: Tree) -> Tensor:
    return tree_flatten_vector(t)


# ============================================================================= FRPG
class _ServerModel(Algorithm):
    """What the paper's methods share: every worker takes part in every round, the server's model
    ``w`` (all zeros unless ``zero_init`` is off) is the global model."""

    def init_params(self, gen: torch.Generator) -> Tree:
        params = self.model.init_params(gen)  # type: ignore[attr-defined]
        return tree_zeros_like(params) if self.zero_init else params  # type: ignore[attr-defined]

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["w"]


@dataclass(frozen=True)
class FRPG(_ServerModel):
    """Fault-Resilient Proximal Gradient (Algorithm 1 of paper 002); see the module docstring.

    Args:
        model: a functional model (softmax regression in the paper: ``logreg``).
        loss: the per-sample loss (cross-entropy); the ridge ``delta/2 ||w||^2`` is added here.
        lam: the penalty weight lambda (> 0).
        mu: the Huber smoothing mu (> 0).
        delta: delta_n, the workers' ridge / strong convexity (> 0).
        delta_server: delta_0 of ``f_0(w) = delta_0/2 ||w||^2`` (> 0).
        lipschitz: L_n (the paper: max_i ||x_i||^2 of the scaled data, 156 / 295 / 524).
        lipschitz_server: L_0 (None: the same as ``lipschitz``; spec ambiguity A4).
        batch_size: the minibatch of one slot (10 under Gaussian, 15 under label flipping).
        sampling: ``with_replacement`` or ``shuffle`` minibatches.
        full_batch: every slot uses the worker's whole local data set instead of a minibatch
            (``s = grad f_n(u)``, the deterministic setting of spec checks 7.2.6 and 7.2.8);
            ``batch_size`` and ``sampling`` are then unused and nothing is drawn.  Under the
            vectorised executor the padded rows of smaller clients are masked out
            (:func:`~fedrisk.algorithms.local.full_batch_objective`), so every executor computes the
            same mean over the client's real rows.
        project: project every received g onto the ball of radius lambda sqrt(G) (spec A5);
            switching it off reproduces pitfall P1.
        zero_init: start every model at zero (the paper's choice) instead of the model's init.
        pre: a pre-aggregation of the received messages before the projection and the sum (6c)
            — not in the paper: ``"none"`` (the paper), ``"nnm"`` (nearest-neighbour mixing,
            Allouah et al. 2023, with ``pre_f``), ``"bucketing"`` (means of random buckets of
            ``bucket_size``, Karimireddy et al. 2022; the sum of the m bucket means is scaled by
            n / m) or ``"arc"`` (adaptive robust clipping with ``pre_f``), the functions of
            :mod:`fedrisk.aggregators.preaggregation`.
        pre_f: the f of ``nnm`` / ``arc`` (2 pre_f < number of workers).
        bucket_size: the bucket size s of ``bucketing``.
        lam_schedule: ``lambda_k`` per slot (FRPG) / frame (LFRPG) k, used by the workers' prox
            (8b), their message (7) and the server's projection — not in the paper:
            ``"constant"`` (the paper: ``lam``), ``"geometric"`` (``lam * lam_decay^(k-1)``),
            ``"sqrt"`` (``lam * sqrt(k)``) or ``"list"`` (``lam_values[k-1]``, the last value
            kept afterwards); :func:`frpg_lam`.
        lam_decay: the factor of ``"geometric"`` (> 0).
        lam_values: the values of ``"list"`` (each > 0).
        nonfinite: a message with NaN/inf entries: ``"raise"`` (an error naming the workers) or
            ``"exclude"`` (dropped before the pre-aggregation, like a silent worker).
    """

    name: ClassVar[str] = "frpg"
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lam: float = 1.6
    mu: float = 1e-3
    delta: float = 0.003
    delta_server: float = 0.003
    lipschitz: float = 1.0
    lipschitz_server: float | None = None
    batch_size: int = 10
    sampling: str = "with_replacement"
    project: bool = True
    zero_init: bool = True
    full_batch: bool = False
    pre: str = "none"
    pre_f: int = 0
    bucket_size: int = 2
    lam_schedule: str = "constant"
    lam_decay: float = 1.0
    lam_values: tuple[float, ...] = ()
    nonfinite: str = "raise"

    def __post_init__(self) -> None:
        for name in ("lam", "mu", "delta", "delta_server", "lipschitz", "lam_decay"):
            check_positive(name, getattr(self, name))
        if self.lipschitz_server is not None:
            check_positive("lipschitz_server", self.lipschitz_server)
        check_range("batch_size", self.batch_size, 1)
        check_sampling(self.sampling)
        self._check_extensions()

    def _check_extensions(self) -> None:
        """The keys beyond the paper: pre-aggregation, lambda schedule, non-finite messages."""
        if self.pre not in PRE_AGGREGATIONS:
            raise unknown_name("pre-aggregation (algorithm.pre)", self.pre, PRE_AGGREGATIONS)
        check_range("pre_f", self.pre_f, 0)
        check_range("bucket_size", self.bucket_size, 1)
        if self.pre_f and self.pre not in ("nnm", "arc"):
            raise FedriskError(
                f"algorithm.pre_f = {self.pre_f} is used only with pre = 'nnm' or 'arc' (pre = {self.pre!r})"
            )
        if self.lam_schedule not in LAM_SCHEDULES:
            raise unknown_name("lam_schedule", self.lam_schedule, LAM_SCHEDULES)
        if self.lam_decay != 1.0 and self.lam_schedule != "geometric":
            raise FedriskError(
                f"algorithm.lam_decay = {self.lam_decay:g} is used only with lam_schedule = 'geometric' "
                f"(lam_schedule = {self.lam_schedule!r})"
            )
        if (self.lam_schedule == "list") != bool(self.lam_values):
            raise FedriskError(
                "algorithm.lam_values (one lambda per round) is needed with lam_schedule = 'list' and only then "
                f"(lam_schedule = {self.lam_schedule!r}, lam_values = {list(self.lam_values)})"
            )
        for i, v in enumerate(self.lam_values):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise FedriskError(f"algorithm.lam_values[{i}] = {v!r} is not allowed; every lambda must be > 0")
        if self.nonfinite not in NONFINITE:
            raise FedriskError(
                f"algorithm.nonfinite = {self.nonfinite!r} is not allowed; valid choices: raise, exclude"
            )

    def check_data(self, fed: FedInfo, data: Sequence[LocalData]) -> None:
        """Warn when ``lipschitz`` is far below the paper's L_n of softmax regression,
        ``max_i ||x_i||^2 + 1`` (with the bias) over the training rows: the worker steps
        ``1/alpha_n`` of (17) are then up to that ratio too long.  ``fedrisk run`` on a
        ``configs/byzantine`` file (whose FRPG settings live in ``[sweep.variants]``) without
        ``--set algorithm.lipschitz=...`` runs at the default 1.0."""
        if self.pre in ("nnm", "arc") and 2 * self.pre_f >= fed.num_clients:
            raise FedriskError(
                f"algorithm.pre_f = {self.pre_f} is not allowed with {fed.num_clients} workers: pre = {self.pre!r} "
                "needs 2 pre_f < the number of workers"
            )
        norms = [float((d.x[: int(d.size)].reshape(int(d.size), -1) ** 2).sum(1).max()) for d in data if int(d.size)]
        bound = 1.0 + max(norms, default=0.0)
        if self.lipschitz < 0.1 * bound:
            warnings.warn(
                f"{self.name}: lipschitz = {self.lipschitz:g} is below a tenth of max_i ||x_i||^2 + 1 = {bound:.4g} "
                "of the training data (the paper's L_n for softmax regression); the worker steps 1/alpha_n of "
                "eq. (17) may be too long",
                stacklevel=2,
            )

    @property
    def l0(self) -> float:
        return self.lipschitz if self.lipschitz_server is None else self.lipschitz_server

    def schedule(self, k: int) -> tuple[float, float, float]:
        """``(beta, alpha_0, alpha_n)`` for slot (FRPG) or frame (LFRPG) ``k``."""
        return frpg_schedule(k, self.delta_server, self.delta, self.l0, self.lipschitz)

    def lam_at(self, k: int) -> float:
        """``lambda_k`` for slot (FRPG) or frame (LFRPG) ``k`` (``lam`` unless ``lam_schedule`` says otherwise)."""
        return frpg_lam(k, self.lam, self.lam_schedule, self.lam_decay, self.lam_values)

    def message_sum(self, replies: Replies, lam: float, gen: torch.Generator | None) -> Tensor:
        """``sum_n g_n`` of (6c) / (19c): the messages (non-finite ones raised or excluded), the
        pre-aggregation ``pre`` (its m rows' sum scaled by n / m), each row projected onto the
        ball of radius ``lam`` (spec A5; unless ``project`` is off), summed."""
        x = torch.stack(replies.gather("g"))  # gather kind: each message is projected on its own
        finite = torch.isfinite(x).all(dim=1)
        if not bool(finite.all()):
            bad = [replies.clients[i] for i in (~finite).nonzero().flatten().tolist()]
            if self.nonfinite == "raise":
                raise FedriskError(
                    f"{self.name}: the messages g of workers {bad} contain NaN/inf "
                    "(set algorithm.nonfinite = 'exclude' to drop them instead)"
                )
            x = x[finite]
            if x.shape[0] == 0:
                raise FedriskError(f"{self.name}: every message contains NaN/inf; nothing left to aggregate")
        n = x.shape[0]
        x = pre_aggregate(x, self.pre, self.pre_f, self.bucket_size, gen)
        if self.project:
            x = clip_rows(x, lam)  # each message onto the lambda-ball: ||g|| <= lambda sqrt(G), G = 1
        total = x.sum(dim=0)
        return total if x.shape[0] == n else total * (n / x.shape[0])

    # -- server -------------------------------------------------------------------------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        return {"w": params, "v": params}  # w_{0,0} = v_{0,0}

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        return {"w": params, "v": params}  # w_{n,0} = v_{n,0}

    def _server_pre(self, ctx: RoundContext, server_state: Tree) -> tuple[Tensor, Tensor]:
        beta, alpha0, _ = self.schedule(ctx.round + 1)
        return frpg_server_pre(_vec(server_state["w"]), _vec(server_state["v"]), beta, alpha0, self.delta_server)

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        _, w0 = self._server_pre(ctx, server_state)  # (6a)-(6b), before hearing from the workers
        broadcast = {"w0": tree_unflatten_vector(w0, server_state["w"])}
        return RoundPlan(list(range(ctx.fed.num_clients)), broadcast=broadcast)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        beta, alpha0, _ = self.schedule(ctx.round + 1)
        u0, w0 = self._server_pre(ctx, server_state)
        g_sum = self.message_sum(replies, self.lam_at(ctx.round + 1), gen)
        v0 = frpg_server_post(_vec(server_state["v"]), u0, g_sum, alpha0, beta, self.delta_server)  # (6c)
        like = server_state["w"]
        return {"w": tree_unflatten_vector(w0, like), "v": tree_unflatten_vector(v0, like)}

    # -- worker -------------------------------------------------------------------------
    @property
    def slots_per_round(self) -> int:
        """Local slots per communication round (FRPG: 1; LFRPG: T)."""
        return 1

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        if self.full_batch:  # nothing random: every slot sees the whole local data set
            return {}
        return {"batches": sample_batches(rng, num_samples, self.slots_per_round, self.batch_size, self.sampling)}

    def stochastic_grad(
        self, params_like: Tree, u: Tensor, data: LocalData, draws: Tree, slot: int
    ) -> tuple[Tensor, Tensor]:
        """``(loss, grad f(u; x))`` on slot ``slot``'s minibatch, ridge ``delta u`` included (P7).

        With ``full_batch`` the gradient of the worker's whole local objective
        ``f_n(u) = mean_m CE(u; x_m) + delta/2 ||u||^2`` (masked over padding rows).
        """
        params = tree_unflatten_vector(u, params_like)
        if self.full_batch:
            value, g = value_and_grad(full_batch_objective(self.model.apply, self.loss))(params, data)
        else:
            x, y = batch(data, draws["batches"][slot])
            value, g = value_and_grad(supervised_objective(self.model.apply, self.loss))(params, x, y)
        return value, _vec(g) + self.delta * u

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        beta, _, alpha = self.schedule(ctx.round + 1)
        like = state["w"]
        w0, w, v = _vec(payload["w0"]), _vec(state["w"]), _vec(state["v"])
        u = (1 - beta) * w + beta * v  # (8a)
        loss, s = self.stochastic_grad(like, u, data, draws, 0)
        lam = self.lam_at(ctx.round + 1)
        w, g, v = frpg_worker_slot(u, v, w0, s, alpha, beta, self.delta, lam, self.mu)  # (8b), (7), (8c)
        new_state = {"w": tree_unflatten_vector(w, like), "v": tree_unflatten_vector(v, like)}
        return ClientResult({"g": g}, new_state, {"loss": loss})


# ============================================================================= LFRPG
@dataclass(frozen=True)
class LFRPG(FRPG):
    """Local FRPG (Algorithm 2 of paper 002): T local slots per communication round.

    Args (beyond :class:`FRPG`):
        local_slots_per_round: T (the paper: 10).
        variant: ``"seq"`` (default) or ``"lit"``, the two readings of eq. (21a).
    """

    name: ClassVar[str] = "lfrpg"

    local_slots_per_round: int = 10
    variant: str = "seq"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("local_slots_per_round", self.local_slots_per_round, 1)
        if self.variant not in LFRPG_VARIANTS:
            raise unknown_name("LFRPG variant", self.variant, LFRPG_VARIANTS)

    @property
    def slots_per_round(self) -> int:
        return self.local_slots_per_round

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        if self.variant == "lit":  # w_{n,k}^0 for every k = 1..T (spec A3: the same initial vector)
            stacked = tree_map(lambda p: p.unsqueeze(0).repeat(self.local_slots_per_round, *([1] * p.dim())), params)
            return {"w_slots": stacked, "v": params}
        return {"w": params, "v": params}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        beta, _, alpha = self.schedule(ctx.round + 1)  # frame index i = round + 1, constant in the frame
        like = payload["w0"]
        w0, v = _vec(payload["w0"]), _vec(state["v"])  # v_{n,0}^i = v_{n,T}^{i-1}
        lit = self.variant == "lit"
        if lit:
            slots_in = state["w_slots"]
            previous = [_vec(tree_map(lambda p, k=k: p[k], slots_in)) for k in range(self.local_slots_per_round)]
        else:
            w = _vec(state["w"])  # w_{n,0}^i = w_{n,T}^{i-1}
        g_sum, losses, slots, lam = torch.zeros_like(w0), [], [], self.lam_at(ctx.round + 1)
        for k in range(self.local_slots_per_round):
            w_prev = previous[k] if lit else w  # (21a): w_{n,k}^{i-1} (lit) or w_{n,k-1}^i (seq)
            u = (1 - beta) * w_prev + beta * v
            loss, s = self.stochastic_grad(like, u, data, draws, k)
            w, g, v = frpg_worker_slot(u, v, w0, s, alpha, beta, self.delta, lam, self.mu)  # (21b), (20), (21c)
            g_sum = g_sum + g
            losses.append(loss)
            slots.append(w)
        reply = {"g": g_sum / self.local_slots_per_round}  # (1/T) sum_k g_{n,k}^i
        v_tree = tree_unflatten_vector(v, like)
        if lit:
            stacked = torch.stack(slots)
            new_state = {"w_slots": tree_unflatten_vector(stacked, like), "v": v_tree}
        else:
            new_state = {"w": tree_unflatten_vector(w, like), "v": v_tree}
        return ClientResult(reply, new_state, {"loss": torch.stack(losses).mean()})


def __getattr__(name: str) -> Any:
    """``from fedrisk.algorithms.frpg import RSA`` (or ``RobustSGD``) as before the baselines moved
    to :mod:`fedrisk.algorithms.frpg_baselines` (a lazy import: that module imports this one)."""
    if name in ("RSA", "RobustSGD"):
        from fedrisk.algorithms import frpg_baselines

        return getattr(frpg_baselines, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
