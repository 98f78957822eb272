r"""Set-up of the AUC objectives: label checks and the choice of the positive ratio ``p``.

The value checks here inspect tensor *values* (data-dependent Python control flow, which breaks
``vmap``): call them once at set-up, never per step.  The objectives themselves are in
:mod:`fedrisk.objectives.auc`, which re-exports every name of this module.

The choice of ``p`` (spec ``000_codasca.md``, pitfall P3) is :data:`PositiveRatio`; the
recommended default is ``"global"``: one constant ``p`` shared by all clients, equal to the
positive ratio of the federation's mixture distribution.

Example:
    >>> positive_ratios_from_counts("global", ((3, 1), (1, 3)))
    (0.5, 0.5)
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
    "check_binary_labels",
    "check_ratio",
    "class_count_pairs",
    "positive_ratio",
    "positive_ratios_from_counts",
    "resolve_positive_ratios",
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
