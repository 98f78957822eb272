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

The choice of ``p`` (spec pitfall P3)
-------------------------------------
See :data:`PositiveRatio`.  The recommended default is ``"global"``: one constant ``p`` shared by
all clients, equal to the positive ratio of the federation's mixture distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeAlias

import torch
from torch import Tensor

from fedrisk.errors import FedriskError, check_range

__all__ = [
    "DEFAULT_POSITIVE_RATIO",
    "PositiveRatio",
    "Scalar",
    "auc_dual_closed_form_direction",
    "auc_margin_minmax",
    "auc_square_minmax",
    "check_binary_labels",
    "check_ratio",
    "class_count_pairs",
    "optimal_dual",
    "positive_ratio",
    "positive_ratios_from_counts",
    "resolve_positive_ratios",
    "single_output",
]

Scalar: TypeAlias = float | Tensor
"""A Python number or a one-element tensor (0-dim preferred; a shape-``[1]`` tensor is accepted)."""

PositiveRatio: TypeAlias = Literal["global", "client", "given"]
r"""How the positive ratio ``p`` of eq. (2) is chosen for each client (spec pitfall P3).

* ``"global"`` (**recommended default**): one constant ``p`` for every client, the positive ratio
  of the federation as a whole.  Eq. (1) weights the clients equally, so the federated objective is
  ``E_{P̄}[F]`` under the mixture ``P̄ = (1/K) Σ_k P_k``, whose positive probability is the
  *mean of the client ratios* ``(1/K) Σ_k π_k``; that is what :func:`resolve_positive_ratios`
  computes by default.  (It equals the pooled count ratio ``Σ n⁺_k / Σ n_k`` when the clients
  have equal sizes, as in the class-split benchmarks; pass ``weights = client sizes`` to get the
  pooled count ratio when the algorithm weights clients by data size.)  Only with this choice do
  the saddle identities hold for the federation: ``a* = E[h|+]``, ``b* = E[h|−]``,
  ``α* = b* − a*`` and ``min_{a,b} max_α f = p(1−p)(E[(1 − h(x⁺) + h(x⁻))²] − 1)``, i.e. the
  min-max problem *is* the pairwise square AUC surrogate of the pooled data.  It costs one scalar
  (two counts per client) shared once at set-up, and its dual curvature ``2p(1−p)`` is the same
  on every client.
* ``"client"``: client ``k`` uses its own ratio ``π_k``.  Then ``(1/K) Σ_k f_k`` is a sum of
  *different* objectives, not the pooled AUC surrogate: the optimal ``a``, ``b``, ``α`` differ per
  client, the averaged iterates chase a compromise with no AUC meaning, and a client holding a
  single class has ``p_k ∈ {0, 1}``, where the α-term vanishes (strong concavity is lost).  It is
  offered for ablations on heterogeneous-ratio federations (e.g. ChestXray-IH).
* ``"given"``: a user-supplied constant (e.g. the benchmark's designed ``imratio``, as in the
  official code), used by every client.
"""

DEFAULT_POSITIVE_RATIO: PositiveRatio = "global"
"""The recommended choice of ``p``: the global (federation-wide) positive ratio."""

_MAX_LISTED = 10


# --------------------------------------------------------------------------------------------
# set-up validation (value checks: NOT for use inside vmap / the per-step hot path)
# --------------------------------------------------------------------------------------------


def check_ratio(p: Scalar, name: str = "p") -> float:
    """Check that the positive ratio ``p`` lies in the open interval (0, 1); return it as a float.

    Call once at set-up (it reads the value of a tensor, which is not allowed under ``vmap``).

    Raises:
        FedriskError: naming the value and the allowed range ``(0, 1)``.

    Example:
        >>> check_ratio(0.25)
        0.25
        >>> check_ratio(1.0)
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: p = 1.0 is out of range; allowed: (0, 1)
    """
    if isinstance(p, Tensor):
        if p.numel() != 1:
            raise FedriskError(f"{name} must be a scalar; got a tensor of shape {tuple(p.shape)}")
        value = float(p.detach().reshape(()).item())
    elif isinstance(p, bool) or not isinstance(p, (int, float)):
        raise FedriskError(f"{name} must be a number in (0, 1); got {p!r}")
    else:
        value = float(p)
    if math.isnan(value):
        raise FedriskError(f"{name} = nan is out of range; allowed: (0, 1)")
    check_range(name, value, 0, 1, low_inclusive=False, high_inclusive=False)
    return value


def _fmt_label(v: float | int | bool) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() else repr(v)


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


