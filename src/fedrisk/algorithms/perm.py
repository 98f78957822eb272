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
from fedrisk.algorithms.base import (
    Algorithm,
    ClientResult,
    FedInfo,
    LocalData,
    RoundContext,
    RoundPlan,
    sample_clients,
)
from fedrisk.algorithms.local import (
    check_local_sgd,
    full_batch_objective,
    sample_batch,
    sample_batches,
    sgd_steps,
    supervised_objective,
)
from fedrisk.algorithms.perm_weights import (  # noqa: F401  (re-exported: eq. (2) lives in perm_weights)
    mixing_weights,
    mixing_weights_pgd,
    partner_thresholds,
    squared_distances,
)
from fedrisk.autodiff import in_functorch_transform, value_and_grad
from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.supervised import LossFn
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_flatten_vector, tree_map, tree_stack

FIXED_WEIGHTS = ("uniform", "samples", "local")
WARMUPS = ("uniform", "fedavg")


# ----------------------------------------------------------------------------- Alg. 1: schedule


def shuffle_hosts(sigma: Tensor) -> Tensor:
    """``hosts[j, i]``: the client that hosts model i in round j of an epoch with permutation sigma.

    Alg. 1: ``i_j = sigma((i + j) mod N)`` for the paper's j = 1..N; with 0-based rounds
    ``j = 0..N-1`` that is ``sigma[(i + j + 1) mod N]``.  Every row is a permutation (each client
    hosts exactly one model per round) and every column too (each model visits every client once
    per epoch, ending at sigma(i)).
    """
    N = sigma.shape[0]
    i = torch.arange(N, device=sigma.device)
    return sigma[(i[None, :] + i[:, None] + 1) % N]


