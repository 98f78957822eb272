r"""CODA+ (with CODA and NPA): stagewise local primal-dual SGD with periodic averaging.

Yuan, Guo, Xu, Ying & Yang, *Federated Deep AUC Maximization for Heterogeneous Data with a
Constant Communication Complexity*, ICML 2021 (spec ``shared/specs/000_codasca.md``); the whole
family, its resolved ambiguities and its mapping onto the algorithm contract are described in
``docs/auc-family.md``.  Alg. 1 (the stages: :mod:`fedrisk.algorithms.stagewise`) and Alg. 2
(DSG+, one stage), with one contract round = one communication window::

    every client k: v^k = v_0, α^k = α_0                   (the stage's start; v_0 = its prox reference)
    for each round r = 1..R:
      for t = 0..I−1 (fresh minibatch z):                  client_update → local_sgda
        g_v = ∇_v F_k(v, α; z) + λ(v − v_0)                objective_directions (eq. (2)) + eq. (5)'s prox
        g_α = ∇_α F_k(v, α; z)
        v ← v − η g_v;  α ← α + η g_α
      average v, α over the clients                        aggregate → server_step
    output: (1/K) Σ_k (1/T) Σ_{t=1..T} (v_t^k, α_t^k)      the stage-output rule (Average by default)

* **CODA+** (:class:`CODAPlus`): Alg. 1 + Alg. 2.  CODASCA (:mod:`fedrisk.algorithms.codasca`)
  is CODA+ with its control-variate hooks filled in and the server extrapolation.
* **CODA** (:class:`CODA`, Guo et al. 2020): CODA+ plus, after every stage, the dual reset
  ``α_0^{s+1} = α*(v_0^{s+1}) = E[h | y=−1] − E[h | y=1]`` on a batch pooled from all clients
  (one extra ``"dual_reset"`` round per stage; spec §2.1).
* **NPA** (:class:`NPA`): CODA+ with ``I = 1`` and a local minibatch of ``M`` (paper §C).

The classes reach the AUC objective (:mod:`fedrisk.objectives.auc`) only through the hooks
``init_primal`` / ``init_dual``, ``init_objective_state``, ``objective_directions``,
``dual_projection``, ``check``, ``draw`` and ``predict``; a subclass overriding them runs the
family on any (v, α) game (the test suite does so for the spec's §7.2 quadratic game).

Example:
    >>> from fedrisk.data.sources.synthetic import class_split_auc_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = class_split_auc_federation(4, seed=0, num_neg_classes=4, num_pos_classes=4, dim=8,
    ...                                  neg_per_class=40, test_per_class=20)
    >>> model = FunctionalModel(build_model("mlp", (8,), 1, hidden=[8], output_activation="sigmoid"))
    >>> alg = CODAPlus(model=model, lr=0.1, window=4, stage_iters=20)
    >>> [alg.schedule(r).kind for r in range(6)]
    ['train', 'train', 'train', 'train', 'stage_end', 'train']
    >>> sim = Simulation(alg, fed, seed=0)
    >>> [sim.step().kind for _ in range(5)][-1], sorted(sim.server_state["v"])
    ('stage_end', ['a', 'b', 'model'])
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.local import check_sampling, sample_batch, sample_batches
from fedrisk.algorithms.primal_dual import Directions, LocalWindow, local_sgda
from fedrisk.algorithms.stagewise import (
    DUAL_RESET,
    STAGE_END,
    STAGE_OUTPUTS,
    StageOutput,
    StageSchedule,
    StageSlot,
    stage_output_rule,
)
from fedrisk.autodiff import in_functorch_transform, value_and_grad
from fedrisk.errors import FedriskError, check_int, check_range, unknown_name
from fedrisk.objectives.auc import (
    AUCWeights,
    auc_dual_closed_form,
    auc_label_weights,
    auc_minmax_weighted,
    auc_minmax_weighted_directions,
    class_score_sums,
    optimal_dual_from_sums,
    single_output,
)
from fedrisk.objectives.auc_setup import DEFAULT_POSITIVE_RATIO, check_ratio, positive_ratios_from_counts
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tensor_leaves, tree_add, tree_scale, tree_zeros_like

__all__ = [
    "AUC_LOSSES",
    "CODA",
    "DUAL_DIRECTIONS",
    "NPA",
    "POSITIVE_RATIOS",
    "STAGE_OUTPUTS",
    "CODAPlus",
    "SingleClassClientWarning",
]

AUC_LOSSES = ("square", "margin")
POSITIVE_RATIOS = ("global", "client", "given")
DUAL_DIRECTIONS = ("gradient", "closed_form")


class SingleClassClientWarning(UserWarning):
    """A client holds a single class; the AUC objective still runs (``docs/auc-family.md``)."""


def _zero_like_params(params: Tree) -> Tensor:
    leaf = next((x for x in tensor_leaves(params) if x.is_floating_point()), None)
    if leaf is None:
        return torch.zeros((), dtype=torch.get_default_dtype())
    return torch.zeros((), dtype=leaf.dtype, device=leaf.device)


@functools.lru_cache(maxsize=16)
def _positive_ratios(
    name: str, choice: str, given: float | None, num_clients: int, class_counts: tuple[tuple[int, ...], ...]
) -> tuple[float, ...]:
    """Every client's ``p`` (memoised: ``init_client`` asks once per client, and ``"global"``
    needs every client's counts); the policy is :func:`~fedrisk.objectives.auc_setup.positive_ratios_from_counts`."""
    ratios = positive_ratios_from_counts(choice, class_counts, given=given, name=name)  # type: ignore[arg-type]
    return ratios if choice != "given" else ratios[:1] * num_clients