def check_binary_labels(labels: Tensor, name: str = "labels") -> None:
    """Check that ``labels`` are coded ``{0, 1}`` or ``{−1, +1}`` (``1`` = positive).

    A subset (e.g. only ``1``) is accepted: a batch or a client may hold a single class.  Mixed
    codings such as ``{−1, 0, 1}`` are rejected.  Call once at set-up (it inspects values).

    Raises:
        FedriskError: listing the distinct labels found.

    Example:
        >>> check_binary_labels(torch.tensor([1, -1, -1, 1]))
        >>> check_binary_labels(torch.tensor([0, 1, 2, 1]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: labels must be binary, ...; found distinct labels [0, 1, 2]
    """
    if not isinstance(labels, Tensor):
        raise FedriskError(f"{name} must be a tensor; got {type(labels).__name__}")
    if labels.numel() == 0:
        raise FedriskError(f"{name} is empty; need at least one example")
    if labels.is_complex():
        raise FedriskError(f"{name} must be real-valued; got dtype {labels.dtype}")
    found = torch.unique(labels.detach().reshape(-1).cpu()).tolist()
    distinct = {float(v) for v in found}
    if distinct <= {0.0, 1.0} or distinct <= {-1.0, 1.0}:
        return
    shown = ", ".join(_fmt_label(v) for v in found[:_MAX_LISTED])
    more = f", ... ({len(found)} distinct in all)" if len(found) > _MAX_LISTED else ""
    raise FedriskError(
        f"{name} must be binary, coded {{0, 1}} or {{-1, +1}} with 1 = positive; found distinct labels [{shown}{more}]"
    )


def positive_ratio(labels: Tensor | Sequence[Tensor], weights: Sequence[float] | None = None) -> float:
    """The fraction of positive labels (label ``1``), as a Python float.

    * one tensor: ``#{y = 1} / N``;
    * a sequence of per-client label tensors: the ratio of the client mixture,
      ``Σ_k w_k π_k / Σ_k w_k`` with ``π_k`` client ``k``'s ratio.  The default weights are equal
      (``1/K``), matching eq. (1)'s equal client weighting; pass the client sizes as ``weights`` to
      get the pooled count ratio ``Σ n⁺_k / Σ n_k``.

    Validates the labels (:func:`check_binary_labels`): a set-up helper, not for the hot path.
    The result may be 0 or 1; :func:`check_ratio` it before using it as ``p``.

    Example:
        >>> positive_ratio(torch.tensor([1, 0, 0, 1, 0, 0, 0, 0]))
        0.25
        >>> positive_ratio([torch.tensor([1, -1]), torch.tensor([-1, -1, -1, -1])])
        0.25
        >>> positive_ratio([torch.tensor([1, -1]), torch.tensor([-1, -1, -1, -1])], weights=[2, 4])
        0.16666666666666666
    """
    if isinstance(labels, Tensor):
        check_binary_labels(labels)
        return float((labels.detach() == 1).sum().item()) / labels.numel()
    clients = list(labels)
    if not clients:
        raise FedriskError("positive_ratio: got an empty sequence of client labels")
    if weights is None:
        w = [1.0] * len(clients)
    else:
        w = [float(x) for x in weights]
        if len(w) != len(clients):
            raise FedriskError(
                f"positive_ratio: got {len(w)} weights for {len(clients)} clients; need one weight per client"
            )
        if any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
            raise FedriskError(f"positive_ratio: weights must be finite, >= 0 and not all 0; got {w}")
    ratios = []
    for k, y in enumerate(clients):
        if not isinstance(y, Tensor):
            raise FedriskError(f"client {k} labels must be a tensor; got {type(y).__name__}")
        check_binary_labels(y, name=f"client {k} labels")
        ratios.append(float((y.detach() == 1).sum().item()) / y.numel())
    return sum(wk * rk for wk, rk in zip(w, ratios)) / sum(w)


