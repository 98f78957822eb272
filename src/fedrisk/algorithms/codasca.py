r"""CODA, CODA+, NPA and CODASCA: federated deep AUC maximisation (FDAM).

Yuan, Guo, Xu, Ying & Yang, *Federated Deep AUC Maximization for Heterogeneous Data with a
Constant Communication Complexity*, ICML 2021 (spec ``shared/specs/000_codasca.md``).

The problem is eq. (1), ``min_{v = (w, a, b)} max_α (1/K) Σ_k f_k(v, α)``, with the AUC min-max
objective of eq. (2) (:func:`fedrisk.objectives.auc.auc_square_minmax`; the AUC-margin form of
the official code with ``auc_loss="margin"``).  Every algorithm here is *stagewise*: stage ``s``
approximately solves the strongly-convex / strongly-concave subproblem of eq. (5)

    min_v max_α  f(v, α) + (λ/2) ||v − v_0^s||²,        v_0^s = the output of stage s − 1,

with local stochastic gradient descent-ascent (SGDA) and periodic averaging.  One stage of each:

    DSG+ (Alg. 2; CODA+, CODA, NPA)              DSGSCA+ (Alg. 4; CODASCA)
    every client k: v^k = v_0, α^k = α_0          server: v_0, α_0; c_v = 0, c_α = 0; clients: c_v^k = c_α^k = 0
    for each round r = 1..R:                      for r = 1..R:
      for t = 0..I−1 (fresh minibatch z):           every client k: (v, α) = (v_{r−1}, α_{r−1})
        g_v = ∇_v F_k(v, α; z) + λ(v − v_0)           for t = 0..I−1:
        g_α = ∇_α F_k(v, α; z)                           g_v, g_α as on the left (F_k^s, prox incl.)
        v ← v − η g_v;  α ← α + η g_α                    v ← v − η_l (g_v − c_v^k + c_v)
      average v, α over the clients                      α ← α + η_l (g_α − c_α^k + c_α)
    output: (1/K) Σ_k (1/T) Σ_{t=1..T} (v_t^k, α_t^k)   c_v^k ← c_v^k − c_v + (v_{r−1} − v_I^k)/(I η_l)   eq. (6)
                                                        c_α^k ← c_α^k − c_α + (α_I^k − α_{r−1})/(I η_l)
                                                      c = mean_k c^k;  v̂, α̂ = mean_k (v_I^k, α_I^k)
                                                      v_r = v_{r−1} + η_g (v̂ − v_{r−1})  (α likewise)
                                                    output: (v_r̃, α_r̃), r̃ ~ U{1..R}

* **CODA+** (:class:`CODAPlus`): Alg. 1 + Alg. 2.
* **CODA** (:class:`CODA`, Guo et al. 2020): CODA+ plus, after every stage, the dual reset
  ``α_0^{s+1} = α*(v_0^{s+1}) = E[h | y=−1] − E[h | y=1]`` estimated on a large batch pooled
  from all clients (one extra communication round per stage; spec §2.1).
* **NPA** (:class:`NPA`): CODA+ with ``I = 1`` and a local minibatch of ``M`` (paper §C).
* **CODASCA** (:class:`CODASCA`): Alg. 3 + Alg. 4, control variates on the primal *and* the dual
  and the global step ``η_g``.

Mapping onto the algorithm contract
-----------------------------------
**One contract round = one communication window** of ``I_s`` local steps, so the ledger counts
rounds as the paper does.  The stage schedule is a pure function of the round number and the
hyper-parameters (:meth:`CODAPlus.schedule`), so every party, including ``client_update`` under
``vmap``, knows the static step count of a round from ``ctx.round`` alone:

* a stage has ``R_s = round(R_0 · rounds_growth^s)`` windows, ``R_0 = ceil(stage_iters / window)``
  (``stage_iters`` = the paper's ``T_0``); stage boundaries therefore fall on round boundaries
  (pitfall P8: the learning rate never changes inside a window, so eq. (6) stays exact) and a
  stage lasts ``T_s = R_s · I_s`` steps (``≥ T_0`` for stage 0);
* window of stage ``s`` (from 0): ``I_s = round(window · window_growth^s)``; local step size
  ``η_s = lr / lr_decay^s``.  ``window_growth = 1`` is the experiments' fixed ``I`` with the
  step size divided by 3 every ``T_0`` iterations (§2.6); ``window_growth = lr_decay > 1`` is
  Theorem 2's schedule (``R`` fixed per stage, ``I_s`` growing and ``η_l`` decaying
  geometrically with the same ratio, so ``η̃ = η_l η_g I`` stays constant); ``window_growth =
  rounds_growth = sqrt(lr_decay)`` is Theorem 1's heterogeneous schedule (``I_s ∝ η_s^{-1/2}``,
  ``T_s = R_s I_s ∝ 1/η_s``).  CODASCA warns (:class:`LargeEffectiveStepWarning`) when
  ``η̃ = η_l η_g I`` exceeds :data:`EFFECTIVE_STEP_LIMIT` (the spec's toy diverges at 1.28);
* ``stage_iters=None`` is one endless stage (no decay, a fixed prox reference);
* CODA adds one ``"dual_reset"`` round after the ``R`` windows of every stage.

Round kinds (``RoundPlan.kind``): ``"train"``, ``"stage_end"`` (the last window of a stage; the
server forms the stage output after it) and ``"dual_reset"`` (CODA).

Variables and state
-------------------
The primal is ``v = {"model": w, "a": a, "b": b}`` and the dual ``α`` a 0-dim tensor, all
initialised as in the code (``a = b = α = 0``).  :meth:`CODAPlus.global_params` returns
``{"model", "a", "b", "alpha"}``; :meth:`CODAPlus.predict` scores with ``params["model"]``.

* server: ``v``, ``alpha``; CODASCA ``c_v``, ``c_alpha``; ``stage_output="random"``: the picked
  round ``pick`` and its iterate ``candidate``; ``"last_global_average_ref"``: the prox reference ``ref``.
* client: ``p`` (its positive ratio); ``ref`` = the stage's prox reference ``v_0^s`` (set from the
  broadcast in the stage's first window, so it is never re-sent); CODASCA ``c_v``, ``c_alpha``
  (``c^k``); ``stage_output`` needing the average: ``iterate_sum`` = ``Σ_t (v_t^k, α_t^k)`` of
  the stage so far, sent once, in the stage's last window.

Communication per round (the ledger's bytes): CODA+ sends ``(v, α)`` down and up; CODASCA also
``(c_v, c_α)`` both ways, i.e. twice the bytes (pitfall P16); its last window of a stage uploads
no ``c^k`` when the control variates restart.  With ``stage_output = "average"`` or
``"last_global_average_ref"`` the last window of a stage also uploads the iterate sums (once per
stage); ``"last_local_average_ref"`` keeps them on the client.  CODA's dual-reset round
sends the model down and four scalars up.

Reusing the primal-dual core for another (v, α) game
----------------------------------------------------
:func:`~fedrisk.algorithms.primal_dual.local_sgda`, the control-variate updates and
:func:`~fedrisk.algorithms.primal_dual.extrapolate` live in the shared, objective-free
:mod:`fedrisk.algorithms.primal_dual` (re-exported here).  The classes reach the AUC objective only through the
hooks ``init_primal`` / ``init_dual`` (variables), ``init_objective_state`` (per-client
constants), ``objective_directions`` (the stochastic ``(∇_v F_k, ∇_α F_k)`` of a step),
``dual_projection``, ``check``, ``draw`` and ``predict``; a subclass overriding them runs
CODA+ / CODASCA on any min-max game (the test suite does so for the spec's §7.2 quadratic game).

Resolved ambiguities (spec §2.7, §6)
------------------------------------
* **Prox coefficient** (§2.7-1, P6): ``prox_coef`` is ``λ`` in the *gradient* term
  ``λ(v − v_0)``, i.e. the objective term ``(λ/2)||v − v_0||²`` — eq. (5)'s ``γ`` and the code's
  ``1/gamma``.  The paper's "1/γ ∈ {500, 700, 1000}" means ``prox_coef ∈ {1/500, 1/700, 1/1000}``;
  a coefficient with ``lr · prox_coef ≥ 1`` is rejected.  It applies to ``w``, ``a`` and ``b``,
  never to ``α`` (P5).
* **Stage output** (§2.7-6): ``stage_output`` = ``"average"`` (Alg. 2, default of CODA+, CODA,
  NPA: the time-and-client average of all local iterates, exact), ``"random"`` (Alg. 4, default
  of CODASCA: the server iterate after a uniformly drawn window of the stage), ``"last"`` (the
  last server iterate), ``"last_local_average_ref"`` (the official code's ``update_regularizer``:
  continue from the last server iterate; each client re-centres *its own* prox reference on the
  average of *its own* local iterates over the stage, ``(1/T_s) Σ_t v_t^k``, computed locally and
  never sent) or ``"last_global_average_ref"`` (continue from the last iterate, every client's
  reference = the cross-client stage average, broadcast by the server; the mean of the code's
  per-client references).  The output starts the next stage and (except the last two) is its
  prox reference.  Evaluation always uses the current server iterate (P17).
* **Control variates**: eq. (6) (difference form, default) or eq. (7) (mean of the directions
  used in the window, prox and weight decay included — the paper's ``∇f_k^s``).  They agree
  exactly (to rounding) while the learning rate is constant within the window, which the
  schedule guarantees, and no dual projection is active.  The code averages the *raw*
  gradients (no prox, no weight decay, unclipped); that variant is not offered.  Control
  variates are kept across stages by default, as the paper's experiments and the official code
  do.  ``reset_control_variates=True`` restarts them at zero at every stage as Alg. 4's box
  does: the clients zero ``c^k`` after the stage's last window (and do not send it), the server
  zeros ``c``, so ``c = (1/K) Σ_k c^k`` holds after every communication; the first window of
  every stage is then a plain CODA+ window.  The global ``c`` starts at 0 (§2.7-4).
* **Every round restarts from the broadcast** ``(v_{r−1}, α_{r−1})`` (§2.7-4, P7); ``c^k`` is
  updated with the *old* global ``c``; Alg. 4's "α_{r,t}^k" in the average is read α_{r,I}^k.
* **Extrapolation** (P9): ``v_r = v_{r−1} + η_g (v̂_r − v_{r−1})`` with ``v_{r−1}`` the previous
  *server* iterate; ``η_g = 1`` returns the plain mean exactly.  The extrapolated dual is
  projected like the local one (AUCM: ``α ≥ 0``; ``η_g > 1`` can otherwise leave the set).
* **Client weights** (P11): the server averages uniformly (``1/K``), as eq. (1) does.
  All clients take part in every round (the paper's setting; no partial participation).
* **Positive ratio p** (P3): ``positive_ratio="global"`` (default, :data:`DEFAULT_POSITIVE_RATIO`:
  the mean of the client ratios, i.e. the positive probability of eq. (1)'s client mixture, so
  the federated objective is the pooled AUC surrogate), ``"client"`` (each client its own
  ratio) or ``"given"`` (``p``, e.g. the benchmark's imratio as in the code).  ``p`` is computed
  once from ``FedInfo.class_counts`` and kept in each client's state.
* **Single-class clients**: allowed with the global / given ``p`` (the paper's own ChestXray-IH
  federation has a client with no Edema positives) and reported by a
  :class:`SingleClassClientWarning` naming the client.  Such a client's loss stays finite; its
  gradient in ``a`` (no positives) or ``b`` (no negatives) is zero and its local dual ascent
  pulls ``α`` towards ``h̄/(1−p)`` (no positives) or ``−h̄/p`` (no negatives), ``h̄`` its mean
  score — a drift that averaging (and CODASCA's control variates) correct.  With
  ``positive_ratio="client"`` such a client's ``p_k ∈ {0, 1}`` is an error.
* **Code extras** (P15), all off by default: ``dual_direction="closed_form"`` (the code's
  ``2(m + b − a) − 2α``, i.e. ``∂f/∂α / (p(1−p))`` with ``a, b`` for the class means; for the
  square loss ``2(b − a) − 2α``), ``grad_clip`` (elementwise clamp of the network-weight
  gradients), ``weight_decay`` (``+ wd · v`` on ``w``, ``a``, ``b``), ``auc_loss="margin"``
  (AUCM, with ``α`` projected onto ``[0, ∞)`` after every step; the code clamps to
  ``[0, 999]``).  The code's random-noise initial prox reference is not reproduced: stage 0's
  reference is the initial ``v_0``.
* **Scores**: ``h`` is the model's single output; build it with ``output_activation="sigmoid"``
  as the paper's code does, or set ``sigmoid=True`` to squash a logit model's output (both in
  training and in :meth:`CODAPlus.predict`).
* **CODA's dual reset**: pooled over ``reset_batch_size`` rows drawn on every client (sums and
  counts are sent, not the scores); for the margin loss ``max(0, m + μ⁻ − μ⁺)``.  If the pooled
  batch lacks a class, ``α`` is kept.  CODA's stage output is the Alg. 2 average as in DSG+.

Example:
    >>> import torch
    >>> from fedrisk.data.synthetic import class_split_auc_federation
    >>> from fedrisk.models import FunctionalModel, build_model
    >>> from fedrisk.runtime.simulation import Simulation
    >>> fed = class_split_auc_federation(4, seed=0, num_neg_classes=4, num_pos_classes=4, dim=8,
    ...                                  neg_per_class=40, test_per_class=20)
    >>> model = FunctionalModel(build_model("mlp", (8,), 1, hidden=[8], output_activation="sigmoid"))
    >>> alg = CODASCA(model=model, lr=0.1, window=4, stage_iters=20)
    >>> [alg.schedule(r).kind for r in range(6)]
    ['train', 'train', 'train', 'train', 'stage_end', 'train']
    >>> sim = Simulation(alg, fed, seed=0)
    >>> [sim.step().kind for _ in range(5)][-1], sorted(sim.server_state["v"])
    ('stage_end', ['a', 'b', 'model'])
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.aggregators.base import Replies
from fedrisk.algorithms.base import Algorithm, ClientResult, FedInfo, LocalData, RoundContext, RoundPlan
from fedrisk.algorithms.local import check_sampling, sample_batch, sample_batches
from fedrisk.algorithms.primal_dual import (
    Directions,
    LocalWindow,
    control_variate_difference,
    control_variate_mean,
    extrapolate,
    local_sgda,
    tree_directions,
)
from fedrisk.autodiff import in_functorch_transform, value_and_grad
from fedrisk.errors import FedriskError, check_int, check_range, unknown_name
from fedrisk.objectives.auc import DEFAULT_POSITIVE_RATIO, check_ratio, positive_ratios_from_counts, single_output
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tensor_leaves, tree_add, tree_map, tree_scale, tree_zeros_like

__all__ = [
    "AUC_LOSSES",
    "CODA",
    "CODASCA",
    "CONTROL_VARIATES",
    "DUAL_DIRECTIONS",
    "EFFECTIVE_STEP_LIMIT",
    "NPA",
    "POSITIVE_RATIOS",
    "STAGE_OUTPUTS",
    "AUCDirections",
    "AUCWeights",
    "CODAPlus",
    "LargeEffectiveStepWarning",
    "LocalWindow",
    "SingleClassClientWarning",
    "StageSlot",
    "auc_label_weights",
    "auc_minmax_weighted",
    "auc_minmax_weighted_directions",
    "control_variate_difference",
    "control_variate_mean",
    "extrapolate",
    "local_sgda",
    "tree_directions",
]

AUC_LOSSES = ("square", "margin")
POSITIVE_RATIOS = ("global", "client", "given")
DUAL_DIRECTIONS = ("gradient", "closed_form")
STAGE_OUTPUTS = ("average", "random", "last", "last_local_average_ref", "last_global_average_ref")
EFFECTIVE_STEP_LIMIT = 1.0
"""CODASCA warns (:class:`LargeEffectiveStepWarning`) when ``η̃ = η_l · η_g · I`` exceeds this."""
CONTROL_VARIATES = ("difference", "gradient_mean")

TRAIN, STAGE_END, DUAL_RESET = "train", "stage_end", "dual_reset"


class LargeEffectiveStepWarning(UserWarning):
    """CODASCA's effective step ``η̃ = η_l · η_g · I`` is large: Theorem 2 (Lemma 2) needs
    ``η̃ ≤ min{1/(3ℓ + 3ℓ²/μ_2), μ_2/(40ℓ²)}``, and the spec's deterministic toy (§7.2) already
    diverges at ``η̃ = 1.28`` (the control variates lag one window behind)."""


class SingleClassClientWarning(UserWarning):
    """A client holds a single class; the AUC objective still runs (see the module docstring)."""


# ============================================================================================
# The AUC objective of eq. (2) in the form the local loop evaluates
# ============================================================================================


class AUCWeights(NamedTuple):
    """The label weights of eq. (2)'s batch mean (:func:`auc_label_weights`)."""

    pos: Tensor
    """``(1−p) 1[y=1] / B``."""
    neg: Tensor
    """``p 1[y≠1] / B``."""
    dual: Tensor
    """``neg − pos``: the weights of the α-term ``Σ (p h 1[y≠1] − (1−p) h 1[y=1]) / B``."""
    pq: Tensor
    """``p (1 − p)``."""

    def row(self, t: int) -> AUCWeights:
        """The weights of minibatch ``t`` (of weights computed for ``[I, B]`` labels)."""
        return AUCWeights(self.pos[t], self.neg[t], self.dual[t], self.pq)


