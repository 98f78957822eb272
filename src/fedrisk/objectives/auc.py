r"""AUC min-max objectives: the square-loss saddle form of eq. (2) and the AUC-margin (AUCM) form.

These are the local objectives of federated deep AUC maximisation (Yuan, Guo, Xu, Ying & Yang,
*Federated Deep AUC Maximization for Heterogeneous Data with a Constant Communication
Complexity*, ICML 2021; CODA+ / CODASCA).  The federated problem is eq. (1)::

    min_{w, a, b} max_{α}  f(w, a, b, α) = (1/K) Σ_k f_k(w, a, b, α),
    f_k = E_{z ~ P_k}[ F(w, a, b, α; z) ]

with the per-example objective of eq. (2) (Ying et al., 2016)::

    F(w,a,b,α; z) = (1−p)(h − a)² 1[y=1] + p (h − b)² 1[y=−1]
                    + 2(1+α)( p h 1[y=−1] − (1−p) h 1[y=1] ) − p(1−p) α²

where ``h = h(w; x)`` is the model's scalar score, ``a`` and ``b`` are primal scalars (minimised
together with ``w``), ``α`` is the dual scalar (maximised) and ``p`` is the positive ratio.

Conventions used throughout this module
---------------------------------------
* **Labels** may be coded ``{0, 1}`` or ``{−1, +1}``; the positive class is the label ``1`` in both
  codings and every other label counts as negative.  The loss functions do *not* validate labels
  (see below); call :func:`check_binary_labels` once at set-up.
* **Batch mean over all examples** (spec pitfall P4): each loss returns the mean of ``F`` over the
  whole batch, the masked terms included, i.e. the unbiased estimate of ``E[F]`` -- not a mean over
  the positives alone.
* **Hot-path safety**: the loss functions are branch-free tensor code (only *shape* checks, which
  are static), so they work under :func:`torch.func.vmap` and :func:`torch.func.grad`.  The value
  checks :func:`check_ratio` and :func:`check_binary_labels` inspect tensor *values* (data-dependent
  Python control flow, which breaks ``vmap``) and must be called once at set-up, never per step.
* **Single-class batches** are fine: with no positives (or no negatives) in a batch the masked terms
  vanish and the loss stays finite.  The gradient with respect to ``a`` (resp. ``b``) is then zero,
  and the ascent direction on ``α`` becomes, with ``h̄`` the batch mean score,

  - no negatives: ``∂F/∂α = −2(1−p) h̄ − 2p(1−p) α``, which pulls ``α`` towards ``−h̄/p``
    (*downwards* for non-negative scores, e.g. sigmoid outputs, whenever ``α ≥ 0``);
  - no positives: ``∂F/∂α = 2p h̄ − 2p(1−p) α``, which pulls ``α`` towards ``h̄/(1−p)``
    (*upwards* while ``α < h̄/(1−p)``, e.g. for non-negative scores whenever ``α ≤ 0``).

  For the AUCM form the targets are ``m − h̄/p`` (no negatives) and ``m + h̄/(1−p)`` (no
  positives).  Only :func:`optimal_dual`, which needs both class means, returns NaN then.

Two evaluations of the same objectives
--------------------------------------
* :func:`auc_square_minmax` / :func:`auc_margin_minmax`: the per-example formulas (reference
  forms, differentiable by autograd / ``torch.func``).
* :func:`auc_minmax_weighted` (with :func:`auc_label_weights`): the batch mean from label weights
  computed once per window, and :func:`auc_minmax_weighted_directions`, its value and derivatives
  in closed form, bitwise equal to autograd's — what the CODA+ / CODASCA local loop evaluates.

Set-up (label checks, the choice of ``p``, spec pitfall P3) lives in
:mod:`fedrisk.objectives.auc_setup` (``class_count_pairs`` is re-exported here); the recommended ``p`` is
``"global"``: one constant shared by all clients, the positive ratio of the federation's mixture.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from fedrisk.errors import FedriskError
from fedrisk.objectives.auc_setup import Scalar, class_count_pairs

__all__ = [
    "AUCDirections",
    "AUCWeights",
    "Scalar",
    "auc_dual_closed_form",
    "auc_dual_closed_form_direction",
    "auc_label_weights",
    "auc_margin_minmax",
    "auc_minmax_weighted",
    "auc_minmax_weighted_directions",
    "auc_square_minmax",
    "class_count_pairs",
    "class_score_sums",
    "optimal_dual",
    "optimal_dual_from_sums",
    "single_output",
]


def single_output(out: Tensor, who: str) -> Tensor:
    """A scorer's outputs ``[N]`` or ``[N, 1]`` as ``[N]`` (the AUC and X-risk objectives score one
    number per example); several outputs per example are an error naming ``who``.

    Example:
        >>> single_output(torch.tensor([[0.5], [2.0]]), "codaplus").tolist()
        [0.5, 2.0]
    """
    if out.dim() == 2:
        if out.shape[1] != 1:
            raise FedriskError(
                f"{who}: the objective needs a one-output scorer; the model returns {out.shape[1]} "
                "outputs per sample (build it with num_outputs = 1)"
            )
        out = out[:, 0]
    return out


# --------------------------------------------------------------------------------------------
# hot-path helpers (shape checks only: static under vmap)
# --------------------------------------------------------------------------------------------


def _as_vector(x: Tensor, name: str) -> Tensor:
    """``[N]`` or ``[N, 1]`` -> ``[N]``; anything else is a user error (a static shape check)."""
    if not isinstance(x, Tensor):
        raise FedriskError(f"{name} must be a tensor of shape [N] or [N, 1]; got {type(x).__name__}")
    if x.dim() == 2 and x.shape[1] == 1:
        return x[:, 0]
    if x.dim() != 1:
        raise FedriskError(f"{name} must have shape [N] or [N, 1]; got {tuple(x.shape)}")
    return x


def _scores_and_masks(scores: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    h = _as_vector(scores, "scores")
    y = _as_vector(labels, "labels")
    if h.shape[0] != y.shape[0]:
        raise FedriskError(f"scores and labels must have the same length; got {h.shape[0]} and {y.shape[0]}")
    if not h.is_floating_point():
        raise FedriskError(f"scores must be a floating-point tensor; got dtype {h.dtype}")
    pos = (y == 1).to(h.dtype)
    return h, pos, 1 - pos


def _scalar(x: Scalar, name: str) -> Scalar:
    """Numbers pass through; one-element tensors become 0-dim (keeping autograd / vmap)."""
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise FedriskError(f"{name} must be a scalar; got a tensor of shape {tuple(x.shape)}")
        return x.reshape(())
    return x


def _reduce(per_example: Tensor, reduction: Literal["mean", "none"]) -> Tensor:
    if reduction == "mean":
        return per_example.mean()
    if reduction == "none":
        return per_example
    raise FedriskError(f"unknown reduction {reduction!r}. Valid choices: mean, none")


# --------------------------------------------------------------------------------------------
# objectives
# --------------------------------------------------------------------------------------------


def auc_square_minmax(
    scores: Tensor,
    labels: Tensor,
    a: Scalar,
    b: Scalar,
    alpha: Scalar,
    p: Scalar,
    *,
    reduction: Literal["mean", "none"] = "mean",
) -> Tensor:
    r"""The AUC square-loss min-max objective of eq. (2), averaged over the whole batch.

    Per example ``z = (x, y)`` with score ``h``::

        F = (1−p)(h − a)² 1[y=1] + p (h − b)² 1[y=−1]
            + 2(1+α)( p h 1[y=−1] − (1−p) h 1[y=1] ) − p(1−p) α²

    and the returned value is ``(1/N) Σ_i F(z_i)`` over *all* ``N`` examples (masked terms
    included: pitfall P4).  Minimise over the model, ``a`` and ``b``; maximise over ``α``
    (simultaneous descent-ascent).  Derivatives (spec §1.4)::

        ∂F/∂a = −2(1−p)(h − a) 1[y=1]          ∂F/∂b = −2p(h − b) 1[y=−1]
        ∂F/∂α = 2( p h 1[y=−1] − (1−p) h 1[y=1] ) − 2p(1−p) α,   ∂²F/∂α² = −2p(1−p)

    When ``p`` is the positive ratio of the data, the saddle point for a fixed scorer is
    ``a* = mean(h|+)``, ``b* = mean(h|−)``, ``α* = b* − a*`` (:func:`optimal_dual`), with value
    ``p(1−p)(mean over (+, −) pairs of (1 − h⁺ + h⁻)² − 1)``.

    Args:
        scores: model scores ``h``, shape ``[N]`` or ``[N, 1]``, floating point.
        labels: ``{0, 1}`` or ``{−1, +1}``, shape ``[N]`` or ``[N, 1]``; ``1`` is positive.  Not
            validated here (see :func:`check_binary_labels`).
        a, b: primal scalars (floats or one-element tensors; differentiable when tensors).
        alpha: dual scalar ``α`` (unconstrained in eq. (2)).
        p: positive ratio in (0, 1), float or 0-dim tensor; not validated here (see
            :func:`check_ratio` and :data:`PositiveRatio`).
        reduction: ``"mean"`` (default, the batch mean) or ``"none"`` (per-example ``F``).

    Returns:
        A 0-dim tensor (``[N]`` with ``reduction="none"``) in the dtype of ``scores``.

    Branch-free apart from static shape checks: safe under ``torch.func.vmap`` / ``grad``.
    A batch with a single class is well defined (see the module docstring).

    Example (the worked toy value of the spec, §1.6):
        >>> h = torch.tensor([0.9, 0.2, 0.4, 0.7], dtype=torch.float64)
        >>> y = torch.tensor([1, -1, -1, 1])
        >>> round(auc_square_minmax(h, y, a=0.5, b=0.3, alpha=0.1, p=0.25).item(), 10)
        -0.540625
        >>> y01 = torch.tensor([1, 0, 0, 1])
        >>> round(auc_square_minmax(h, y01, a=0.5, b=0.3, alpha=0.1, p=0.25).item(), 10)
        -0.540625
    """
    h, pos, neg = _scores_and_masks(scores, labels)
    a, b, alpha, p = (_scalar(v, n) for v, n in ((a, "a"), (b, "b"), (alpha, "alpha"), (p, "p")))
    q = 1 - p
    per_example = (
        q * (h - a) ** 2 * pos
        + p * (h - b) ** 2 * neg
        + 2 * (1 + alpha) * (p * h * neg - q * h * pos)
        - p * q * alpha**2
    )
    return _reduce(per_example, reduction)


def auc_margin_minmax(
    scores: Tensor,
    labels: Tensor,
    a: Scalar,
    b: Scalar,
    alpha: Scalar,
    p: Scalar,
    margin: Scalar = 1.0,
    *,
    reduction: Literal["mean", "none"] = "mean",
) -> Tensor:
    r"""The AUC-margin (AUCM) min-max objective (spec §1.5; Yuan et al., ICCV 2021, ref. [49]).

    This is the form the official CODASCA code optimises.  Per example, with margin ``m``::

        F_M = (1−p)(h − a)² 1[y=1] + p (h − b)² 1[y=−1]
              + 2α( p(1−p) m + p h 1[y=−1] − (1−p) h 1[y=1] ) − p(1−p) α²

    averaged over the whole batch.  The AUCM problem restricts the dual to ``α ≥ 0``: **this
    function is the plain formula and does not enforce it** -- the optimiser must project ``α``
    onto ``[0, ∞)`` after every ascent step (the official code clamps to ``[0, 999]``).

    Relations (exact, for any ``p``): with ``m = 1`` and no constraint,
    ``F_paper(α) = F_M(α + 1) − p(1−p)`` (:func:`auc_square_minmax`), i.e. the same problem with
    the dual shifted by 1.  With ``α ≥ 0`` and ``p`` the data's positive ratio, the optimum is at
    ``a* = μ⁺``, ``b* = μ⁻``, ``α* = max(0, m − μ⁺ + μ⁻)`` with value
    ``p(1−p)(Var⁺ + Var⁻ + (m − μ⁺ + μ⁻)₊²)`` (population variances).

    Args:
        scores, labels, a, b, alpha, p, reduction: as in :func:`auc_square_minmax`.
        margin: the margin ``m`` (default 1.0, as in the official code).

    Example (the spec's toy, with ``α_M = α + 1 = 1.1``):
        >>> h = torch.tensor([0.9, 0.2, 0.4, 0.7], dtype=torch.float64)
        >>> y = torch.tensor([1, -1, -1, 1])
        >>> round(auc_margin_minmax(h, y, a=0.5, b=0.3, alpha=1.1, p=0.25).item(), 10)
        -0.353125
    """
    h, pos, neg = _scores_and_masks(scores, labels)
    a, b, alpha, p = (_scalar(v, n) for v, n in ((a, "a"), (b, "b"), (alpha, "alpha"), (p, "p")))
    margin = _scalar(margin, "margin")
    q = 1 - p
    per_example = (
        q * (h - a) ** 2 * pos
        + p * (h - b) ** 2 * neg
        + 2 * alpha * (p * q * margin + p * h * neg - q * h * pos)
        - p * q * alpha**2
    )
    return _reduce(per_example, reduction)


def auc_dual_closed_form_direction(
    scores: Tensor,
    labels: Tensor,
    a: Scalar,
    b: Scalar,
    alpha: Scalar,
    margin: Scalar = 1.0,
) -> Tensor:
    r"""The official code's dual ascent direction for AUCM: ``2(m + b − a) − 2α`` (spec §2.7-12).

    An *option*, not the paper's method.  With ``p`` the batch's positive ratio, the exact batch
    gradient of :func:`auc_margin_minmax` is::

        ∂F_M/∂α = p(1−p) · ( 2(m + μ⁻ − μ⁺) − 2α )

    (``μ±`` the batch class means of ``h``), so this direction is the exact one divided by
    ``p(1−p)``, with ``a`` and ``b`` standing in for ``μ⁺`` and ``μ⁻``.  It is free of minibatch
    noise in the class means but its effective dual step is ``1/(p(1−p))`` times the nominal one
    (about 11x for ``p = 0.1``), so learning rates do not transfer between the two choices.
    ``scores`` and ``labels`` are accepted so that it is a drop-in replacement for the autograd
    α-gradient; only their dtype/device are used.  Ascent: ``α ← α + η·direction``, then the
    caller projects ``α`` onto ``[0, ∞)``.

    Example:
        >>> h = torch.tensor([0.9, 0.2, 0.4, 0.7], dtype=torch.float64)
        >>> y = torch.tensor([1, -1, -1, 1])
        >>> round(auc_dual_closed_form_direction(h, y, a=0.5, b=0.3, alpha=1.1).item(), 10)
        -0.6
    """
    h, _, _ = _scores_and_masks(scores, labels)
    a, b, alpha = (_scalar(v, n) for v, n in ((a, "a"), (b, "b"), (alpha, "alpha")))
    zero = torch.zeros((), dtype=h.dtype, device=h.device)
    return zero + auc_dual_closed_form(a, b, alpha, _scalar(margin, "margin"))


def auc_dual_closed_form(a: Scalar, b: Scalar, alpha: Scalar, margin: Scalar = 1.0) -> Scalar:
    r"""``2(m + b − a) − 2α``: the closed-form dual direction on the scalars alone (no batch).

    The arithmetic of :func:`auc_dual_closed_form_direction`, branch-free (safe under ``vmap``);
    with ``margin = 0`` it is eq. (2)'s ``2(b − a) − 2α`` (the dual shifted by the margin form's 1).

    Example:
        >>> auc_dual_closed_form(0.5, 0.3, 1.1)
        -0.6000000000000001
    """
    return 2 * (margin + b - a) - 2 * alpha


def optimal_dual(scores: Tensor, labels: Tensor, *, margin: Scalar | None = None) -> Tensor:
    r"""The maximising dual for a fixed scorer: ``α*(v) = mean(h | y=−1) − mean(h | y=1)``.

    This is CODA's stage-end dual reset (spec §2.1), to be computed on a large batch pooled
    from all clients.  It maximises the batch mean of eq. (2) exactly when ``p`` equals the batch's
    positive ratio (and the population objective when ``p`` is the global ratio: pitfall P3).

    With ``margin=m`` it returns the AUCM maximiser over ``α ≥ 0``:
    ``max(0, m + mean(h|−) − mean(h|+))``.

    Returns a 0-dim tensor; NaN if the batch lacks one of the classes (a class mean is then
    undefined).  Branch-free: safe under ``vmap``.

    Example:
        >>> h = torch.tensor([0.9, 0.2, 0.4, 0.7], dtype=torch.float64)
        >>> y = torch.tensor([1, 0, 0, 1])
        >>> round(optimal_dual(h, y).item(), 10)
        -0.5
        >>> round(optimal_dual(h, y, margin=1.0).item(), 10)
        0.5
    """
    return optimal_dual_from_sums(*class_score_sums(scores, labels), margin=margin)


class ClassScoreSums(NamedTuple):
    """Per-class sums and counts of the scores (:func:`class_score_sums`); they add across clients."""

    pos_sum: Tensor
    pos_count: Tensor
    neg_sum: Tensor
    neg_count: Tensor


def class_score_sums(scores: Tensor, labels: Tensor) -> ClassScoreSums:
    """``(Σ h 1[y=1], #{y=1}, Σ h 1[y≠1], #{y≠1})``: what a client sends for a pooled
    :func:`optimal_dual` (CODA's dual reset), so that no score leaves it.

    Example:
        >>> s = class_score_sums(torch.tensor([0.9, 0.2, 0.4, 0.7]), torch.tensor([1, 0, 0, 1]))
        >>> [round(float(v), 6) for v in s]
        [1.6, 2.0, 0.6, 2.0]
    """
    h, pos, neg = _scores_and_masks(scores, labels)
    return ClassScoreSums((h * pos).sum(), pos.sum(), (h * neg).sum(), neg.sum())


def optimal_dual_from_sums(
    pos_sum: Tensor, pos_count: Tensor, neg_sum: Tensor, neg_count: Tensor, *, margin: Scalar | None = None
) -> Tensor:
    r""":func:`optimal_dual` from per-class sums and counts (pooled over clients):
    ``α* = neg_sum / neg_count − pos_sum / pos_count`` (AUCM: ``max(0, m + α*)``).

    Example:
        >>> t = torch.tensor
        >>> float(optimal_dual_from_sums(t(1.6), t(2.0), t(0.6), t(2.0)))
        -0.5
    """
    alpha = neg_sum / neg_count - pos_sum / pos_count
    if margin is None:
        return alpha
    return torch.clamp(_scalar(margin, "margin") + alpha, min=0)


# --------------------------------------------------------------------------------------------
# the batch mean from label weights, and its derivatives in closed form (the local loop's form)
# --------------------------------------------------------------------------------------------


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