def class_count_pairs(class_counts: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """``(positives, negatives)`` of every client from per-client class counts.

    ``class_counts[k][c]`` is the number of rows of class ``c`` on client ``k`` (as in
    :class:`fedrisk.algorithms.base.FedInfo`); class ``1`` is positive, every other class negative.
    The one place both AUC families (CODA+/CODASCA and FeDXL) turn counts into class sizes.

    Example:
        >>> class_count_pairs(((3, 1), (4,), (0, 2)))
        [(1, 3), (0, 4), (2, 0)]
    """
    out = []
    for row in class_counts:
        pos = int(row[1]) if len(row) > 1 else 0
        out.append((pos, int(sum(row)) - pos))
    return out


def positive_ratios_from_counts(
    choice: PositiveRatio,
    class_counts: Sequence[Sequence[int]],
    *,
    given: float | None = None,
    weights: Sequence[float] | None = None,
    name: str = "positive ratio",
) -> tuple[float, ...]:
    """One validated ``p`` per client from per-client class counts (see :data:`PositiveRatio`).

    The single implementation of the positive-ratio policy: :func:`resolve_positive_ratios`
    (label tensors) and the CODA+/CODASCA family (``FedInfo.class_counts``) both call it.

    Args:
        choice: ``"global"`` (mixture ratio: the ``weights``-weighted mean of the client ratios,
            equal weights by default as in eq. (1)), ``"client"`` or ``"given"``.
        class_counts: ``class_counts[k][c]``; may be empty for ``"given"``.
        given: the constant of ``"given"``.
        name: prefix of the error messages (e.g. the algorithm's name).

    Raises:
        FedriskError: a ratio outside (0, 1), a missing ``given``, missing counts, an unknown choice.

    Example:
        >>> positive_ratios_from_counts("global", ((3, 1), (1, 3)))
        (0.5, 0.5)
        >>> positive_ratios_from_counts("client", ((3, 1), (1, 3)))
        (0.25, 0.75)
    """
    if choice not in ("global", "client", "given"):
        raise FedriskError(f"unknown positive ratio choice {choice!r}. Valid choices: client, given, global")
    if choice == "given":
        if given is None:
            raise FedriskError(f"{name}: positive ratio choice 'given' needs a value p in (0, 1)")
        return (check_ratio(given, name="p"),) * max(1, len(class_counts))
    if given is not None:
        raise FedriskError("positive ratio 'given' value is only used with choice='given'")
    if not class_counts:
        raise FedriskError(
            f"{name}: positive_ratio = {choice!r} needs integer class labels to count the positives; the "
            "labels are not integer classes. Use positive_ratio = 'given' with p"
        )
    own = []
    for k, (pos, neg) in enumerate(class_count_pairs(class_counts)):
        n = pos + neg
        ratio = pos / n if n else float("nan")
        if choice == "client" and not 0 < ratio < 1:
            raise FedriskError(
                f"{name}: client {k} has {pos} positives among {n} samples, so its own positive ratio "
                f"p_{k} = {ratio!r} is outside (0, 1) and its dual term vanishes; use positive_ratio = "
                "'global' (or 'given') for federations with single-class clients"
            )
        own.append(ratio)
    if choice == "client":
        return tuple(own)
    if weights is None:
        w = [1.0] * len(own)
    else:
        w = [float(x) for x in weights]
        if len(w) != len(own) or any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
            raise FedriskError(f"{name}: need one finite weight >= 0 per client, not all 0; got {w}")
    # the mixture (1/K) Σ_k P_k of eq. (1): the (weighted) mean of the client ratios
    p = sum(wk * rk for wk, rk in zip(w, own)) / sum(w)
    return (check_ratio(p, name="global positive ratio p"),) * len(own)


def resolve_positive_ratios(
    choice: PositiveRatio,
    client_labels: Sequence[Tensor],
    *,
    given: float | None = None,
    weights: Sequence[float] | None = None,
) -> list[float]:
    """One validated ``p`` per client, according to ``choice`` (see :data:`PositiveRatio`).

    Validates the labels, counts them and applies :func:`positive_ratios_from_counts`.

    Args:
        choice: ``"global"`` (recommended), ``"client"`` or ``"given"``.
        client_labels: the training labels of each client (``K`` tensors).
        given: the constant ``p`` for ``choice="given"`` (required there, rejected otherwise).
        weights: client weights of the mixture for ``"global"`` (default equal, as in eq. (1)).

    Raises:
        FedriskError: for an unknown ``choice``, bad labels, or a resulting ``p`` outside (0, 1)
            (e.g. ``"client"`` with a single-class client).

    Example:
        >>> ys = [torch.tensor([1, 0, 0, 0]), torch.tensor([1, 1, 0, 0])]
        >>> resolve_positive_ratios("global", ys)
        [0.375, 0.375]
        >>> resolve_positive_ratios("client", ys)
        [0.25, 0.5]
        >>> resolve_positive_ratios("given", ys, given=0.1)
        [0.1, 0.1]
    """
    clients = list(client_labels)
    if weights is not None and len(weights) != len(clients):
        raise FedriskError(
            f"positive_ratio: got {len(weights)} weights for {len(clients)} clients; need one weight per client"
        )
    counts = []
    for k, y in enumerate(clients):
        if not isinstance(y, Tensor):
            raise FedriskError(f"client {k} labels must be a tensor; got {type(y).__name__}")
        check_binary_labels(y, name=f"client {k} labels")
        pos = int((y.detach() == 1).sum().item())
        counts.append((y.numel() - pos, pos))
    ratios = positive_ratios_from_counts(choice, counts, given=given, weights=weights, name="positive ratio")
    return list(ratios[:1] * len(clients)) if choice == "given" else list(ratios)


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
    margin = _scalar(margin, "margin")
    zero = torch.zeros((), dtype=h.dtype, device=h.device)
    return zero + 2 * (margin + b - a) - 2 * alpha


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
    h, pos, neg = _scores_and_masks(scores, labels)
    alpha = (h * neg).sum() / neg.sum() - (h * pos).sum() / pos.sum()
    if margin is None:
        return alpha
    return torch.clamp(_scalar(margin, "margin") + alpha, min=0)