def auc_label_weights(labels: Tensor, p: Tensor | float) -> AUCWeights:
    r"""The per-example weights of eq. (2)'s batch mean, which depend on the labels and ``p`` only.

    ``labels`` is ``[..., B]`` (label 1 = positive, any other label negative, as in
    :mod:`fedrisk.objectives.auc`); the mean runs over all ``B`` rows, masked ones included (P4).
    The local loop computes them once for the window's ``I`` minibatches.

    Example:
        >>> import torch
        >>> w = auc_label_weights(torch.tensor([1, 0, 0, 0]), 0.25)
        >>> w.pos.tolist(), w.neg.tolist(), float(w.pq)
        ([0.1875, 0.0, 0.0, 0.0], [0.0, 0.0625, 0.0625, 0.0625], 0.1875)
    """
    p = p if isinstance(p, Tensor) else torch.tensor(p, dtype=torch.get_default_dtype())
    pos = (labels == 1).to(p.dtype)
    n = labels.shape[-1]
    w_pos, w_neg = (1 - p) * pos / n, p * (1 - pos) / n
    return AUCWeights(w_pos, w_neg, w_neg - w_pos, p * (1 - p))


def auc_minmax_weighted(
    h: Tensor, a: Tensor, b: Tensor, alpha: Tensor, w: AUCWeights, margin: float | None = None
) -> Tensor:
    r"""The batch mean of eq. (2) (``margin=None``) or of AUCM (``margin=m``) from label weights.

    With ``w = auc_label_weights(y, p)`` this equals
    :func:`~fedrisk.objectives.auc.auc_square_minmax` (resp. ``auc_margin_minmax``) to rounding::

        mean F   = Σ w⁺ (h − a)² + Σ w⁻ (h − b)² + 2(1 + α) Σ (w⁻ − w⁺) h − p(1−p) α²
        mean F_M = Σ w⁺ (h − a)² + Σ w⁻ (h − b)² + 2α (p(1−p) m + Σ (w⁻ − w⁺) h) − p(1−p) α²

    — the same objective with fewer tensor operations (about 1.5x faster with autograd on a
    small model), which matters because it runs at every local step.

    Example (the spec's §1.6 toy: −0.540625):
        >>> import torch
        >>> one = lambda v: torch.tensor(v, dtype=torch.float64)
        >>> h = one([0.9, 0.2, 0.4, 0.7])
        >>> w = auc_label_weights(torch.tensor([1, -1, -1, 1]), one(0.25))
        >>> round(auc_minmax_weighted(h, one(0.5), one(0.3), one(0.1), w).item(), 10)
        -0.540625
    """
    da, db = h - a, h - b
    quad = torch.dot(w.pos, da * da) + torch.dot(w.neg, db * db)
    lin = torch.dot(w.dual, h)
    if margin is None:
        return quad + 2 * (1 + alpha) * lin - w.pq * alpha * alpha
    return quad + 2 * alpha * (w.pq * margin + lin) - w.pq * alpha * alpha