@dataclass(frozen=True)
class CODAPlus(Algorithm):
    """CODA+: stagewise local primal-dual SGD with periodic averaging (Alg. 1 and Alg. 2).

    Args:
        model: a functional model with one output (``init_params``, ``apply``).
        lr: local step size ``η`` of the first stage (code default 0.1).
        window: ``I``: local steps per communication round (``I_0`` with ``window_growth``).
        window_growth: ``I_s = round(window · window_growth^s)`` (1 = fixed ``I``, as the
            experiments; Theorem 2 grows it geometrically).
        stage_iters: ``T_0``: local iterations of the first stage, rounded up to whole windows
            (``R_0 = ceil(T_0 / I_0)`` rounds); None = one endless stage.
        rounds_growth: ``R_s = round(R_0 · rounds_growth^s)`` rounds in stage ``s`` (1 = the same
            number of windows per stage, Theorem 2; Theorem 1's heterogeneous schedule
            ``I_s ∝ η_s^{-1/2}``, ``T_s ∝ 1/η_s`` is ``window_growth = rounds_growth =
            sqrt(lr_decay)``).
        lr_decay: the step size is divided by this at every stage boundary (paper: 3).
        prox_coef: ``λ`` of the proximal gradient ``λ (v − v_0^s)`` (eq. (5)); ``1/500`` by
            default (the code's ``gamma = 500``); 0 disables it.
        stage_output: ``"average"`` | ``"random"`` | ``"last"`` | ``"last_local_average_ref"`` |
            ``"last_global_average_ref"`` (:mod:`~fedrisk.algorithms.stagewise`).
        batch_size: local minibatch size (paper: 32).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.
        auc_loss: ``"square"`` (eq. (2), the paper) or ``"margin"`` (AUCM, the code).
        margin: the AUCM margin ``m`` (``auc_loss="margin"`` and the closed-form dual direction).
        positive_ratio: ``"global"`` (default), ``"client"`` or ``"given"``
            (:data:`~fedrisk.objectives.auc_setup.PositiveRatio`).
        p: the positive ratio for ``positive_ratio="given"``, in (0, 1).
        dual_direction: ``"gradient"`` (the paper's ``∇_α F``) or ``"closed_form"`` (the code).
        grad_clip: clamp the network-weight gradients elementwise to ``±grad_clip`` (code: 1).
        weight_decay: add ``weight_decay · v`` to the primal direction (code: 1e-5).
        sigmoid: apply a sigmoid to the model output to get the score ``h``.
    """

    name: ClassVar[str] = "codaplus"
    batched_draw: ClassVar[bool] = True
    dual_reset_rounds: ClassVar[int] = 0

    model: Any
    lr: float = 0.1
    window: int = 1
    window_growth: float = 1.0
    stage_iters: int | None = 2000
    rounds_growth: float = 1.0
    lr_decay: float = 3.0
    prox_coef: float = 0.002
    stage_output: str = "average"
    batch_size: int = 32
    sampling: str = "with_replacement"
    auc_loss: str = "square"
    margin: float = 1.0
    positive_ratio: str = DEFAULT_POSITIVE_RATIO
    p: float | None = None
    dual_direction: str = "gradient"
    grad_clip: float | None = None
    weight_decay: float = 0.0
    sigmoid: bool = False

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0.0, None, low_inclusive=False)
        check_int("window", self.window, 1)
        check_range("window_growth", self.window_growth, 1.0)
        if self.stage_iters is not None:
            check_int("stage_iters", self.stage_iters, 1)
            if self.window > self.stage_iters:
                raise FedriskError(
                    f"{self.name}: window = {self.window} is larger than the stage length stage_iters = "
                    f"{self.stage_iters}; allowed: window <= stage_iters (a stage is a whole number of windows), "
                    "or stage_iters = None for one endless stage"
                )
        else:
            for key in ("window_growth", "rounds_growth"):
                if getattr(self, key) != 1.0:
                    raise FedriskError(
                        f"{self.name}: {key} = {getattr(self, key)!r} needs stages; set stage_iters (T_0) "
                        f"or keep {key} = 1"
                    )
        check_range("rounds_growth", self.rounds_growth, 1.0)
        check_range("lr_decay", self.lr_decay, 1.0)
        check_range("prox_coef", self.prox_coef, 0.0)
        if self.lr * self.prox_coef >= 1.0:
            raise FedriskError(
                f"{self.name}: prox_coef = {self.prox_coef!r} with lr = {self.lr!r} gives lr * prox_coef >= 1, "
                "so the proximal step overshoots; allowed: lr * prox_coef < 1. prox_coef is the coefficient "
                "lambda of the gradient term lambda * (v - v_ref): the paper's '1/gamma in {500, 700, 1000}' "
                "means prox_coef = 1/500 ... 1/1000 (0.002 ... 0.001)"
            )
        if self.stage_output == "last_average_ref":
            raise FedriskError(
                f"{self.name}: stage_output = 'last_average_ref' was ambiguous and has been split: "
                "'last_local_average_ref' (the official code: each client's prox reference is the average of "
                "its own local iterates over the stage) or 'last_global_average_ref' (the reference is the "
                "cross-client stage average, broadcast by the server)"
            )
        if self.stage_output not in STAGE_OUTPUTS:
            raise unknown_name("stage_output", self.stage_output, STAGE_OUTPUTS)
        check_int("batch_size", self.batch_size, 1)
        check_sampling(self.sampling)
        if self.auc_loss not in AUC_LOSSES:
            raise unknown_name("auc_loss", self.auc_loss, AUC_LOSSES)
        check_range("margin", self.margin, 0.0, None, low_inclusive=False)
        if self.positive_ratio not in POSITIVE_RATIOS:
            raise unknown_name("positive_ratio", self.positive_ratio, POSITIVE_RATIOS)
        if self.positive_ratio == "given":
            if self.p is None:
                raise FedriskError(f"{self.name}: positive_ratio = 'given' needs p, a number in (0, 1)")
            check_ratio(self.p, name="p")
        elif self.p is not None:
            raise FedriskError(
                f"{self.name}: p = {self.p!r} is only used with positive_ratio = 'given' "
                f"(got positive_ratio = {self.positive_ratio!r})"
            )
        if self.dual_direction not in DUAL_DIRECTIONS:
            raise unknown_name("dual_direction", self.dual_direction, DUAL_DIRECTIONS)
        if self.grad_clip is not None:
            check_range("grad_clip", self.grad_clip, 0.0, None, low_inclusive=False)
        check_range("weight_decay", self.weight_decay, 0.0)

    # -- Alg. 1: the stage schedule and the stage output (fedrisk.algorithms.stagewise) ----------
    @functools.cached_property
    def stages(self) -> StageSchedule:
        """The stage schedule of the hyper-parameters (a pure function of the round number)."""
        return StageSchedule(
            self.lr,
            self.window,
            self.stage_iters,
            self.window_growth,
            self.rounds_growth,
            self.lr_decay,
            self.dual_reset_rounds,
            self.name,
        )

    @functools.cached_property
    def stage_rule(self) -> StageOutput:
        """The stage-output rule of ``stage_output`` (:func:`~fedrisk.algorithms.stagewise.stage_output_rule`)."""
        return stage_output_rule(self.stage_output, staged=self.stages.staged, prox_coef=self.prox_coef)

    def rounds_per_stage(self) -> int | None:
        """``R_0 = ceil(T_0 / I_0)`` windows in the first stage (None: one endless stage)."""
        return self.stages.rounds_per_stage()

    def stage_rounds(self, stage: int) -> int:
        """``R_s = round(R_0 · rounds_growth^s)`` windows in stage ``s`` (1 for an endless stage).

        Example (Theorem 1, heterogeneous: ``I_s`` and ``R_s`` grow by ``sqrt(3)`` while ``η_s`` falls by 3):
            >>> alg = CODAPlus(model=None, window=4, stage_iters=16, window_growth=3**0.5, rounds_growth=3**0.5)
            >>> [(alg.stage_rounds(s), alg.stage_window(s)) for s in range(3)]
            [(4, 4), (7, 7), (12, 12)]
        """
        return self.stages.stage_rounds(stage)

    def stage_window(self, stage: int) -> int:
        """``I_s = round(window · window_growth^s)``."""
        return self.stages.stage_window(stage)

    def stage_lr(self, stage: int) -> float:
        """``η_s = lr / lr_decay^s``."""
        return self.stages.stage_lr(stage)

    def schedule(self, round: int) -> StageSlot:
        """The stage, window position, local steps, step size and kind of ``round``.

        Example:
            >>> alg = CODAPlus(model=None, window=2, stage_iters=5, lr=0.3)
            >>> alg.schedule(2), alg.schedule(3).stage, alg.schedule(3).lr
            (StageSlot(stage=0, index=2, steps=2, lr=0.3, kind='stage_end'), 1, 0.09999999999999999)
        """
        return self.stages.slot(round)

    # -- the objective: AUC min-max, eq. (2) (hooks; a subclass may swap in another (v, α) game)
    def init_primal(self, params: Tree) -> Tree:
        """``v_0 = (w_0, a_0 = 0, b_0 = 0)``."""
        return {"model": params, "a": _zero_like_params(params), "b": _zero_like_params(params)}

    def init_dual(self, params: Tree) -> Tree:
        """``α_0 = 0`` (feasible for the margin loss too)."""
        return _zero_like_params(params)

    def scores(self, model_params: Tree, x: Tensor) -> Tensor:
        """``h(w; x)``: the model's single output as ``[N]`` (sigmoid applied if ``sigmoid``)."""
        out = single_output(self.model.apply(model_params, x), self.name)
        return torch.sigmoid(out) if self.sigmoid else out

    def client_positive_ratios(self, fed: FedInfo) -> tuple[float, ...]:
        """``p`` of every client according to ``positive_ratio`` (validated; FedriskError if not in (0, 1)).

        Example:
            >>> fed = FedInfo(2, (4, 4), 2, ((3, 1), (1, 3)))
            >>> CODAPlus(model=None).client_positive_ratios(fed)
            (0.5, 0.5)
            >>> CODAPlus(model=None, positive_ratio="client").client_positive_ratios(fed)
            (0.25, 0.75)
        """
        return _positive_ratios(self.name, self.positive_ratio, self.p, fed.num_clients, fed.class_counts)

    def init_objective_state(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        """The per-client constants of the objective: ``{"p": p_k}``."""
        p = self.client_positive_ratios(ctx.fed)[client]
        return {"p": torch.tensor(p, dtype=_zero_like_params(params).dtype)}

    def dual_projection(self) -> Callable[[Tree], Tree] | None:
        """``Π`` after every ascent step: onto ``α ≥ 0`` for the margin loss (AUCM); none for eq. (2)."""
        return (lambda alpha: alpha.clamp(min=0)) if self.auc_loss == "margin" else None

    def objective_directions(self, state: Tree, data: LocalData, draws: Tree, v: Tree, alpha: Tree) -> Directions:
        """The stochastic directions ``(∇_v F_k, ∇_α F_k)`` of eq. (2) on minibatch ``t`` of ``draws``.

        ``v``, ``alpha``: the window's start (their structure fixes the leaf order: the model's
        parameters, ``a``, ``b``; then ``α``).  The label weights of the batch mean
        (:func:`auc_label_weights`) depend on the labels and ``p`` only, so they are computed
        once for the window's ``I`` minibatches.

        Two evaluation paths, the same numbers (bitwise, see
        :func:`auc_minmax_weighted_directions`): outside ``torch.func`` (the sequential executor)
        only the scorer goes through autograd, ``torch.autograd.grad(h, w, grad_outputs=∂F/∂h)``,
        and ``∂F/∂h``, ``∂F/∂a``, ``∂F/∂b``, ``∂F/∂α`` come in closed form; under ``vmap`` (the
        vectorized executor) ``torch.func`` differentiates the whole objective.  The first path is
        what keeps a CODASCA round within ~1.1x of a FedAvg round on the same model
        (``benchmarks/RESULTS_codasca.md``): autograd through the objective's ~15 small operations
        and three extra scalar leaves, behind ``value_and_grad``'s pytree handling of the leaf list,
        cost ~30% of a step on a small MLP.
        """
        p, idx = state["p"], draws["batches"]
        weights = auc_label_weights(data.y[idx], p)  # [I, B] each
        margin = self.margin if self.auc_loss == "margin" else None
        names = list(v["model"])
        n = len(names)
        leaves = pytree.tree_leaves(v)
        if len(leaves) != n + 2 or leaves[n] is not v["a"] or leaves[n + 1] is not v["b"]:
            raise RuntimeError("unexpected leaf order of the primal variables (model, a, b)")

        def objective(var: list[Tensor], x: Tensor, w: AUCWeights) -> Tensor:
            h = self.scores(dict(zip(names, var[:n])), x)
            return auc_minmax_weighted(h, var[n], var[n + 1], var[n + 2], w, margin)

        value_grad = value_and_grad(objective)

        def eager(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
            # outside torch.func: autograd through the scorer only, the rest in closed form
            # (auc_minmax_weighted_directions; the same numbers as `value_grad` up to rounding)
            leaves = [x.detach().requires_grad_(True) for x in xs[:n]]
            h = self.scores(dict(zip(names, leaves)), data.x[idx[t]])
            d = auc_minmax_weighted_directions(h.detach(), xs[n], xs[n + 1], ys[0], weights.row(t), margin)
            g_w = torch.autograd.grad(h, leaves, grad_outputs=d.h, allow_unused=True)
            g_w = [torch.zeros_like(x) if g is None else g for g, x in zip(g_w, leaves)]
            return d.value, [*g_w, d.a, d.b], [d.alpha]

        def directions(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
            if torch.is_grad_enabled() and not in_functorch_transform():
                value, g_v, g_a = eager(t, xs, ys)
            else:  # under vmap (the vectorized executor): torch.func through the whole objective
                value, g = value_grad([*xs, *ys], data.x[idx[t]], weights.row(t))
                g_v, g_a = g[: n + 2], g[n + 2 :]
            if self.grad_clip is not None:  # the code's elementwise clipping, network weights only
                c = self.grad_clip
                g_v = [u.clamp(-c, c) for u in g_v[:n]] + g_v[n:]
            if self.dual_direction == "closed_form":  # the code's 2(m + b − a) − 2α (m = 0 for eq. (2)'s α)
                g_a = [auc_dual_closed_form(xs[n], xs[n + 1], ys[0], margin or 0.0)]
            return value, g_v, g_a

        return directions

    # -- set-up ------------------------------------------------------------------------------
    def check(self, fed: FedInfo) -> None:
        if fed.num_classes != 2:
            raise FedriskError(
                f"{self.name}: the AUC objective needs binary labels (num_classes = 2, label 1 = positive); "
                f"got num_classes = {fed.num_classes}. Binarise the labels first"
            )
        empty = [k for k, n in enumerate(fed.client_sizes) if n == 0]
        if empty:
            raise FedriskError(f"{self.name}: clients {empty} have no training samples; every client needs data")
        ratios = self.client_positive_ratios(fed)
        for k, row in enumerate(fed.class_counts):
            n, pos = sum(row), (row[1] if len(row) > 1 else 0)
            if pos in (0, n):
                what = "no positive" if pos == 0 else "no negative"
                drift = "h̄/(1−p)" if pos == 0 else "−h̄/p"
                grad = "a" if pos == 0 else "b"
                warnings.warn(
                    f"{self.name}: client {k} has {what} examples ({n} samples). Its loss stays finite: its "
                    f"gradient in {grad} is 0 and its local dual ascent pulls alpha towards {drift} (h̄: its mean "
                    f"score), a client drift that averaging corrects; with p = {ratios[k]:.4g} the federated "
                    "objective is still the pooled AUC surrogate",
                    SingleClassClientWarning,
                    stacklevel=2,
                )

    # -- set-up: v_0, α_0 on the server; each client's constants, prox reference, sums ---------
    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        v, alpha = self.init_primal(params), self.init_dual(params)
        state: dict[str, Any] = {"v": v, "alpha": alpha, **self.control_variates_init(v, alpha)}
        self.stage_rule.init_server(state, v, alpha)
        return state

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        state = dict(self.init_objective_state(ctx, client, params))
        v, alpha = self.init_primal(params), self.init_dual(params)
        if self.prox_coef > 0:
            state["ref"] = v
        state.update(self.control_variates_init(v, alpha))
        if self.stage_rule.tracks_average:
            state["iterate_sum"] = {"v": tree_zeros_like(v), "alpha": tree_zeros_like(alpha)}
        return state

    # -- one round: the server's broadcast ---------------------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        slot = self.schedule(ctx.round)
        clients = list(range(ctx.fed.num_clients))  # every client, every round (the paper's setting)
        if slot.kind == DUAL_RESET:
            return RoundPlan(clients, {"model": server_state["v"]["model"]}, kind=DUAL_RESET)
        broadcast = {"v": server_state["v"], "alpha": server_state["alpha"]}  # (v_{r−1}, α_{r−1})
        broadcast.update(self.control_variates_payload(server_state))
        if slot.index == 0 and "ref" in server_state:  # a prox reference other than the start point
            broadcast["ref"] = server_state["ref"]
        return RoundPlan(clients, broadcast, kind=slot.kind)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        slot = self.schedule(ctx.round)
        if slot.kind == DUAL_RESET:
            return self.dual_reset_draw(num_samples, rng)
        return {"batches": sample_batches(rng, num_samples, slot.steps, self.batch_size, self.sampling)}

    # -- one round: a client's window (Alg. 2's inner loop) ----------------------------------
    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        slot = self.schedule(ctx.round)
        if slot.kind == DUAL_RESET:
            return self.dual_reset_update(payload, state, data, draws)
        rule, new_state, first = self.stage_rule, dict(state), slot.index == 0
        # every window starts from the server's (v_{r−1}, α_{r−1}) (§2.7-4, P7)
        v0, alpha0 = payload["v"], payload["alpha"]
        # the stage's prox reference v_0^s: taken from the stage's first broadcast, then kept
        ref = None
        if self.prox_coef > 0:  # (the code's rule keeps each client's own reference from stage 1 on)
            ref = payload.get("ref", v0) if first and not (rule.keeps_own_ref and slot.stage > 0) else state["ref"]
            new_state["ref"] = ref
        shift_v, shift_alpha = self.control_variates_shift(payload, state)
        local = local_sgda(
            self.objective_directions(state, data, draws, v0, alpha0),
            v0,
            alpha0,
            slot.steps,
            slot.lr,
            prox_coef=self.prox_coef,
            ref=ref,
            weight_decay=self.weight_decay,
            shift_v=shift_v,
            shift_alpha=shift_alpha,
            project_dual=self.dual_projection(),
            sum_directions=self.sums_directions,
            sum_iterates=rule.tracks_average,
        )
        reply: dict[str, Any] = {"v": local.v, "alpha": local.alpha}
        self.control_variates_update(payload, state, local, slot, reply, new_state)
        if rule.tracks_average:  # Σ_{t} (v_t^k, α_t^k) over the stage so far (Alg. 2's output)
            assert local.iterate_sum is not None
            window_sum = {"v": local.iterate_sum[0], "alpha": local.iterate_sum[1]}
            running = window_sum if first else tree_add(state["iterate_sum"], window_sum)
            if slot.kind == STAGE_END:
                rule.client_stage_end(running, self.stages.stage_steps(slot.stage), reply, new_state)
                running = tree_zeros_like(running)
            new_state["iterate_sum"] = running
        return ClientResult(reply, new_state, {"loss": local.loss})

    # -- one round: the server's average (and the stage boundary) ---------------------------
    def server_step(self, server_state: Tree, v_mean: Tree, alpha_mean: Tree) -> tuple[Tree, Tree]:
        """CODA+: the plain average ``(v̂_r, α̂_r)`` (Alg. 2's communication step)."""
        return v_mean, alpha_mean

    def aggregate(
        self, ctx: RoundContext, server_state: Tree, plan: RoundPlan, replies: Replies, gen: torch.Generator
    ) -> Tree:
        slot = self.schedule(ctx.round)
        if slot.kind == DUAL_RESET:
            return self.dual_reset_aggregate(server_state, replies)
        new = dict(server_state)
        # v̂_r = (1/K) Σ_k v_{r,I}^k,  α̂_r = (1/K) Σ_k α_{r,I}^k   (equal client weights, P11)
        new["v"], new["alpha"] = self.server_step(server_state, replies.mean("v"), replies.mean("alpha"))
        new.update(self.control_variates_aggregate(replies, slot))
        self.stage_rule.after_round(new, slot.index, self.stage_rounds(slot.stage), gen)
        if slot.kind == STAGE_END:
            new = self.end_stage(new, replies, slot)
        return new

    def end_stage(self, state: Tree, replies: Replies, slot: StageSlot) -> Tree:
        """Form the stage output; it starts the next stage and (usually) is its prox reference."""
        new = dict(state)
        average = None
        if self.stage_rule.sends_sums:  # (1/K) Σ_k (1/T) Σ_t (v_t^k, α_t^k), T = R_s · I_s
            average = tree_scale(1.0 / self.stages.stage_steps(slot.stage), replies.mean("iterate_sum"))
        self.stage_rule.end_stage(new, state, average)
        return new

    # -- CODASCA's hooks (Alg. 4's difference from Alg. 2): CODA+ has no control variates ------
    @property
    def sums_directions(self) -> bool:
        """Whether the local loop keeps ``Σ_t`` of its directions (CODASCA's eq. (7); not CODA+)."""
        return False

    def control_variates_init(self, v: Tree, alpha: Tree) -> dict[str, Any]:
        """Initial control variates of the server and of every client (none)."""
        return {}

    def control_variates_payload(self, server_state: Tree) -> dict[str, Any]:
        """What the broadcast adds to ``(v, α)`` (nothing)."""
        return {}

    def control_variates_shift(self, payload: Mapping[str, Any], state: Tree) -> tuple[Tree | None, Tree | None]:
        """The constant correction of the window's primal and dual directions (none)."""
        return None, None

    def control_variates_update(
        self,
        payload: Mapping[str, Any],
        state: Tree,
        local: LocalWindow,
        slot: StageSlot,
        reply: dict[str, Any],
        new_state: dict[str, Any],
    ) -> None:
        """After the window: the client's new control variates into ``new_state`` / ``reply`` (none)."""

    def control_variates_aggregate(self, replies: Replies, slot: StageSlot) -> dict[str, Any]:
        """The server's new control variates (none)."""
        return {}

    # -- CODA's dual reset (only CODA schedules such rounds) ----------------------------------
    def dual_reset_draw(self, num_samples: Any, rng: ClientRNG) -> Tree:
        raise NotImplementedError(f"{self.name} has no dual-reset rounds")

    def dual_reset_update(self, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree) -> ClientResult:
        raise NotImplementedError(f"{self.name} has no dual-reset rounds")

    def dual_reset_aggregate(self, server_state: Tree, replies: Replies) -> Tree:
        raise NotImplementedError(f"{self.name} has no dual-reset rounds")

    # -- models and evaluation ----------------------------------------------------------------
    def predict(self, params: Tree, x: Tensor) -> Tensor:
        """Scores ``h(w; x)`` of shape ``[N]`` with ``params["model"]``."""
        return self.scores(params["model"], x)

    def global_params(self, server_state: Tree) -> Tree:
        """The current server iterate ``{"model", "a", "b", "alpha"}`` (P17)."""
        return {**server_state["v"], "alpha": server_state["alpha"]}


# ============================================================================================
# CODA (Guo et al. 2020): CODA+ plus the stage-end dual reset from a pooled batch
# ============================================================================================


@dataclass(frozen=True)
class CODA(CODAPlus):
    """CODA: DSG+ stages followed by ``α_0^{s+1} = α*(v_0^{s+1})`` on a pooled batch (spec §2.1).

    After the ``R`` windows of a stage, one ``"dual_reset"`` round broadcasts the new stage's
    model; each client scores ``reset_batch_size`` of its rows and replies the per-class sums
    and counts (:func:`~fedrisk.objectives.auc.class_score_sums`); the server sets ``α = μ⁻ − μ⁺``
    (pooled class means of ``h``; for the margin loss ``max(0, m + μ⁻ − μ⁺)``:
    :func:`~fedrisk.objectives.auc.optimal_dual_from_sums`).  If the pooled batch lacks a class,
    ``α`` is kept.

    Args:
        reset_batch_size: rows each client scores for the pooled dual reset (CODA's "extra
            large batch").
    """

    name: ClassVar[str] = "coda"
    dual_reset_rounds: ClassVar[int] = 1

    reset_batch_size: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("reset_batch_size", self.reset_batch_size, 1)

    def dual_reset_draw(self, num_samples: Any, rng: ClientRNG) -> Tree:
        return {"batch": sample_batch(rng, num_samples, self.reset_batch_size, self.sampling)}

    def dual_reset_update(self, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree) -> ClientResult:
        x, y = data.x[draws["batch"]], data.y[draws["batch"]]
        return ClientResult(class_score_sums(self.scores(payload["model"], x), y)._asdict(), state, {})

    def dual_reset_aggregate(self, server_state: Tree, replies: Replies) -> Tree:
        n_pos, n_neg = replies.sum("pos_count"), replies.sum("neg_count")
        if float(n_pos) == 0 or float(n_neg) == 0:  # a class mean is undefined: keep α
            return dict(server_state)
        margin = self.margin if self.auc_loss == "margin" else None  # α*(v) = μ⁻ − μ⁺ (§1.4)
        alpha = optimal_dual_from_sums(replies.sum("pos_sum"), n_pos, replies.sum("neg_sum"), n_neg, margin=margin)
        old = server_state["alpha"]
        return {**server_state, "alpha": alpha.to(old.dtype).reshape(old.shape)}


# ============================================================================================
# NPA: CODA+ with I = 1 and a local minibatch M (paper §C)
# ============================================================================================


@dataclass(frozen=True)
class NPA(CODAPlus):
    """NPA, the naive parallel (large-minibatch) PPD-SG: CODA+ communicating after every step.

    Identical to :class:`CODAPlus` with ``window = 1``; ``batch_size`` is the local minibatch
    ``M`` of Theorem 3 (large ``M`` gives ``Õ(1/μ)`` communication).
    """

    name: ClassVar[str] = "npa"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window != 1 or self.window_growth != 1.0:
            raise FedriskError(
                f"npa communicates after every local step: window must be 1 and window_growth 1; got "
                f"window = {self.window!r}, window_growth = {self.window_growth!r} (use codaplus for I > 1)"
            )
