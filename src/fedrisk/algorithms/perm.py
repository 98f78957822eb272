"""PERM: personalised empirical risk minimisation with model shuffling (Deng, Kamani, Mahdavinia
and Mahdavi, "Distributed Personalized Empirical Risk Minimization", NeurIPS 2023).

Every client i owns a model v_i that minimises its own weighted ERM over all clients' losses
(eq. (3))::

    min_v  Phi(alpha_i, v) = sum_j alpha_i(j) f_j(v),        alpha_i in the simplex Delta_N

with mixing weights from the gradient-dissimilarity objective at a global model w (eq. (2))::

    alpha_i = argmin_{alpha in Delta_N}  sum_j alpha(j) ||grad f_i(w) - grad f_j(w)||^2 + lam sum_j alpha(j)^2 / n_j

Pieces (spec 003 §§1-2):

* :func:`mixing_weights` — eq. (2) solved exactly (KKT: ``alpha(j) = n_j / (2 lam) max(0, tau_i - D_ij)``,
  tau_i by sorting); :func:`mixing_weights_pgd` — the paper's projected GD, kept as a test oracle.
* :func:`shuffle_hosts` — the schedule of Alg. 1: one permutation sigma_r per epoch, and in
  round j (paper's j = 1..N, 0-based ``j`` here) model i sits at client ``sigma_r((i + j + 1) mod N)``.
* :class:`PERMShuffling` — Alg. 1 (Shuffling Local SGD) with fixed weights (uniform, sample
  sizes, local); :class:`PERMTwoStage` — Alg. 3 (FedAvg with uniform averaging, weights at w^R)
  then Alg. 1; :class:`PERM` — the single-loop Alg. 2 (the paper's experimental method).
* :class:`~fedrisk.algorithms.perm_hetero.PERMHetero` (module ``perm_hetero``) — the
  heterogeneous-width extension (Sec. 3.3; the paper gives no mechanism, see its docstring).

Resolved choices (spec pitfalls P1-P15):

* Losses are **means** over a client's data (P1); lam is stated on that scale.
* ``lr`` is the base step: eta = lr / N, and a host k updating model i steps by
  ``eta * N * alpha_i(k)`` (SGD-Update, P2).  A zero weight makes the update an exact no-op;
  the K steps are still computed (no branching on tensor values), and the model keeps its slot.
  With concentrated weights (self weight near 1) the step at the owner is about ``lr``, so ``lr``
  must be a stable local-SGD step for the model (the analysis asks ``eta N L K <= 1``); a larger
  one collapses MLP personal models onto one class (docs/results/perm.md, Fashion-MNIST).
* The gradients that define D are full local gradients (``alpha_batch = None``; masked per-sample
  mean, so padding rows of the vectorised executor do not count) or a large minibatch (P5).
* Rounds: one contract round is one communication round.  PERM's epoch is one *estimate* round
  (every client uploads its gradient at w^r; the server computes alpha^r at w^r and takes the
  global step w^{r+1} = w^r - gamma mean_i g_i — the spec's "efficiency trick": the gradients at
  the same point serve both) followed by N *shuffle* rounds.  This is Alg. 2 with the loop
  rotated: alpha^r at w^r drives epoch r's personal updates, as in the paper (P4); alpha^0 is
  uniform.  Warm-up (P10, the paper's "10 communication rounds as a warm-up phase before
  initiating personalization"; its mechanism is not given): ``warmup = "uniform"`` keeps alpha
  uniform while ``round < warmup_rounds`` (the spec's recommended reading); ``warmup = "fedavg"``
  trains only w for ``warmup_rounds`` FedAvg rounds, then starts every v_i at w and estimates
  alpha from the first estimate round on (the spec's other reading; with ``warmup_rounds = 0`` it
  skips Alg. 2's uniform alpha^0).
* No projection P_W (P8); the evaluated personal model is v_i as it stands (no (1/L) output step).
* The server keeps the N models stacked ``[N, ...]`` and the N x N matrix alpha (P14).

Example:
    >>> import torch
    >>> D = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]])
    >>> mixing_weights(D, [10, 10, 10], lam=10.0)
    tensor([[0.7500, 0.2500, 0.0000],
            [0.2500, 0.7500, 0.0000],
            [0.0000, 0.0000, 1.0000]], dtype=torch.float64)
    >>> shuffle_hosts(torch.tensor([2, 0, 1]))  # rows: rounds j, columns: models i -> host
    tensor([[0, 1, 2],
            [1, 2, 0],
            [2, 0, 1]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.local import (
    check_local_sgd,
    full_batch_objective,
    sample_batch,
    sample_batches,
    sgd_steps,
    supervised_objective,
)
from fedrisk.autodiff import in_functorch_transform, value_and_grad
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.minimax import project_simplex
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_flatten_vector, tree_map, tree_stack

FIXED_WEIGHTS = ("uniform", "samples", "local")
WARMUPS = ("uniform", "fedavg")


# ----------------------------------------------------------------------------- eq. (2): alpha


def _check_weight_inputs(sq_distances: Any, counts: Any, lam: float) -> tuple[Tensor, Tensor]:
    if not (isinstance(lam, (int, float)) and lam > 0 and lam != float("inf")):
        raise FedriskError(f"lam = {lam!r} must be a finite number > 0 (the regulariser of PERM's eq. (2))")
    D = torch.as_tensor(sq_distances, dtype=torch.float64)
    n = torch.as_tensor(counts, dtype=torch.float64)
    if D.dim() != 2 or D.shape[0] != D.shape[1] or n.shape != (D.shape[0],):
        raise FedriskError(
            f"mixing_weights needs an N x N matrix of squared distances and N counts; got {tuple(D.shape)} "
            f"and {tuple(n.shape)}"
        )
    if not bool(torch.isfinite(D).all()) or bool((D < 0).any()):
        raise FedriskError("squared distances must be finite and >= 0")
    if bool((n <= 0).any()):
        empty = torch.nonzero(n <= 0).flatten().tolist()
        raise FedriskError(f"clients {empty} have no data (n_j = 0); PERM's weights need n_j >= 1 for every client")
    return D, n


def mixing_weights(sq_distances: Any, counts: Sequence[int] | Tensor, lam: float) -> Tensor:
    """The N x N mixing weights of eq. (2), exactly; row i is client i's alpha_i on the simplex.

    For row i with ``D_ij = ||grad f_i(w) - grad f_j(w)||^2`` the KKT conditions of
    ``min_{alpha in Delta_N} sum_j alpha(j) D_ij + lam sum_j alpha(j)^2 / n_j`` give
    ``alpha(j) = n_j / (2 lam) * max(0, tau_i - D_ij)`` (spec §1.2); tau_i is found by sorting
    ``D_i`` and taking the largest active set ``{j : D_ij < tau}`` consistent with
    ``sum_j alpha(j) = 1``.  lam -> 0 gives e_i (local training), lam -> inf gives n_j / n (FedAvg).

    Example:
        >>> D = torch.tensor([[0.0, 9.0], [9.0, 0.0]])
        >>> mixing_weights(D, [1, 1], lam=1e-3).tolist(), mixing_weights(D, [1, 3], lam=1e6).round(decimals=4).tolist()
        ([[1.0, 0.0], [0.0, 1.0]], [[0.25, 0.75], [0.25, 0.75]])
    """
    D, n = _check_weight_inputs(sq_distances, counts, lam)
    N = D.shape[0]
    order = D.argsort(dim=1, stable=True)
    d = D.gather(1, order)
    m = n[order]
    tau_k = (2.0 * lam + (m * d).cumsum(1)) / m.cumsum(1)  # tau if the first k sorted entries are active
    active = d < tau_k  # true on a prefix (k = 1 always)
    k = (active * torch.arange(1, N + 1, dtype=torch.float64, device=D.device)).argmax(dim=1, keepdim=True)
    tau = tau_k.gather(1, k)
    alpha = n / (2.0 * lam) * (tau - D).clamp_min(0.0)
    return alpha / alpha.sum(1, keepdim=True)


def mixing_weights_pgd(
    sq_distances: Any, counts: Sequence[int] | Tensor, lam: float, steps: int = 300, init: Tensor | None = None
) -> Tensor:
    """eq. (2) by the paper's T_alpha steps of projected GD (step 1/L_g, L_g = 2 lam / n_min),
    started at uniform weights (or ``init``, a warm start).  The test oracle of :func:`mixing_weights`.

    Example:
        >>> D = torch.tensor([[0.0, 1.0, 4.0], [1.0, 0.0, 4.0], [4.0, 4.0, 0.0]])
        >>> gap = mixing_weights_pgd(D, [10, 10, 10], 10.0) - mixing_weights(D, [10, 10, 10], 10.0)
        >>> bool(gap.abs().max() < 1e-12)
        True
    """
    D, n = _check_weight_inputs(sq_distances, counts, lam)
    check_range("steps", steps, 1)
    N = D.shape[0]
    alpha = torch.full((N, N), 1.0 / N, dtype=torch.float64) if init is None else init.to(torch.float64).clone()
    step = float(n.min()) / (2.0 * lam)
    for _ in range(steps):
        alpha = project_simplex(alpha - step * (D + 2.0 * lam * alpha / n))
    return alpha


def squared_distances(grads: Tensor) -> Tensor:
    """``D_ij = ||g_i - g_j||^2`` of the rows of ``grads`` [N, d] by the Gram trick
    ``||g_i||^2 + ||g_j||^2 - 2 <g_i, g_j>`` (P14), clamped at 0, symmetric, zero diagonal.

    Example:
        >>> squared_distances(torch.tensor([[0.0, 0.0], [3.0, 4.0]])).tolist()
        [[0.0, 25.0], [25.0, 0.0]]
    """
    g = grads.to(torch.float64)
    sq = (g * g).sum(1)
    D = (sq[:, None] + sq[None, :] - 2.0 * g @ g.T).clamp_min(0.0)
    D = 0.5 * (D + D.T)
    return D.fill_diagonal_(0.0)


# ----------------------------------------------------------------------------- Alg. 1: schedule


def shuffle_hosts(sigma: Tensor) -> Tensor:
    """``hosts[j, i]``: the client that hosts model i in round j of an epoch with permutation sigma.

    Alg. 1: ``i_j = sigma((i + j) mod N)`` for the paper's j = 1..N; with 0-based rounds
    ``j = 0..N-1`` that is ``sigma[(i + j + 1) mod N]``.  Every row is a permutation (each client
    hosts exactly one model per round) and every column too (each model visits every client once
    per epoch, ending at sigma(i)).
    """
    N = sigma.shape[0]
    i = torch.arange(N)
    return sigma[(i[None, :] + i[:, None] + 1) % N]


def hosted_owners(sigma: Tensor, j: int) -> Tensor:
    """``owner[k]``: the model client k hosts in round ``j`` (the inverse of row j of :func:`shuffle_hosts`)."""
    hosts = shuffle_hosts(sigma)[j]
    owner = torch.empty_like(hosts)
    owner[hosts] = torch.arange(sigma.shape[0])
    return owner


# ----------------------------------------------------------------------------- the algorithms


def _row(tree: Tree, i: int | Tensor) -> Tree:
    return tree_map(lambda x: x[i], tree)


@dataclass(frozen=True)
class PERMShuffling(Algorithm):
    """Alg. 1, Shuffling Local SGD, with fixed mixing weights.

    Every epoch of N rounds the server draws one permutation sigma_r; in round j client k hosts
    model ``i = owner[k]`` (:func:`hosted_owners`) and runs SGD-Update: K steps on its own data
    with step ``eta * N * alpha_i(k)``, eta = lr / N.  The server puts the model back into slot i.

    Args:
        model, loss: the functional model and ``loss(outputs, labels)`` (a mean over the batch).
        lr: the base step (eta = lr / N).
        local_steps: K.
        batch_size: the minibatch of one SGD step.
        weights: ``"uniform"`` (alpha_i = 1/N: every v_i solves the uniform WERM, FedAvg's
            objective), ``"samples"`` (n_j / n) or ``"local"`` (alpha_i = e_i: local training).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.

    Server state: ``v`` (the N models, stacked), ``w`` (the global model, kept for evaluation),
    ``alpha`` [N, N], ``sigma`` [N], ``j`` (round within the epoch), ``round``.

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> alg = PERMShuffling(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy)
        >>> alg.personalized, alg.weights
        (True, 'uniform')
    """

    name: ClassVar[str] = "perm_shuffling"
    personalized: ClassVar[bool] = True
    batched_draw: ClassVar[bool] = True

    model: Any
    loss: LossFn
    lr: float = 0.1
    local_steps: int = 1
    batch_size: int = 32
    weights: str = "uniform"
    sampling: str = "with_replacement"

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, None)
        if self.weights not in FIXED_WEIGHTS:
            raise unknown_name("weights", self.weights, FIXED_WEIGHTS)

    def check(self, fed: FedInfo) -> None:
        empty = [k for k, n in enumerate(fed.client_sizes) if n <= 0]
        if empty:
            raise FedriskError(
                f"{self.name}: clients {empty} have no training data; every client hosts a model in every "
                "round of PERM's schedule, so every client needs n_j >= 1"
            )

    # -- server -------------------------------------------------------------------------
    def initial_alpha(self, fed: FedInfo, dtype: torch.dtype) -> Tensor:
        N = fed.num_clients
        if self.weights == "local":
            return torch.eye(N, dtype=dtype)
        if self.weights == "samples":
            n = torch.tensor(fed.client_sizes, dtype=dtype)
            return (n / n.sum()).expand(N, N).clone()
        return torch.full((N, N), 1.0 / N, dtype=dtype)

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        N = ctx.fed.num_clients
        dtype = tree_flatten_vector(params).dtype
        return {
            "w": params,
            "v": tree_stack([params] * N),
            "alpha": self.initial_alpha(ctx.fed, dtype),
            "sigma": torch.randperm(N, generator=gen),
            "j": torch.zeros((), dtype=torch.int64),
            "round": torch.zeros((), dtype=torch.int64),
        }

    def round_kind(self, server_state: Tree) -> str:
        return "shuffle"

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        clients = list(range(ctx.fed.num_clients))
        kind = self.round_kind(server_state)
        if kind != "shuffle":
            return RoundPlan(clients, broadcast={"params": server_state["w"]}, kind=kind)
        owner = hosted_owners(server_state["sigma"], int(server_state["j"]))
        alpha, v = server_state["alpha"], server_state["v"]
        per_client = {k: {"params": _row(v, owner[k]), "alpha": alpha[owner[k], k]} for k in clients}
        return RoundPlan(clients, per_client=per_client, kind=kind)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        state = dict(server_state)
        state["round"] = server_state["round"] + 1
        if ctx.kind != "shuffle":
            return self.aggregate_other(ctx, state, replies, gen)
        # each hosted model goes back to its owner's slot
        owner = hosted_owners(server_state["sigma"], int(server_state["j"]))
        slots = owner[torch.tensor(replies.clients, dtype=torch.int64)]
        new = replies.stacked("params")
        state["v"] = tree_map(lambda v, x: v.index_copy(0, slots, x.to(v.dtype)), server_state["v"], new)
        j = int(server_state["j"]) + 1
        state["j"] = torch.tensor(j % ctx.fed.num_clients, dtype=torch.int64)
        if j == ctx.fed.num_clients:  # end of the epoch: a new permutation sigma_{r+1}
            state["sigma"] = torch.randperm(ctx.fed.num_clients, generator=gen)
            state = self.end_of_epoch(ctx, state)
        return state

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        raise AssertionError(f"unexpected round kind {ctx.kind!r}")

    def end_of_epoch(self, ctx: RoundContext, state: dict) -> dict:
        return state

    def global_params(self, server_state: Tree) -> Tree:
        return server_state["w"]

    def personal_params(self, server_state: Tree, client_state: Tree, client: int) -> Tree:
        return _row(server_state["v"], client)

    # -- client -------------------------------------------------------------------------
    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}

    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        if ctx.kind != "shuffle":
            return self.client_other(ctx, payload, state, data, draws)
        # SGD-Update(v, eta, j, K, alpha_i): K steps with step eta * N * alpha_i(j), eta = lr / N
        N = ctx.fed.num_clients
        alpha = payload["alpha"] if in_functorch_transform() else float(payload["alpha"])  # eager: SGD's fast path
        step = (self.lr / N) * N * alpha
        objective = supervised_objective(self.model.apply, self.loss)
        params, loss = sgd_steps(objective, payload["params"], data, draws["batches"], step)
        return ClientResult({"params": params}, state, {"loss": loss})

    def client_other(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        raise AssertionError(f"unexpected round kind {ctx.kind!r}")


def _estimate_gradients(alg: Any, params: Tree, data: LocalData, draws: Tree) -> dict[str, Tensor]:
    """The client's reply of an estimate round: its gradient at the global model for the alpha
    step (full local data, or ``alpha_batch`` rows) and, when ``global_batch`` is set, the M-row
    minibatch gradient of the global step."""
    objective = supervised_objective(alg.model.apply, alg.loss)
    if alg.alpha_batch is None:
        loss, g = value_and_grad(full_batch_objective(alg.model.apply, alg.loss))(params, data)
    else:
        x, y = data.x[draws["alpha_idx"]], data.y[draws["alpha_idx"]]
        loss, g = value_and_grad(objective)(params, x, y)
    reply = {"grad_full": g}
    if getattr(alg, "global_batch", None) is not None:
        x, y = data.x[draws["global_idx"]], data.y[draws["global_idx"]]
        reply["grad"] = value_and_grad(objective)(params, x, y)[1]
    return {"reply": reply, "loss": loss}


def _estimate_draws(alg: Any, num_samples: Any, rng: ClientRNG) -> Tree:
    out = {}
    if alg.alpha_batch is not None:
        out["alpha_idx"] = sample_batch(rng, num_samples, alg.alpha_batch)
    if getattr(alg, "global_batch", None) is not None:
        out["global_idx"] = sample_batch(rng, num_samples, alg.global_batch)
    return out


def _gradient_matrix(replies: Replies, key: str) -> Tensor:
    """The replies' gradients as rows of an [N, d] matrix (in client order)."""
    return torch.stack([tree_flatten_vector(g) for g in replies.gather(key)])