def hosted_owners(sigma: Tensor, j: int) -> Tensor:
    """``owner[k]``: the model client k hosts in round ``j`` (the inverse of row j of :func:`shuffle_hosts`)."""
    hosts = shuffle_hosts(sigma)[j]
    owner = torch.empty_like(hosts)
    owner[hosts] = torch.arange(sigma.shape[0], device=hosts.device)
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
        clients_per_round: m, partial participation (None: all N).  Every epoch the server
            samples m clients S uniformly without replacement; the epoch's m shuffle rounds move
            only S's models among S's hosts (sigma_r permutes S), and a host k in S steps model
            i by ``lr * alpha_i(k) / sum_{l in S} alpha_i(l)`` (the weights restricted to S;
            PERM re-estimates S's rows among S, so they already sum to 1 there).  Models of
            clients outside S wait for an epoch that samples them.  With m = N no client is
            drawn and nothing is renormalised: the run equals full participation exactly.

    Server state: ``v`` (the N models, stacked), ``w`` (the global model, kept for evaluation),
    ``alpha`` [N, N], ``members`` [m] (the epoch's clients S), ``sigma`` [m] (a permutation of
    S's positions), ``j`` (round within the epoch), ``round``, and the objective of eq. (3)
    (``objective`` [N]: each model's ``Phi(alpha_i, v_i) = sum_k alpha_i(k) f_k(v_i)`` summed
    over its last complete epoch's visits, from the hosts' losses weighted by the weights they
    stepped with; ``objective_sum`` the running epoch; ``objective_seen`` [N] which models have
    completed an epoch).  :meth:`state_metrics` reports its mean over the models as
    ``train_loss`` (the clients' own ``host_loss``, unweighted, is the mean loss of the hosted
    models at their hosts, which may rise while every objective falls).

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
    clients_per_round: int | None = None

    def __post_init__(self) -> None:
        check_local_sgd(self.lr, self.local_steps, self.batch_size, self.sampling, self.clients_per_round)
        if self.weights not in FIXED_WEIGHTS:
            raise unknown_name("weights", self.weights, FIXED_WEIGHTS)

    def check(self, fed: FedInfo) -> None:
        if self.clients_per_round is not None and self.clients_per_round > fed.num_clients:
            raise FedriskError(
                f"{self.name}: clients_per_round = {self.clients_per_round} is more than the federation's "
                f"{fed.num_clients} clients; allowed: 1 .. {fed.num_clients} (or none for all)"
            )
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

    def draw_epoch(
        self, num_clients: int, gen: torch.Generator, device: torch.device | None = None
    ) -> dict[str, Tensor]:
        """The next epoch's clients S (all, drawing nothing, at full participation) and sigma
        (drawn on the CPU generator, placed on ``device``)."""
        members = torch.tensor(sample_clients(gen, num_clients, self.clients_per_round))  # int64: never empty
        sigma = torch.randperm(members.shape[0], generator=gen)
        if device is not None:
            members, sigma = members.to(device), sigma.to(device)
        return {"members": members, "sigma": sigma}

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        N = ctx.fed.num_clients
        dtype = tree_flatten_vector(params).dtype
        return {
            "w": params,
            "v": tree_stack([params] * N),
            "alpha": self.initial_alpha(ctx.fed, dtype),
            **self.draw_epoch(N, gen),
            "j": torch.tensor(0),
            "round": torch.tensor(0),
            "objective": torch.zeros(N, dtype=dtype),
            "objective_sum": torch.zeros(N, dtype=dtype),
            "objective_seen": torch.zeros(N, dtype=torch.bool),
        }

    def round_kind(self, server_state: Tree) -> str:
        return "shuffle"

    def hosting(self, server_state: Tree) -> tuple[list[int], Tensor]:
        """This shuffle round's hosts (the epoch's clients) and ``owner[p]``, the model host
        ``hosts[p]`` trains (:func:`hosted_owners` on S's positions)."""
        members = server_state["members"]
        return members.tolist(), members[hosted_owners(server_state["sigma"], int(server_state["j"]))]

    def visit_weight(self, server_state: Tree, owner: int, host: int) -> Tensor:
        """``alpha_owner(host)``, restricted to the epoch's clients under partial participation."""
        alpha, members = server_state["alpha"], server_state["members"]
        if len(members) == len(alpha):
            return alpha[owner, host]
        return alpha[owner, host] / alpha[owner, members].sum().clamp_min(torch.finfo(alpha.dtype).tiny)

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        kind = self.round_kind(server_state)
        clients = server_state["members"].tolist()
        if kind != "shuffle":
            return RoundPlan(clients, broadcast={"params": server_state["w"]}, kind=kind)
        hosts, owner = self.hosting(server_state)
        v = server_state["v"]
        per_client = {
            k: {"params": _row(v, i), "alpha": self.visit_weight(server_state, i, k)}
            for k, i in zip(hosts, owner.tolist())
        }
        return RoundPlan(clients, per_client=per_client, kind=kind)

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        state = dict(server_state)
        state["round"] = server_state["round"] + 1
        if ctx.kind != "shuffle":
            return self.aggregate_other(ctx, state, replies, gen)
        # each hosted model goes back to its owner's slot
        hosts, owner = self.hosting(server_state)
        position = {k: p for p, k in enumerate(hosts)}
        slots = owner[torch.tensor([position[k] for k in replies.clients])]  # a round has at least one reply
        new = replies.stacked("params")
        state["v"] = tree_map(lambda v, x: v.index_copy(0, slots, x.to(v.dtype)), server_state["v"], new)
        weighted = replies.stacked("weighted_loss").to(state["objective_sum"].dtype)
        state["objective_sum"] = server_state["objective_sum"].index_add(0, slots, weighted)
        m = len(hosts)
        j = int(server_state["j"]) + 1
        state["j"] = torch.tensor(j % m)
        if j == m:  # end of the epoch: eq. (3)'s objectives are complete; new S and sigma_{r+1}
            members = server_state["members"]
            state["objective"] = server_state["objective"].index_copy(0, members, state["objective_sum"][members])
            state["objective_seen"] = server_state["objective_seen"].index_fill(0, members, True)
            state["objective_sum"] = torch.zeros_like(state["objective_sum"])
            state.update(self.draw_epoch(ctx.fed.num_clients, gen, members.device))
            state = self.end_of_epoch(ctx, state)
        return state

    def weight_matrix(self, server_state: Tree) -> Tensor:
        """The mixing weights alpha [N, N] (row i: client i's weights; ``alpha.csv`` of a run)."""
        return server_state["alpha"]

    def state_metrics(self, server_state: Tree, federation: Any) -> dict[str, float]:
        """``train_loss``: the mean over the models of eq. (3)'s objective ``Phi(alpha_i, v_i)``
        over each model's last complete epoch (absent before the first epoch ends)."""
        seen = server_state["objective_seen"]
        if not bool(seen.any()):
            return {}
        return {"train_loss": float(server_state["objective"][seen].mean())}

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        raise AssertionError(f"unexpected round kind {ctx.kind!r}")

    def end_of_epoch(self, ctx: RoundContext, state: dict) -> dict:
        return state

    def global_params(self, server_state: Tree) -> Tree | None:
        """None: Alg. 1 with fixed weights trains no global model (its ``w`` stays the initial
        model, which would be reported as if it were a result)."""
        return None

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
        reply = {"params": params, "weighted_loss": payload["alpha"].to(loss.dtype) * loss}
        return ClientResult(reply, state, {"host_loss": loss})

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
    if alg.global_batch is not None:
        x, y = data.x[draws["global_idx"]], data.y[draws["global_idx"]]
        reply["grad"] = value_and_grad(objective)(params, x, y)[1]
    return {"reply": reply, "loss": loss}


def _estimate_draws(alg: Any, num_samples: Any, rng: ClientRNG) -> Tree:
    out = {}
    if alg.alpha_batch is not None:
        out["alpha_idx"] = sample_batch(rng, num_samples, alg.alpha_batch)
    if alg.global_batch is not None:
        out["global_idx"] = sample_batch(rng, num_samples, alg.global_batch)
    return out


def _gradient_matrix(replies: Replies, key: str) -> Tensor:
    """The replies' gradients as rows of an [N, d] matrix (in client order)."""
    return torch.stack([tree_flatten_vector(g) for g in replies.gather(key)])


def weights_from_replies(
    previous: Tensor, replies: Replies, sizes: Sequence[int], lam: float, key: str, out: dict | None = None
) -> Tensor:
    """Eq. (2)'s mixing weights from the gradients in ``replies``.

    When every client replied this is ``mixing_weights(D, n, lam)``.  When some did not (a
    failed or dropped client under ``on_client_failure = "skip"``, or a client outside the
    epoch's sample under partial participation), the weights are solved among the repliers
    only: a replier's row puts no weight on an absent client (whose gradient is unknown), and
    an absent client keeps its previous row.  With ``out`` (a server state of :class:`PERM`),
    also records the repliers' discrepancies in ``out["discrepancy"]`` [N, N] (other entries
    kept) and counts the estimation in ``out["estimations"]``.
    """
    ids = list(replies.clients)
    D = squared_distances(_gradient_matrix(replies, key))
    sub = mixing_weights(D, [sizes[i] for i in ids], lam)
    index = torch.tensor(ids, device=previous.device)
    if out is not None:
        known = out["discrepancy"].clone()
        known[index.unsqueeze(1), index] = D.to(known.dtype)
        out["discrepancy"] = known
        out["estimations"] = out["estimations"] + 1
    if len(ids) == len(previous):
        return sub.to(previous.dtype)
    alpha = previous.clone()
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
        check_range("global_lr", self.global_lr, 0.0, low_inclusive=False)
        check_range("lam", self.lam, 0.0, low_inclusive=False)
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
        state["j"] = torch.tensor(-1)  # -1: the epoch's estimate round is next
        N = ctx.fed.num_clients
        state["discrepancy"] = torch.zeros(N, N, dtype=state["alpha"].dtype)  # D of the latest estimation
        state["estimations"] = torch.tensor(0)
        return state

    def estimates_weights(self, r: int) -> bool:
        """Whether the estimate round ``r`` (0-based) sets alpha from the gradients: every one
        after a FedAvg warm-up; else none in epoch 0 (alpha^0 uniform, Alg. 2) nor while
        ``r < warmup_rounds``."""
        return self.warmup == "fedavg" or (r > 0 and r >= self.warmup_rounds)

    def round_kind(self, server_state: Tree) -> str:
        if self.warmup == "fedavg" and int(server_state["round"]) < self.warmup_rounds:
            return "fedavg"
        return "estimate" if int(server_state["j"]) < 0 else "shuffle"

    def end_of_epoch(self, ctx: RoundContext, state: dict) -> dict:
        state["j"] = torch.tensor(-1)
        return state

    def global_params(self, server_state: Tree) -> Tree:
        """The global model w (the discrepancies' reference point; reported as ``global_test_*``)."""
        return server_state["w"]

    def aggregate_other(self, ctx: RoundContext, state: dict, replies: Replies, gen: torch.Generator) -> Tree:
        if ctx.kind == "fedavg":
            state["w"] = replies.mean("params")  # uniform averaging (Alg. 3's Local SGD)
            return state
        w = state["w"]
        r = int(state["round"]) - 1  # this round's index
        if self.warmup == "fedavg" and r == self.warmup_rounds:  # the warm-up trained w only: v_i^0 = w
            state["v"] = tree_stack([w] * ctx.fed.num_clients)
        if self.estimates_weights(r):
            state["alpha"] = weights_from_replies(
                state["alpha"], replies, ctx.fed.client_sizes, self.lam, "grad_full", out=state
            )
        step = replies.mean("grad" if self.global_batch is not None else "grad_full")
        state["w"] = tree_map(lambda p, d: p - self.global_lr * d, w, step)
        state["j"] = torch.tensor(0)
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
    With ``clients_per_round`` only the shuffle epochs sample clients (stage 1 and the one
    estimation use every client, so that alpha_hat has every row).

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

    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        plan = super().configure(ctx, server_state, gen)
        if plan.kind == "shuffle":
            return plan
        # stage 1 and the one estimation use every client (alpha_hat is fixed for the whole run)
        return RoundPlan(list(range(ctx.fed.num_clients)), broadcast=plan.broadcast, kind=plan.kind)

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
        state["alpha"] = weights_from_replies(
            state["alpha"], replies, ctx.fed.client_sizes, self.lam, "grad_full", out=state
        )
        state["v"] = tree_stack([state["w"]] * ctx.fed.num_clients)
        state["j"] = torch.tensor(0)
        return state

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        if ctx.kind == "estimate":
            return _estimate_draws(self, num_samples, rng)
        return {"batches": sample_batches(rng, num_samples, self.local_steps, self.batch_size, self.sampling)}