class AUCDirections(NamedTuple):
    """The value of eq. (2)'s batch mean and its derivatives (:func:`auc_minmax_weighted_directions`)."""

    value: Tensor
    h: Tensor
    """``∂F/∂h``, shape ``[B]``: what back-propagates through the scorer (``∂F/∂w = J_hᵀ ∂F/∂h``)."""
    a: Tensor
    b: Tensor
    alpha: Tensor


def auc_minmax_weighted_directions(
    h: Tensor, a: Tensor, b: Tensor, alpha: Tensor, w: AUCWeights, margin: float | None = None
) -> AUCDirections:
    r"""The value of :func:`auc_minmax_weighted` and its derivatives in closed form (spec §1.4).

    With ``w⁺ = w.pos``, ``w⁻ = w.neg``, ``w^d = w.dual``, ``lin = Σ w^d h`` and ``c = 1 + α``
    (eq. (2)) or ``c = α`` (AUCM)::

        ∂F/∂h_i = 2 w⁺_i (h_i − a) + 2 w⁻_i (h_i − b) + 2c w^d_i
        ∂F/∂a   = −2 Σ w⁺ (h − a)          ∂F/∂b = −2 Σ w⁻ (h − b)
        ∂F/∂α   = 2 lin − 2p(1−p) α                      (eq. (2))
                = 2 (p(1−p) m + lin) − 2p(1−p) α          (AUCM)

    The local loop back-propagates only ``∂F/∂h`` through the scorer
    (``torch.autograd.grad(h, w, grad_outputs=∂F/∂h)``): the objective's own graph and the three
    scalar leaves ``a``, ``b``, ``α`` never enter autograd, which is what makes a CODA+ / CODASCA
    step about as cheap as an SGD step on the cross-entropy.  The value is computed by exactly the
    operations of :func:`auc_minmax_weighted` (the same number), and the derivatives repeat the
    arithmetic autograd performs through it (``2·x`` is exact, so ``2 w⁺ (h − a)`` is ``2 (w⁺
    (h − a))`` to the bit), so they are *bitwise* equal to autograd's (second example; checked on
    1,200 random float32 / float64 batches).  ``h`` must not require grad.

    Example (the spec's §1.6 toy; ∂F/∂α = 2 Σ w^d h − 2p(1−p)α):
        >>> import torch
        >>> one = lambda v: torch.tensor(v, dtype=torch.float64)
        >>> w = auc_label_weights(torch.tensor([1, -1, -1, 1]), one(0.25))
        >>> d = auc_minmax_weighted_directions(one([0.9, 0.2, 0.4, 0.7]), one(0.5), one(0.3), one(0.1), w)
        >>> round(d.value.item(), 10), round(d.a.item(), 10), round(d.alpha.item(), 10)
        (-0.540625, -0.225, -0.5625)
        >>> [round(g, 10) for g in d.h.tolist()]
        [-0.2625, 0.125, 0.15, -0.3375]

    The same bits as autograd through :func:`auc_minmax_weighted` (eq. (2) and AUCM):
        >>> g = torch.Generator().manual_seed(0)
        >>> h, y = torch.rand(32, generator=g), torch.randint(2, (32,), generator=g)
        >>> w, s = auc_label_weights(y, torch.tensor(0.2)), torch.randn(3, generator=g)
        >>> for m in (None, 1.0):
        ...     leaves = [h.clone().requires_grad_(True), *(x.clone().requires_grad_(True) for x in s)]
        ...     value = auc_minmax_weighted(*leaves, w, m)
        ...     auto = torch.autograd.grad(value, leaves)
        ...     d = auc_minmax_weighted_directions(h, *s, w, m)
        ...     print(torch.equal(value.detach(), d.value), all(map(torch.equal, auto, (d.h, d.a, d.b, d.alpha))))
        True True
        True True
    """
    da, db = h - a, h - b
    lin = torch.dot(w.dual, h)
    pq_alpha = w.pq * alpha
    # the value: auc_minmax_weighted's operations, in its order
    quad = torch.dot(w.pos, da * da) + torch.dot(w.neg, db * db)
    if margin is None:
        c2 = 2 * (1 + alpha)
        value = quad + c2 * lin - pq_alpha * alpha
        g_alpha = 2 * lin - 2 * pq_alpha
    else:
        c2 = 2 * alpha
        value = quad + c2 * (w.pq * margin + lin) - pq_alpha * alpha
        g_alpha = 2 * (w.pq * margin + lin) - 2 * pq_alpha
    # the derivatives; 2·x is exact, so 2 w⁺ (h − a) = 2 (w⁺ (h − a)) to the bit
    u, v = w.pos * da, w.neg * db
    g_h = torch.add(2 * (u + v), c2 * w.dual)
    return AUCDirections(value, g_h, -2 * u.sum(), -2 * v.sum(), g_alpha)


