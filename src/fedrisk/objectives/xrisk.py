r"""Deep X-risks: pairwise surrogates, the linear (AUROC) and KL-DRO partial-AUROC forms.

Guo, Jin, Luo & Yang, *FeDXL: Provable Federated Learning for Deep X-Risk Optimization*, ICML 2023
(spec ``shared/specs/004_fedxl.md``).  An X-risk is eq. (1)::

    min_w (1/|S1|) Σ_{z ∈ S1} f( g(w, z, S2) ),     g(w, z, S2) = (1/|S2|) Σ_{z' ∈ S2} ℓ(h(w, z), h(w, z'))

with ``S1`` the positives, ``S2`` the negatives (all examples for average precision), ``h`` the
score and ``ℓ(a, b)`` a pairwise loss of
a positive score ``a`` and a negative score ``b``.  Two instances here (the others of
:data:`XRISKS` — AUPRC, two-way and CVaR pAUC — are in :mod:`fedrisk.objectives.compositional`):

* ``"auc"`` — **linear** ``f(s) = s`` (eq. (16)): the pairwise AUROC surrogate
  ``mean_{i,j} ℓ(a_i, b_j)`` (:func:`pairwise_auc_risk`); ``∇f = 1``.
* ``"pauc"`` — **one-way partial AUROC in its KL-DRO compositional form** (eqs. (14), (17)):
  ``f(u) = λ log u`` and inner ``ℓ_λ(a, b) = exp(L(a, b) / λ)``, so the risk is
  ``mean_i λ log mean_j exp(L(a_i, b_j)/λ)`` (:func:`kl_pauc_risk`); ``∇f(u) = λ / u``.
  ``L`` is one of the surrogates below; the paper's is the squared hinge with margin 1, whose
  sign we read as ``(m − (a − b))_+²`` (spec §1.4: the printed ``(h(z) + 1 − h(z'))_+²`` penalises
  high positive scores — a typo).

Pairwise surrogates (:data:`PAIRWISE_LOSSES`), all functions of ``d = a − b`` that decrease in
``d`` (a positive scored above a negative is cheap):

=================  ==========================  =========================================
name               ``ℓ(a, b)``                 notes
=================  ==========================  =========================================
``squared_hinge``  ``(m − a + b)_+²``          KL-OPAUC's ``L`` (paper, code ``margin=1``)
``square``         ``(m − a + b)²``            Appendix B; CODASCA's min-max equivalent
``sigmoid``        ``σ(b − a)``                PSM (Calders & Jaroszewicz); symmetric:
                                               ``ℓ(a,b) + ℓ(b,a) = 1`` (label-noise robust)
``logistic``       ``log(1 + exp(b − a))``     softplus
=================  ==========================  =========================================

Every function here is pure, branch-free tensor code (broadcasting ``a[:, None]`` against
``b[None, :]``), so it runs under ``torch.func.vmap`` / ``grad``; value checks
(:func:`check_xrisk_params`) belong to set-up.

The moving-average inner estimator of SOX / FeDXL2 (eq. (11)) is :func:`moving_average`:
``u ← (1 − γ) u + γ ĝ`` with ``ĝ`` a minibatch estimate of ``g(w, z, S2)``.

Example (a perfect ranking with margin 1 has zero squared-hinge risk):
    >>> import torch
    >>> a, b = torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])
    >>> float(pairwise_auc_risk(a, b, "squared_hinge")), float(pairwise_auc_risk(a, b, "square"))
    (0.0, 1.5)
    >>> round(float(kl_pauc_risk(a, b, lam=1.0, surrogate="squared_hinge")), 6)
    0.0
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from fedrisk.errors import FedriskError, check_range, unknown_name

__all__ = [
    "PAIRWISE_LOSSES",
    "XRISKS",
    "check_xrisk_params",
    "decomposed_surrogate",
    "inner_loss",
    "kl_pauc_risk",
    "logistic_pair",
    "moving_average",
    "outer_grad",
    "outer_value",
    "pairwise_auc_risk",
    "pairwise_loss",
    "psm_pair",
    "square_pair",
    "squared_hinge_pair",
    "xrisk",
]

XRISKS = ("auc", "pauc", "ap", "tpauc", "pauc_cvar")
"""``"auc"``: linear f (pairwise AUROC surrogate); ``"pauc"``: KL-DRO one-way pAUC, f = λ log;
``"ap"`` (average precision), ``"tpauc"`` (two-way KL-DRO pAUC), ``"pauc_cvar"`` (one-way CVaR
pAUC): :mod:`fedrisk.objectives.compositional`."""


def squared_hinge_pair(a: Tensor, b: Tensor, margin: float = 1.0) -> Tensor:
    """``(m − (a − b))_+²`` elementwise (broadcasting).

    Example:
        >>> squared_hinge_pair(torch.tensor([0.5, 0.25, 2.0]), torch.tensor([0.25, 0.5, 0.0])).tolist()
        [0.5625, 1.5625, 0.0]
    """
    return torch.clamp(margin - (a - b), min=0) ** 2


def square_pair(a: Tensor, b: Tensor, margin: float = 1.0) -> Tensor:
    """``(m − (a − b))²`` elementwise (Appendix B's square loss with ``m = 1``)."""
    return (margin - (a - b)) ** 2


def psm_pair(a: Tensor, b: Tensor, margin: float = 1.0) -> Tensor:
    """The pairwise sigmoid (PSM) loss ``σ(b − a) = 1 / (1 + exp(a − b))`` (``margin`` unused).

    Example (symmetry ``ℓ(a, b) + ℓ(b, a) = 1``):
        >>> a, b = torch.tensor(0.3), torch.tensor(-1.2)
        >>> float(psm_pair(a, b) + psm_pair(b, a))
        1.0
    """
    return torch.sigmoid(b - a)


def logistic_pair(a: Tensor, b: Tensor, margin: float = 1.0) -> Tensor:
    """``log(1 + exp(b − a))`` (``margin`` unused)."""
    return torch.nn.functional.softplus(b - a)


PAIRWISE_LOSSES: dict[str, Callable[..., Tensor]] = {
    "squared_hinge": squared_hinge_pair,
    "square": square_pair,
    "sigmoid": psm_pair,
    "logistic": logistic_pair,
}
"""Pairwise surrogates ``ℓ(a, b)`` by config name."""


def pairwise_loss(name: str, a: Tensor, b: Tensor, margin: float = 1.0) -> Tensor:
    """The matrix ``ℓ(a_i, b_j)``, shape ``[len(a), len(b)]``, of the surrogate ``name``.

    Example:
        >>> pairwise_loss("square", torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.5, 1.0])).tolist()
        [[0.0, 0.25, 1.0], [1.0, 2.25, 4.0]]
    """
    if name not in PAIRWISE_LOSSES:
        raise unknown_name("surrogate", name, tuple(PAIRWISE_LOSSES))
    return PAIRWISE_LOSSES[name](a[:, None], b[None, :], margin)


def inner_loss(kind: str, surrogate: str, a: Tensor, b: Tensor, *, lam: float = 1.0, margin: float = 1.0) -> Tensor:
    """The inner pair loss of the X-risk ``kind`` as a matrix ``[len(a), len(b)]``.

    ``"auc"``: ``ℓ(a_i, b_j)``; ``"pauc"``: ``exp(ℓ(a_i, b_j) / λ)`` (eq. (17)).
    """
    pair = pairwise_loss(surrogate, a, b, margin)
    if kind == "auc":
        return pair
    if kind == "pauc":
        return torch.exp(pair / lam)
    raise unknown_name("xrisk", kind, XRISKS)


def outer_value(kind: str, u: Tensor, lam: float = 1.0) -> Tensor:
    """``f(u)``: ``u`` (``"auc"``) or ``λ log u`` (``"pauc"``)."""
    if kind == "auc":
        return u
    if kind == "pauc":
        return lam * torch.log(u)
    raise unknown_name("xrisk", kind, XRISKS)


def outer_grad(kind: str, u: Tensor, lam: float = 1.0) -> Tensor:
    """``∇f(u)``: ones (``"auc"``) or ``λ / u`` (``"pauc"``).

    Example:
        >>> outer_grad("pauc", torch.tensor([1.0, 4.0]), lam=2.0).tolist()
        [2.0, 0.5]
    """
    if kind == "auc":
        return torch.ones_like(u)
    if kind == "pauc":
        return lam / u
    raise unknown_name("xrisk", kind, XRISKS)


def xrisk(kind: str, surrogate: str, h_pos: Tensor, h_neg: Tensor, *, lam: float = 1.0, margin: float = 1.0) -> Tensor:
    """The exact X-risk ``mean_i f(mean_j ℓ_inner(a_i, b_j))`` of eq. (1) on score vectors."""
    g = inner_loss(kind, surrogate, h_pos, h_neg, lam=lam, margin=margin).mean(1)
    return outer_value(kind, g, lam).mean()


def pairwise_auc_risk(h_pos: Tensor, h_neg: Tensor, surrogate: str = "sigmoid", margin: float = 1.0) -> Tensor:
    """The linear X-risk (eq. (16)): ``mean_{i,j} ℓ(h_pos_i, h_neg_j)``."""
    return xrisk("auc", surrogate, h_pos, h_neg, margin=margin)


def kl_pauc_risk(
    h_pos: Tensor, h_neg: Tensor, lam: float = 1.0, surrogate: str = "squared_hinge", margin: float = 1.0
) -> Tensor:
    """KL-OPAUC (eq. (17)): ``mean_i λ log mean_j exp(L(h_pos_i, h_neg_j) / λ)``.

    It is the KL-regularised worst case over weightings ``p`` of the negatives:
    ``mean_i max_{p ∈ Δ} Σ_j p_j L_ij − λ KL(p, uniform)``; small ``λ`` focuses on the hardest
    negatives (low false-positive rates), ``λ → ∞`` gives the mean (the AUROC surrogate).

    Example (``λ → ∞`` approaches the pairwise mean; the DRO form is never below it):
        >>> a, b = torch.tensor([0.8, 0.3], dtype=torch.float64), torch.tensor([0.1, 0.6], dtype=torch.float64)
        >>> mean = float(pairwise_auc_risk(a, b, "squared_hinge"))
        >>> abs(float(kl_pauc_risk(a, b, lam=1e6)) - mean) < 1e-5, float(kl_pauc_risk(a, b, lam=0.5)) > mean
        (True, True)
    """
    return xrisk("pauc", surrogate, h_pos, h_neg, lam=lam, margin=margin)


def moving_average(u: Tensor, g: Tensor, gamma: float) -> Tensor:
    """SOX / FeDXL2's inner estimator (eq. (11)): ``u ← (1 − γ) u + γ g``.

    Example:
        >>> moving_average(torch.tensor([1.0]), torch.tensor([3.0]), 0.25).tolist()
        [1.5]
    """
    return u - gamma * (u - g)


def decomposed_surrogate(
    kind: str,
    surrogate: str,
    a: Tensor,
    b: Tensor,
    passive_neg: Tensor,
    passive_pos: Tensor,
    u_active: Tensor,
    u_passive: Tensor,
    *,
    lam: float = 1.0,
    margin: float = 1.0,
    pos_weight: Tensor | float = 1.0,
    neg_weight: Tensor | float = 1.0,
) -> Tensor:
    r"""The active/passive surrogate whose gradient is ``G1 + G2`` (eqs. (5)–(6), (12)–(13)).

    ::

        Lsur = mean_p ∇f(u_p) mean_q ℓ_in(a_p, sg(h̃2_q))          -> G1 (active positives a)
             + mean_q mean_p ∇f(ũ_p) ℓ_in(sg(h̃1_p), b_q)           -> G2 (active negatives b)

    ``a`` / ``b``: the *active* scores of the client's own positives / negatives (carrying the
    gradient); ``passive_neg`` (``h̃2``, used with ``a``) and ``passive_pos`` (``h̃1``, used with
    ``b``) are stored scores of other clients' data (constants); ``u_active`` are the (updated)
    inner estimates of ``a``'s rows, ``u_passive`` the stored ones of ``passive_pos`` — the
    record ζ's ``(h̃1_ζ, ũ_ζ)`` pair, never mixed (spec §6.3).  All ``u`` enter only through the
    constant weights ``∇f(u)`` (stop-gradient).  ``pos_weight`` / ``neg_weight`` (0 or 1) switch
    a term off for a client without positives / negatives.  Neither term is halved (spec §6.11).
    """
    sg = torch.Tensor.detach
    w1 = outer_grad(kind, sg(u_active), lam)
    w2 = outer_grad(kind, sg(u_passive), lam)
    g1 = (w1 * inner_loss(kind, surrogate, a, sg(passive_neg), lam=lam, margin=margin).mean(1)).mean()
    g2 = (w2[:, None] * inner_loss(kind, surrogate, sg(passive_pos), b, lam=lam, margin=margin)).mean()
    return pos_weight * g1 + neg_weight * g2


def check_xrisk_params(
    *, kind: str, surrogate: str, lam: float, gamma: float, beta: float, margin: float, max_fpr: float | None = None
) -> None:
    """Set-up checks of the X-risk hyper-parameters (raise :class:`FedriskError`).

    ``λ > 0`` (the KL temperature; ``λ ≤ 0`` has no DRO meaning and divides by zero), ``γ`` and
    ``β`` in ``(0, 1]`` (moving-average weights; 1 = no averaging), ``margin > 0``, and an FPR
    bound in ``(0, 1]``.

    Example:
        >>> check_xrisk_params(kind="pauc", surrogate="squared_hinge", lam=0.0, gamma=0.1, beta=0.1, margin=1.0)
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: lam = 0.0 is out of range; allowed: (0.0, inf)
    """
    if kind not in XRISKS:
        raise unknown_name("xrisk", kind, XRISKS)
    if surrogate not in PAIRWISE_LOSSES:
        raise unknown_name("surrogate", surrogate, tuple(PAIRWISE_LOSSES))
    for name, value in (("lam", lam), ("gamma", gamma), ("beta", beta), ("margin", margin)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise FedriskError(f"{name} must be a number; got {value!r}")
    check_range("lam", lam, 0.0, None, low_inclusive=False)
    check_range("gamma", gamma, 0.0, 1.0, low_inclusive=False)
    check_range("beta", beta, 0.0, 1.0, low_inclusive=False)
    check_range("margin", margin, 0.0, None, low_inclusive=False)
    if max_fpr is not None:
        check_range("max_fpr", max_fpr, 0.0, 1.0, low_inclusive=False)