def weights_from_replies(previous: Tensor, replies: Replies, sizes: Sequence[int], lam: float, key: str) -> Tensor:
    """Eq. (2)'s mixing weights from the gradients in ``replies``.

    When every client replied this is ``mixing_weights(D, n, lam)``.  When some did not (a
    failed or dropped client under ``on_client_failure = "skip"``), the weights are solved among
    the repliers only: a replier's row puts no weight on an absent client (whose gradient is
    unknown), and an absent client keeps its previous row.
    """
    ids = list(replies.clients)
    sub = mixing_weights(squared_distances(_gradient_matrix(replies, key)), [sizes[i] for i in ids], lam)
    if len(ids) == previous.shape[0]:
        return sub.to(previous.dtype)
    alpha = previous.clone()
    index = torch.tensor(ids, dtype=torch.long)
    alpha[index] = 0.0
    alpha[index.unsqueeze(1), index] = sub.to(alpha.dtype)
    return alpha


@dataclass(frozen=True)
class PERM(PERMShuffling):
    """Single-loop PERM (Alg. 2), the paper's experimental method.

    Epoch r = one estimate round + N shuffle rounds:

    * estimate round: every client uploads ``g_i = grad f_i(w^r)`` (full local data, or
      ``alpha_batch`` rows) and, if ``global_batch = M`` is set, an M-row minibatch gradient;
      the server sets ``alpha^r = mixing_weights(||g_i - g_j||^2, n, lam)`` (eq. (2); uniform in
      epoch 0 and during warm-up unless ``warmup = "fedavg"``) and takes the global step
      ``w^{r+1} = w^r - gamma (1/N) sum_i g_i^M`` (Alg. 2 line "one minibatch-SGD step");
    * N shuffle rounds of Alg. 1 with alpha^r.

    Warm-up, two readings of the paper's CIFAR-10 warm-up (spec §2.8):

    * ``warmup = "uniform"`` (default; Alg. 2 as written): alpha^0 is uniform, and alpha stays
      uniform while ``round < warmup_rounds``; the personal models train from round 0 (with
      uniform weights each is a cyclic pass over all clients, i.e. not yet personalised).
    * ``warmup = "fedavg"``: rounds ``0 .. warmup_rounds - 1`` are FedAvg rounds that train only
      w (K steps of size gamma, uniform averaging, as Alg. 3); then every v_i starts at w and
      every estimate round, the first included, computes alpha from the gradients — no epoch
      runs with uniform weights.  ``warmup_rounds = 0`` skips only alpha^0's uniform epoch.

    Args (besides :class:`PERMShuffling`'s, whose ``weights`` is ignored):
        global_lr: gamma, the global model's step.
        global_batch: M, the minibatch of the global step (None: the full local gradient).
        lam: lam of eq. (2), > 0 (on the mean-loss scale).
        alpha_batch: rows of the gradient that defines D (None: the client's full data, P5).
        warmup_rounds: the warm-up's length in rounds (the paper's CIFAR warm-up).
        warmup: ``"uniform"`` or ``"fedavg"`` (above).

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> PERM(model=FunctionalModel(build_model("logreg", (4,), 2)), loss=cross_entropy, lam=0.0)
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: lam = 0.0 is out of range; allowed: (0.0, inf)
    """

    name: ClassVar[str] = "perm"

    global_lr: float = 0.5
    global_batch: int | None = None
    lam: float = 1.0
    alpha_batch: int | None = None
    warmup_rounds: int = 0
    warmup: str = "uniform"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("global_lr", self.global_lr, 0.0, None, low_inclusive=False)
        check_range("lam", self.lam, 0.0, None, low_inclusive=False)
        check_range("warmup_rounds", self.warmup_rounds, 0)
        if self.warmup not in WARMUPS:
            raise unknown_name("warmup", self.warmup, WARMUPS)
        if self.global_batch is not None:
            check_range("global_batch", self.global_batch, 1)
        if self.alpha_batch is not None:
            check_range("alpha_batch", self.alpha_batch, 1)

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        state = super().init_server(ctx, params, gen)
        state["alpha"] = torch.full_like(state["alpha"], 1.0 / ctx.fed.num_clients)  # alpha^0 uniform
        state["j"] = torch.tensor(-1, dtype=torch.int64)  # -1: the epoch's estimate round is next
        return state

    def round_kind(self, server_state: Tree) -> str:
        if self.warmup == "fedavg" and int(server_state["round"]) < self.warmup_rounds:
            return "fedavg"
        return "estimate" if int(server_state["j"]) < 0 else "shuffle"

    def end_of_epoch(self, ctx: RoundContext, state: dict) -> dict:
        state["j"] = torch.tensor(-1, dtype=torch.int64)
        return state

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        if ctx.kind == "fedavg":
            state["w"] = replies.mean("params")  # uniform averaging (Alg. 3's Local SGD)
            return state
        w = state["w"]
        r = int(state["round"]) - 1  # this round's index
        if self.warmup == "fedavg":  # the warm-up trained w only: v_i^0 = w, alpha estimated from now on
            if r == self.warmup_rounds:
                state["v"] = tree_stack([w] * ctx.fed.num_clients)
            estimate = True
        else:  # alpha^0 = uniform (Alg. 2), and uniform during warm-up
            estimate = r > 0 and r >= self.warmup_rounds
        if estimate:
            state["alpha"] = weights_from_replies(state["alpha"], replies, ctx.fed.client_sizes, self.lam, "grad_full")
        step = replies.mean("grad" if self.global_batch is not None else "grad_full")
        state["w"] = tree_map(lambda p, d: p - self.global_lr * d, w, step)
        state["j"] = torch.tensor(0, dtype=torch.int64)
        return state

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        if ctx.kind == "estimate":
            return _estimate_draws(self, num_samples, rng)
        return super().draw(ctx, client, num_samples, rng)

    def client_other(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        if ctx.kind == "fedavg":  # warm-up / stage 1: K local SGD steps of size gamma on w
            objective = supervised_objective(self.model.apply, self.loss)
            params, loss = sgd_steps(objective, payload["params"], data, draws["batches"], self.global_lr)
            return ClientResult({"params": params}, state, {"global_loss": loss})
        out = _estimate_gradients(self, payload["params"], data, draws)
        return ClientResult(out["reply"], state, {"global_loss": out["loss"]})


@dataclass(frozen=True)
class PERMTwoStage(PERM):
    """Two-stage PERM: Alg. 3 (discrepancy estimation at the optimum) then Alg. 1.

    * rounds ``0 .. R-1`` (R = ``fedavg_rounds``): Local SGD / FedAvg with K steps of size
      gamma = ``global_lr`` and **uniform** averaging (w* minimises (1/N) sum_i f_i, P12);
    * round R (estimate): every client uploads ``grad f_i(w^R)``; the server fixes
      ``alpha_hat = mixing_weights(D(w^R), n, lam)`` and starts every personal model at
      ``v_i^0 = w^R`` (the paper leaves v_i^0 open; w^R is the natural warm start);
    * then epochs of N shuffle rounds with the fixed alpha_hat (Alg. 1).

    ``global_batch`` and ``warmup_rounds`` do not apply (the global model is trained only in stage 1).

    Example:
        >>> from fedrisk.models import FunctionalModel, build_model
        >>> from fedrisk.objectives.supervised import cross_entropy
        >>> model = FunctionalModel(build_model("logreg", (4,), 2))
        >>> PERMTwoStage(model=model, loss=cross_entropy, fedavg_rounds=20).round_kind({"round": torch.tensor(20)})
        'estimate'
    """

    name: ClassVar[str] = "perm_two_stage"

    fedavg_rounds: int = 2  # R; set it (the default keeps short runs - and the executor suites - past stage 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("fedavg_rounds", self.fedavg_rounds, 0)
        if self.global_batch is not None or self.warmup_rounds or self.warmup != "uniform":
            raise FedriskError(
                "perm_two_stage trains the global model by FedAvg in stage 1 (fedavg_rounds); global_batch, "
                "warmup_rounds and warmup belong to single-loop 'perm' - leave them unset"
            )

    def round_kind(self, server_state: Tree) -> str:
        r = int(server_state["round"])
        if r < self.fedavg_rounds:
            return "fedavg"
        return "estimate" if r == self.fedavg_rounds else "shuffle"

    def end_of_epoch(self, ctx: RoundContext, state: dict) -> dict:
        return state

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        if ctx.kind == "fedavg":
            state["w"] = replies.mean("params")  # uniform averaging (Alg. 3)
            return state
        state["alpha"] = weights_from_replies(state["alpha"], replies, ctx.fed.client_sizes, self.lam, "grad_full")
        state["v"] = tree_stack([state["w"]] * ctx.fed.num_clients)
        state["j"] = torch.tensor(0, dtype=torch.int64)
        return state

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        if ctx.kind == "estimate":
            return _estimate_draws(self, num_samples, rng)
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}