# ============================================================================================
# The stage schedule
# ============================================================================================


class StageSlot(NamedTuple):
    """Where a round falls in the stage schedule (a pure function of the round number)."""

    stage: int
    """``s``, counted from 0."""
    index: int
    """The round's position within its stage (0 = the stage's first window)."""
    steps: int
    """Local steps ``I_s`` of the round (0 for CODA's dual-reset round)."""
    lr: float
    """The local step size ``η_s`` of the stage."""
    kind: str
    """``"train"``, ``"stage_end"`` or ``"dual_reset"``."""


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
    needs every client's counts); the policy itself is :func:`~fedrisk.objectives.auc.positive_ratios_from_counts`."""
    ratios = positive_ratios_from_counts(choice, class_counts, given=given, name=name)  # type: ignore[arg-type]
    return ratios if choice != "given" else ratios[:1] * num_clients


# ============================================================================================
# CODA+ (Alg. 1 + Alg. 2): the family's base class
# ============================================================================================


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
            ``"last_global_average_ref"`` (module docstring).
        batch_size: local minibatch size (paper: 32).
        sampling: ``"with_replacement"`` or ``"shuffle"`` minibatches.
        auc_loss: ``"square"`` (eq. (2), the paper) or ``"margin"`` (AUCM, the code).
        margin: the AUCM margin ``m`` (``auc_loss="margin"`` and the closed-form dual direction).
        positive_ratio: ``"global"`` (default), ``"client"`` or ``"given"`` (see the module doc).
        p: the positive ratio for ``positive_ratio="given"``, in (0, 1).
        dual_direction: ``"gradient"`` (the paper's ``∇_α F``) or ``"closed_form"`` (the code).
        grad_clip: clamp the network-weight gradients elementwise to ``±grad_clip`` (code: 1).
        weight_decay: add ``weight_decay · v`` to the primal direction (code: 1e-5).
        sigmoid: apply a sigmoid to the model output to get the score ``h``.
    """

    name: ClassVar[str] = "codaplus"
    batched_draw: ClassVar[bool] = True
    uses_control_variates: ClassVar[bool] = False
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

    # -- the stage schedule (pure functions of the round number) ---------------------------
    def rounds_per_stage(self) -> int | None:
        """``R_0 = ceil(T_0 / I_0)`` windows in the first stage (None: one endless stage)."""
        if self.stage_iters is None:
            return None
        return -(-self.stage_iters // self.window)

    def stage_rounds(self, stage: int) -> int:
        """``R_s = round(R_0 · rounds_growth^s)`` windows in stage ``s`` (1 for an endless stage).

        Example (Theorem 1, heterogeneous: ``I_s`` and ``R_s`` grow by ``sqrt(3)`` while ``η_s`` falls by 3):
            >>> alg = CODAPlus(model=None, window=4, stage_iters=16, window_growth=3**0.5, rounds_growth=3**0.5)
            >>> [(alg.stage_rounds(s), alg.stage_window(s)) for s in range(3)]
            [(4, 4), (7, 7), (12, 12)]
        """
        R = self.rounds_per_stage()
        if R is None:
            return 1
        if self.rounds_growth == 1.0:
            return R
        return max(1, round(R * self.rounds_growth**stage))

    def stage_window(self, stage: int) -> int:
        """``I_s = round(window · window_growth^s)``."""
        if self.window_growth == 1.0:
            return self.window
        try:
            steps = self.window * self.window_growth**stage
        except OverflowError:
            steps = math.inf
        if steps > 2**40:
            raise FedriskError(f"{self.name}: the window of stage {stage} overflows (window_growth too large)")
        return max(1, round(steps))

    def stage_lr(self, stage: int) -> float:
        """``η_s = lr / lr_decay^s``."""
        return self.lr / self.lr_decay**stage

    def schedule(self, round: int) -> StageSlot:
        """The stage, window position, local steps, step size and kind of ``round``.

        Example:
            >>> alg = CODAPlus(model=None, window=2, stage_iters=5, lr=0.3)
            >>> alg.schedule(2), alg.schedule(3).stage, alg.schedule(3).lr
            (StageSlot(stage=0, index=2, steps=2, lr=0.3, kind='stage_end'), 1, 0.09999999999999999)
        """
        R = self.rounds_per_stage()
        if R is None:
            return StageSlot(0, round, self.window, self.lr, TRAIN)
        if self.rounds_growth == 1.0:
            stage, index = divmod(round, R + self.dual_reset_rounds)
        else:  # stages of growing length: walk them (a handful)
            stage, index = 0, round
            while index >= (R := self.stage_rounds(stage)) + self.dual_reset_rounds:
                index -= R + self.dual_reset_rounds
                stage += 1
        if index >= R:
            return StageSlot(stage, index, 0, self.stage_lr(stage), DUAL_RESET)
        kind = STAGE_END if index == R - 1 else TRAIN
        return StageSlot(stage, index, self.stage_window(stage), self.stage_lr(stage), kind)

    @property
    def _staged(self) -> bool:
        return self.stage_iters is not None

    @property
    def _tracks_average(self) -> bool:
        if self.stage_output == "last_local_average_ref":
            return self._local_ref
        return self._staged and self.stage_output in ("average", "last_global_average_ref")

    @property
    def _local_ref(self) -> bool:
        """The code's rule: each client re-centres its prox on its own stage average."""
        return self._staged and self.stage_output == "last_local_average_ref" and self.prox_coef > 0

    @property
    def _keeps_candidate(self) -> bool:
        return self._staged and self.stage_output == "random"

    @property
    def _resets_control_variates(self) -> bool:
        return False

    @property
    def _control_variate_form(self) -> str:
        return "difference"

    @property
    def _server_ref(self) -> bool:
        return self._staged and self.stage_output == "last_global_average_ref" and self.prox_coef > 0

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
            if self.dual_direction == "closed_form":
                # the code's 2(m + b − a) − 2α (auc_dual_closed_form_direction; m = 0 for eq. (2)'s α)
                g_a = [2 * ((margin or 0.0) + xs[n + 1] - xs[n]) - 2 * ys[0]]
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

    def init_server(self, ctx: RoundContext, params: Tree, gen: torch.Generator) -> Tree:
        v, alpha = self.init_primal(params), self.init_dual(params)
        state: dict[str, Any] = {"v": v, "alpha": alpha}
        if self.uses_control_variates:  # global c_v = 0, c_α = 0 (§2.7-4)
            state["c_v"], state["c_alpha"] = tree_zeros_like(v), tree_zeros_like(alpha)
        if self._keeps_candidate:
            state["pick"] = torch.zeros((), dtype=torch.int64)
            state["candidate"] = {"v": v, "alpha": alpha}
        if self._server_ref:
            state["ref"] = v
        return state

    def init_client(self, ctx: RoundContext, client: int, params: Tree) -> Tree:
        state = dict(self.init_objective_state(ctx, client, params))
        v, alpha = self.init_primal(params), self.init_dual(params)
        if self.prox_coef > 0:
            state["ref"] = v
        if self.uses_control_variates:  # c_v^k = 0, c_α^k = 0 (Alg. 4)
            state["c_v"], state["c_alpha"] = tree_zeros_like(v), tree_zeros_like(alpha)
        if self._tracks_average:
            state["iterate_sum"] = {"v": tree_zeros_like(v), "alpha": tree_zeros_like(alpha)}
        return state

    # -- one round: the server's broadcast ---------------------------------------------------
    def configure(self, ctx: RoundContext, server_state: Tree, gen: torch.Generator) -> RoundPlan:
        slot = self.schedule(ctx.round)
        clients = list(range(ctx.fed.num_clients))  # every client, every round (the paper's setting)
        if slot.kind == DUAL_RESET:
            return RoundPlan(clients, {"model": server_state["v"]["model"]}, kind=DUAL_RESET)
        broadcast = {"v": server_state["v"], "alpha": server_state["alpha"]}  # (v_{r−1}, α_{r−1})
        if self.uses_control_variates:
            broadcast["c_v"], broadcast["c_alpha"] = server_state["c_v"], server_state["c_alpha"]
        if slot.index == 0 and "ref" in server_state:  # a prox reference other than the start point
            broadcast["ref"] = server_state["ref"]
        return RoundPlan(clients, broadcast, kind=slot.kind)

    def draw(self, ctx: RoundContext, client: Any, num_samples: Any, rng: ClientRNG) -> Tree:
        slot = self.schedule(ctx.round)
        if slot.kind == DUAL_RESET:
            return self.dual_reset_draw(num_samples, rng)
        return {"batches": sample_batches(rng, num_samples, slot.steps, self.batch_size, self.sampling)}

    # -- one round: a client's window (Alg. 2 / Alg. 4) ----------------------------------------
    def client_update(
        self, ctx: RoundContext, payload: Mapping[str, Any], state: Tree, data: LocalData, draws: Tree
    ) -> ClientResult:
        slot = self.schedule(ctx.round)
        if slot.kind == DUAL_RESET:
            return self.dual_reset_update(payload, state, data, draws)
        new_state = dict(state)
        first = slot.index == 0
        # every window starts from the server's (v_{r−1}, α_{r−1}) (Alg. 4, §2.7-4, P7)
        v0, alpha0 = payload["v"], payload["alpha"]
        # the stage's prox reference v_0^s: taken from the stage's first broadcast, then kept
        ref = None
        if self.prox_coef > 0:  # (the code's rule keeps each client's own reference from stage 1 on)
            ref = payload.get("ref", v0) if first and not (self._local_ref and slot.stage > 0) else state["ref"]
            new_state["ref"] = ref
        # CODASCA's correction −c^k + c, constant through the window
        shift_v = shift_a = c_k_v = c_k_a = None
        if self.uses_control_variates:
            c_k_v, c_k_a = state["c_v"], state["c_alpha"]
            shift_v = tree_map(torch.sub, payload["c_v"], c_k_v)
            shift_a = tree_map(torch.sub, payload["c_alpha"], c_k_a)
        eq7 = self.uses_control_variates and self._control_variate_form == "gradient_mean"
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
            shift_alpha=shift_a,
            project_dual=self.dual_projection(),
            sum_directions=eq7,
            sum_iterates=self._tracks_average,
        )
        reply: dict[str, Any] = {"v": local.v, "alpha": local.alpha}
        if self.uses_control_variates:
            if eq7:  # eq. (7): the mean of the directions used in the window
                assert local.direction_sum is not None
                c_k_v = control_variate_mean(local.direction_sum[0], slot.steps)
                c_k_a = control_variate_mean(local.direction_sum[1], slot.steps)
            else:  # eq. (6), with the old global c
                c_k_v = control_variate_difference(c_k_v, payload["c_v"], v0, local.v, slot.steps, slot.lr)
                c_k_a = control_variate_difference(
                    c_k_a, payload["c_alpha"], alpha0, local.alpha, slot.steps, slot.lr, ascent=True
                )
            if slot.kind == STAGE_END and self._resets_control_variates:
                # Alg. 4 restarts every stage with c^k = 0 (and c = 0 on the server): nothing to send
                c_k_v, c_k_a = tree_zeros_like(c_k_v), tree_zeros_like(c_k_a)
            else:
                reply["c_v"], reply["c_alpha"] = c_k_v, c_k_a
            new_state["c_v"], new_state["c_alpha"] = c_k_v, c_k_a
        if self._tracks_average:  # Σ_{t} (v_t^k, α_t^k) over the stage so far (Alg. 2's output)
            assert local.iterate_sum is not None
            window_sum = {"v": local.iterate_sum[0], "alpha": local.iterate_sum[1]}
            running = window_sum if first else tree_add(state["iterate_sum"], window_sum)
            if slot.kind == STAGE_END:
                if self._local_ref:  # the code's update_regularizer: v_0^{s+1,k} = (1/T_s) Σ_t v_t^k
                    new_state["ref"] = tree_scale(1.0 / (self.stage_rounds(slot.stage) * slot.steps), running["v"])
                else:
                    reply["iterate_sum"] = running
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
        if self.uses_control_variates and not (slot.kind == STAGE_END and self._resets_control_variates):
            new["c_v"], new["c_alpha"] = replies.mean("c_v"), replies.mean("c_alpha")  # c = (1/K) Σ_k c^k
        if self._keeps_candidate:  # Alg. 4's output (v_r̃, α_r̃), r̃ ~ U{1..R}, drawn at the stage start
            if slot.index == 0:
                new["pick"] = torch.randint(self.stage_rounds(slot.stage), (), generator=gen)
            if slot.index == int(new["pick"]):
                new["candidate"] = {"v": new["v"], "alpha": new["alpha"]}
        if slot.kind == STAGE_END:
            new = self.end_stage(new, replies, slot)
        return new

    def end_stage(self, state: Tree, replies: Replies, slot: StageSlot) -> Tree:
        """Form the stage output; it starts the next stage and (usually) is its prox reference."""
        new = dict(state)
        average = None
        if self._tracks_average and not self._local_ref:  # (1/K) Σ_k (1/T) Σ_t (v_t^k, α_t^k), T = R_s · I_s
            total = replies.mean("iterate_sum")
            average = tree_scale(1.0 / (self.stage_rounds(slot.stage) * slot.steps), total)
        if self.stage_output == "average":
            assert average is not None
            new["v"], new["alpha"] = average["v"], average["alpha"]
        elif self.stage_output == "random":
            new["v"], new["alpha"] = state["candidate"]["v"], state["candidate"]["alpha"]
        elif self.stage_output == "last_global_average_ref" and "ref" in new:
            assert average is not None
            new["ref"] = average["v"]
        if self.uses_control_variates and self._resets_control_variates:
            new["c_v"], new["c_alpha"] = tree_zeros_like(new["c_v"]), tree_zeros_like(new["c_alpha"])
        return new

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
    and counts; the server sets ``α = μ⁻ − μ⁺`` (pooled class means of ``h``; for the margin
    loss ``max(0, m + μ⁻ − μ⁺)``; cf. :func:`fedrisk.objectives.auc.optimal_dual`).

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
        h = self.scores(payload["model"], x)
        pos = (y == 1).to(h.dtype)
        neg = 1 - pos
        reply = {"pos_sum": (h * pos).sum(), "pos_count": pos.sum(), "neg_sum": (h * neg).sum(), "neg_count": neg.sum()}
        return ClientResult(reply, state, {})

    def dual_reset_aggregate(self, server_state: Tree, replies: Replies) -> Tree:
        n_pos, n_neg = replies.sum("pos_count"), replies.sum("neg_count")
        if float(n_pos) == 0 or float(n_neg) == 0:  # a class mean is undefined: keep α
            return dict(server_state)
        alpha = replies.sum("neg_sum") / n_neg - replies.sum("pos_sum") / n_pos  # α*(v) = μ⁻ − μ⁺ (§1.4)
        if self.auc_loss == "margin":
            alpha = torch.clamp(self.margin + alpha, min=0)
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


# ============================================================================================
# CODASCA (Alg. 3 + Alg. 4): control variates on the primal and the dual, global step η_g
# ============================================================================================


@dataclass(frozen=True)
class CODASCA(CODAPlus):
    """CODASCA: DSGSCA+ stages (Alg. 4) — CODA+ with SCAFFOLD-style control variates on
    ``v = (w, a, b)`` and on ``α``, and the server extrapolation ``η_g``.

    Args:
        global_lr: ``η_g`` (1 = plain averaging; the paper tunes {1.1, 1, 0.99, 0.999}; Theorem
            2 uses ``sqrt(K)``).
        control_variate: ``"difference"`` (eq. (6), default) or ``"gradient_mean"`` (eq. (7)).
        reset_control_variates: restart ``c``, ``c^k`` at 0 at every stage, as Alg. 4's box does
            (then the first window of every stage is a plain CODA+ window).  Off by default: the
            paper's experiments and the official code never reset them.
        stage_output: defaults to ``"random"`` (Alg. 4's output).
    """

    name: ClassVar[str] = "codasca"
    uses_control_variates: ClassVar[bool] = True

    stage_output: str = "random"
    global_lr: float = 1.0
    control_variate: str = "difference"
    reset_control_variates: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("global_lr", self.global_lr, 0.0, None, low_inclusive=False)
        if self.control_variate not in CONTROL_VARIATES:
            raise unknown_name("control_variate", self.control_variate, CONTROL_VARIATES)
        # η̃_s = η_s · η_g · I_s: constant over the stages when window_growth = lr_decay (Theorem 2)
        growth = self.window_growth / self.lr_decay if self._staged else 1.0
        eta_tilde = self.lr * self.global_lr * self.window
        if eta_tilde > EFFECTIVE_STEP_LIMIT or growth > 1.0:
            warnings.warn(
                f"{self.name}: the effective step eta_tilde = lr * global_lr * window = {self.lr!r} * "
                f"{self.global_lr!r} * {self.window} = {eta_tilde:.4g}"
                + (f" (growing by {growth:.4g} per stage)" if growth > 1.0 else "")
                + f" exceeds {EFFECTIVE_STEP_LIMIT}: Theorem 2 needs eta_tilde <= min(1/(3l + 3l^2/mu_2), "
                "mu_2/(40 l^2)) and the spec's heterogeneous toy diverges at 1.28; CODASCA may oscillate or "
                "diverge. Lower lr or window (or keep window_growth <= lr_decay)",
                LargeEffectiveStepWarning,
                stacklevel=3,
            )

    @property
    def _resets_control_variates(self) -> bool:
        return self.reset_control_variates

    @property
    def _control_variate_form(self) -> str:
        return self.control_variate

    def server_step(self, server_state: Tree, v_mean: Tree, alpha_mean: Tree) -> tuple[Tree, Tree]:
        """``v_r = v_{r−1} + η_g (v̂_r − v_{r−1})``, ``α_r = Π(α_{r−1} + η_g (α̂_r − α_{r−1}))`` (Alg. 4).

        ``Π`` is the dual's projection (AUCM: onto ``α ≥ 0``): with ``η_g > 1`` the extrapolation
        can leave the feasible set (``α_{r−1} = 0.5``, ``α̂_r = 0``, ``η_g = 1.5`` give ``−0.25``);
        an average of feasible values (``η_g ≤ 1``) never does, and projecting it changes nothing.
        """
        alpha = extrapolate(server_state["alpha"], alpha_mean, self.global_lr)
        project = self.dual_projection()
        return extrapolate(server_state["v"], v_mean, self.global_lr), (alpha if project is None else project(alpha))
