r"""X-risks beyond AUROC: average precision (AUPRC), two-way KL-DRO pAUC, one-way CVaR pAUC.

FeDXL (Guo et al., ICML 2023, spec ``shared/specs/004_fedxl.md``) frames every risk here as
eq. (1), ``mean_{z ∈ S1} f(g(w, z, S2))``, with a state ``u(z)`` per anchor ``z ∈ S1`` (the
positives) tracking the inner mean ``g`` — vector-valued for AUPRC (eqs. (18)–(19)).  All three
share one gradient form: with the state ``u`` replaced by its estimate, the gradient is

    ∇R ≈ mean_{i ∈ S1} mean_{j ∈ S2} P_ij ∇ℓ(h_i, h_j),       P = pair_weights(kind, L, u, ...)

with ``L_ij = ℓ(h_i, h_j)`` the pairwise surrogate (:data:`fedrisk.objectives.xrisk.PAIRWISE_LOSSES`)
and ``P`` a constant (stop-gradient) weight.  That is exactly LibAUC's form
(``loss = mean(p * surr_loss)`` with ``p`` detached), so :func:`centralized_surrogate` on a
minibatch equals LibAUC's loss in value and gradient; FeDXL's active/passive split
(:func:`fedrisk.algorithms.pairwise.PairwiseBase.local_steps_loop`) uses the same ``P`` for the
active-anchor term ``G1`` (partners: passive scores) and the active-partner term ``G2``
(anchors: passive positive scores with their stored ``ũ``).

=============  ============================================  =================  ====================
kind           risk                                          ``u`` per positive ``P_ij``
=============  ============================================  =================  ====================
``"ap"``       ``−mean_i u_pos,i / u_all,i`` (eq. (19)),     2: ``(u_pos,       ``(u_pos − u_all ·
               ``S2`` = all examples, ``u_pos`` = mean of    u_all)``           1[y_j = 1]) / u_all²``
               ``1[y_j = 1] L_ij``, ``u_all`` = mean of L
``"tpauc"``    ``λ' log mean_i (mean_j exp(L_ij/λ))^(λ/λ')``  1 (+ a global     ``u_i^(λ/λ'−1)
               (KL-DRO on the negatives, λ, and on the        scalar ``v``)      exp(L_ij/λ) / v``
               positives, λ' = ``lam_pos``)
``"pauc_cvar"`` ``mean_i s_i + mean_j (L_ij − s_i)_+ / β``   1: the threshold   ``1[L_ij > s_i] / β``
               (CVaR_β of each positive's pair losses: at     ``s``
               the optimal ``s`` the mean of its top
               ``k = β n−`` negatives' losses)
=============  ============================================  =================  ====================

State updates (one minibatch; ``ĝ`` the minibatch inner mean of each anchor row):

* ``"ap"``: ``u ← (1 − γ) u + γ (mean_j 1[y_j=1] L_ij, mean_j L_ij)`` (SOAP; LibAUC's ``APLoss``,
  ``P`` from the updated ``u``).
* ``"tpauc"``: ``u ← (1 − γ) u + γ mean_j exp(L_ij/λ)``, then ``v ← (1 − γ_v) v + γ_v mean_i
  u_i^(λ/λ')`` over the minibatch's anchors (SOTA-s; LibAUC's ``tpAUC_KL_Loss`` with
  ``gammas = (γ, γ_v)``, ``tau = λ'``, ``Lambda = λ``).  ``v`` is one number for the whole data: in
  a federation each client moves its copy over its local steps and the server averages the
  copies with the model (:class:`fedrisk.algorithms.fedxl.FeDXL2`).
* ``"pauc_cvar"``: ``P`` from the *current* threshold, then ``s ← s − η (1 − mean_j 1[L_ij >
  s_i] / β)`` (SOPA's dual SGD step; LibAUC's ``pAUC_CVaR_Loss`` with ``eta = η``, ``beta = β``).

Every function is branch-free tensor code (it runs under ``vmap``); ``γ, γ_v, η`` and the
bounds are checked at set-up (:func:`check_compositional_params`).

Example (a perfectly ranked batch: AP risk ``−1``; the weights of the negatives are 0 once no
negative is within the margin):
    >>> import torch
    >>> h, y = torch.tensor([3.0, 2.5, 0.0, -0.5]), torch.tensor([1, 1, 0, 0])
    >>> float(risk_value("ap", "squared_hinge", h[y == 1], h, y.bool(), margin=1.0))
    -1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedrisk.errors import FedriskError, check_range, unknown_name
from fedrisk.objectives.xrisk import pairwise_loss

__all__ = [
    "COMPOSITIONAL",
    "U_COLUMNS",
    "XRiskSpec",
    "centralized_surrogate",
    "check_compositional_params",
    "decomposed_step",
    "inner_estimate",
    "pair_weights",
    "risk_value",
    "update_state",
    "update_v",
    "weights_use_updated_u",
]

COMPOSITIONAL = ("ap", "tpauc", "pauc_cvar")
"""The X-risks of this module (``xrisk =`` in FeDXL2 / Local Pair / centralised)."""

U_COLUMNS = {"ap": 2, "tpauc": 1, "pauc_cvar": 1}
"""Width of the per-positive state (1 = a scalar, stored as a vector ``[P]``; 2 = ``[P, 2]``)."""


@dataclass(frozen=True)
class XRiskSpec:
    """The hyper-parameters one compositional X-risk reads.

    Args:
        kind: one of :data:`COMPOSITIONAL`.
        surrogate: the pairwise loss ``ℓ`` (squared hinge in LibAUC's defaults).
        margin: ``m`` of the (squared) hinge / square losses.
        gamma: ``γ``, the moving-average weight of ``u`` (``"ap"``, ``"tpauc"``).
        lam: ``λ``, the negatives' KL temperature (``"tpauc"``).
        lam_pos: ``λ'``, the positives' KL temperature (``"tpauc"``).
        gamma_v: ``γ_v``, the moving-average weight of the global ``v`` (``"tpauc"``).
        max_fpr: ``β``, the CVaR level / FPR bound (``"pauc_cvar"``).
        dual_lr: ``η``, the threshold's step size (``"pauc_cvar"``).
    """

    kind: str
    surrogate: str = "squared_hinge"
    margin: float = 1.0
    gamma: float = 0.1
    lam: float = 1.0
    lam_pos: float = 1.0
    gamma_v: float = 0.1
    max_fpr: float = 0.2
    dual_lr: float = 0.1


def weights_use_updated_u(kind: str) -> bool:
    """Whether ``P`` reads the state after this step's update (SOAP, SOTA-s, FeDXL eq. (11)) or
    before it (SOPA's threshold ``s``: LibAUC computes ``p`` first)."""
    return kind != "pauc_cvar"


def inner_estimate(spec: XRiskSpec, L: Tensor, pos_mask: Tensor | None = None) -> Tensor:
    """The minibatch inner mean ``ĝ`` of each anchor row of ``L`` (``[n, m]``).

    ``"ap"``: ``[n, 2]`` = ``(mean_j 1[y_j=1] L_ij, mean_j L_ij)`` (``pos_mask`` marks the positive
    partners, ``[m]``); ``"tpauc"``: ``mean_j exp(L_ij/λ)``; ``"pauc_cvar"``: the fraction
    ``mean_j 1[L_ij > s]`` is threshold-dependent, so it has no ``ĝ`` (see :func:`update_state`).
    """
    if spec.kind == "ap":
        if pos_mask is None:
            raise FedriskError("ap: the inner estimate needs the partners' positive mask")
        return torch.stack([(L * pos_mask.to(L.dtype)).mean(1), L.mean(1)], dim=-1)
    if spec.kind == "tpauc":
        return torch.exp(L / spec.lam).mean(1)
    raise unknown_name("xrisk with an inner mean", spec.kind, ("ap", "tpauc"))


def update_state(spec: XRiskSpec, u: Tensor, L: Tensor, pos_mask: Tensor | None = None) -> Tensor:
    """The anchors' state after one minibatch (module docstring), ``L`` detached by the caller.

    Example (CVaR: with every pair loss above ``s``, ``s`` rises by ``η (1/β − 1)``):
        >>> spec = XRiskSpec("pauc_cvar", max_fpr=0.5, dual_lr=0.1)
        >>> update_state(spec, torch.zeros(1, dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)).tolist()
        [0.1]
    """
    if spec.kind == "pauc_cvar":
        above = (u[:, None] < L).to(L.dtype).mean(1)
        return u - spec.dual_lr * (1 - above / spec.max_fpr)
    return u - spec.gamma * (u - inner_estimate(spec, L, pos_mask))


def update_v(spec: XRiskSpec, v: Tensor, u: Tensor, weight: Tensor | float = 1.0) -> Tensor:
    """``"tpauc"``'s global ``v ← (1 − γ_v) v + γ_v mean_i u_i^(λ/λ')`` (``weight`` 0 keeps ``v``:
    a client without positives has no anchors)."""
    target = (u ** (spec.lam / spec.lam_pos)).mean()
    return v - weight * spec.gamma_v * (v - target)


def pair_weights(
    spec: XRiskSpec, L: Tensor, u: Tensor, *, pos_mask: Tensor | None = None, v: Tensor | None = None
) -> Tensor:
    """``P_ij`` (module docstring) for anchors with state ``u`` and pair losses ``L`` (detached).

    Example (AP: a positive partner gets ``(u_pos − u_all)/u_all²``, a negative ``u_pos/u_all²``):
        >>> spec = XRiskSpec("ap")
        >>> pair_weights(spec, torch.ones(1, 2), torch.tensor([[1.0, 2.0]]), pos_mask=torch.tensor([1, 0])).tolist()
        [[-0.25, 0.25]]
    """
    L = L.detach()
    u = u.detach()
    if spec.kind == "ap":
        if pos_mask is None:
            raise FedriskError("ap: the pair weights need the partners' positive mask")
        u_pos, u_all = u[:, 0:1], u[:, 1:2]
        return (u_pos - u_all * pos_mask.to(L.dtype)[None, :]) / u_all**2
    if spec.kind == "tpauc":
        if v is None:
            raise FedriskError("tpauc: the pair weights need the global estimate v")
        power = spec.lam / spec.lam_pos - 1
        return (u[:, None] ** power) * torch.exp(L / spec.lam) / v.detach()
    if spec.kind == "pauc_cvar":
        return (u[:, None] < L).to(L.dtype) / spec.max_fpr
    raise unknown_name("xrisk", spec.kind, COMPOSITIONAL)


def centralized_surrogate(
    spec: XRiskSpec,
    scores: Tensor,
    labels: Tensor,
    u: Tensor,
    v: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One centralised minibatch step: ``(mean_ij P_ij L_ij, u_new, v_new)`` — LibAUC's loss.

    ``scores``: the minibatch scores ``[n]`` (carrying the gradient); ``labels`` 0/1 ``[n]``;
    ``u``: the state of the minibatch's positives, in their batch order (``[P]`` or ``[P, 2]``);
    ``v``: ``"tpauc"``'s global estimate.  Anchors are the positives; partners are all examples
    (``"ap"``) or the negatives.  The gradient flows through both sides of every pair.

    Example (AP on a tied batch: ``u_new = γ ĝ`` from ``u = 0``):
        >>> spec = XRiskSpec("ap", gamma=0.5)
        >>> loss, u_new, _ = centralized_surrogate(spec, torch.zeros(2), torch.tensor([1, 0]), torch.zeros(1, 2))
        >>> u_new.tolist()
        [[0.25, 0.5]]
    """
    pos = labels == 1
    a = scores[pos]
    if spec.kind == "ap":
        partners, mask = scores, pos
    else:
        partners, mask = scores[~pos], None
    L = pairwise_loss(spec.surrogate, a, partners, spec.margin)
    u_new = update_state(spec, u, L.detach(), mask)
    v_new = update_v(spec, v, u_new) if spec.kind == "tpauc" and v is not None else v
    P = pair_weights(spec, L, u_new if weights_use_updated_u(spec.kind) else u, pos_mask=mask, v=v_new)
    return (P * L).mean(), u_new.detach(), v_new


def risk_value(
    kind: str,
    surrogate: str,
    h_pos: Tensor,
    h_partners: Tensor,
    partner_pos: Tensor | None = None,
    *,
    margin: float = 1.0,
    lam: float = 1.0,
    lam_pos: float = 1.0,
    max_fpr: float = 0.2,
) -> Tensor:
    """The exact risk on score vectors (no state): the objective the estimators track.

    ``"ap"``: ``h_partners`` = every example's score, ``partner_pos`` its positive mask;
    ``"tpauc"`` / ``"pauc_cvar"``: ``h_partners`` = the negatives' scores.  CVaR is evaluated at
    its optimal thresholds, i.e. the mean of each positive's ``⌈β n−⌉`` largest pair losses (the
    top-k negatives; exact when ``β n−`` is an integer).

    Example (CVaR with ``β = 1/2`` of two negatives: the worse pair loss of each positive):
        >>> float(risk_value("pauc_cvar", "square", torch.tensor([1.0]), torch.tensor([0.0, 1.0]), max_fpr=0.5))
        1.0
    """
    L = pairwise_loss(surrogate, h_pos, h_partners, margin)
    if kind == "ap":
        if partner_pos is None:
            raise FedriskError("ap: the risk needs the partners' positive mask")
        return -((L * partner_pos.to(L.dtype)).sum(1) / L.sum(1)).mean()
    if kind == "tpauc":
        inner = torch.exp(L / lam).mean(1)
        return lam_pos * torch.log((inner ** (lam / lam_pos)).mean())
    if kind == "pauc_cvar":
        k = max(1, math.ceil(max_fpr * L.shape[1] - 1e-9))
        return torch.topk(L, k, dim=1).values.mean(1).mean()
    raise unknown_name("xrisk", kind, COMPOSITIONAL)


def check_compositional_params(spec: XRiskSpec) -> None:
    """Set-up checks (raise :class:`FedriskError` naming the key): ``γ, γ_v ∈ (0, 1]``,
    ``λ, λ' > 0``, ``max_fpr ∈ (0, 1]``, ``dual_lr > 0``.

    Example:
        >>> check_compositional_params(XRiskSpec("pauc_cvar", max_fpr=1.5))
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: max_fpr = 1.5 is out of range; allowed: (0.0, 1.0]
    """
    if spec.kind not in COMPOSITIONAL:
        raise unknown_name("xrisk", spec.kind, COMPOSITIONAL)
    values = {
        "gamma": spec.gamma,
        "lam": spec.lam,
        "lam_pos": spec.lam_pos,
        "gamma_v": spec.gamma_v,
        "max_fpr": spec.max_fpr,
        "dual_lr": spec.dual_lr,
    }
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise FedriskError(f"{name} must be a number; got {value!r}")
    check_range("gamma", spec.gamma, 0.0, 1.0, low_inclusive=False)
    check_range("gamma_v", spec.gamma_v, 0.0, 1.0, low_inclusive=False)
    check_range("lam", spec.lam, 0.0, None, low_inclusive=False)
    check_range("lam_pos", spec.lam_pos, 0.0, None, low_inclusive=False)
    check_range("max_fpr", spec.max_fpr, 0.0, 1.0, low_inclusive=False)
    check_range("dual_lr", spec.dual_lr, 0.0, None, low_inclusive=False)


def decomposed_step(
    spec: XRiskSpec,
    a: Tensor,
    b: Tensor,
    partner_neg: Tensor,
    partner_pos: Tensor,
    partner_u: Tensor | None,
    u: Tensor,
    v: Tensor | None = None,
    *,
    has_pos: Tensor | float = 1.0,
    has_neg: Tensor | float = 1.0,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    r"""One FeDXL local step of a compositional X-risk: ``(surrogate, u_new, v_new, risk estimate)``.

    The surrogate's gradient is ``G1 + G2`` (eqs. (5)–(6), (12)–(13) with the weights ``P``)::

        G1: mean_{p, q} P(u_p, L(a_p, h̃_q)) ∇_1 ℓ(a_p, sg h̃_q)       anchors: the active positives a
        G2: mean_{ζ, s} P(ũ_ζ, L(h̃1_ζ, c_s)) ∇_2 ℓ(sg h̃1_ζ, c_s)     partners: the active c

    ``"ap"``: the partners ``h̃`` of ``G1`` are ``[h̃1, h̃2]`` (the passive positives and negatives,
    ``S2`` = all examples) and ``c = [a, b]``; otherwise ``h̃ = h̃2`` and ``c = b``.  ``u``: the
    stored state of ``a``'s rows, updated here first (:func:`update_state`); ``partner_u``: the
    stored ``ũ`` of ``partner_pos`` (None: the partners are this step's own scores — Local Pair /
    centralised — and ``ũ`` is ``a``'s own state).  ``has_pos`` / ``has_neg`` (0 or 1) switch
    off the rows of a class the client lacks.  With ``partner_neg = b``, ``partner_pos = a``
    (detached) the gradient is that of :func:`centralized_surrogate` (the value is twice it:
    neither term is halved, spec §6.11).
    """
    dtype = a.dtype
    B1, B2 = a.shape[0], b.shape[0]
    ones1, zeros2 = torch.ones(B1, dtype=dtype, device=a.device), torch.zeros(B2, dtype=dtype, device=a.device)
    mask: Tensor | None
    if spec.kind == "ap":
        part1 = torch.cat([partner_pos, partner_neg]).detach()
        n_pos, n_neg = partner_pos.shape[0], partner_neg.shape[0]
        mask = torch.cat([ones1.new_ones(n_pos), ones1.new_zeros(n_neg)])
        others = torch.cat([a, b])
        cols = torch.cat([ones1 * has_pos, torch.ones(B2, dtype=dtype, device=a.device) * has_neg])
        mask2 = torch.cat([ones1, zeros2])
    else:
        part1, mask, others, mask2 = partner_neg.detach(), None, b, None
        cols = torch.ones(B2, dtype=dtype, device=a.device) * has_neg
    L1 = pairwise_loss(spec.surrogate, a, part1, spec.margin)
    u_new = update_state(spec, u, L1.detach(), mask)
    v_new = update_v(spec, v, u_new, has_pos) if spec.kind == "tpauc" and v is not None else v
    u_weights = u_new if weights_use_updated_u(spec.kind) else u
    g1 = (pair_weights(spec, L1, u_weights, pos_mask=mask, v=v_new) * L1).mean()
    if partner_u is None:
        partner_u = u_weights
    L2 = pairwise_loss(spec.surrogate, partner_pos.detach(), others, spec.margin)
    P2 = pair_weights(spec, L2, partner_u, pos_mask=mask2, v=v_new)
    g2 = (P2 * L2 * cols[None, :]).sum() / (L2.shape[0] * cols.sum().clamp(min=1))
    value = risk_value(
        spec.kind,
        spec.surrogate,
        a.detach(),
        part1,
        mask,
        margin=spec.margin,
        lam=spec.lam,
        lam_pos=spec.lam_pos,
        max_fpr=spec.max_fpr,
    )
    return has_pos * g1 + g2, u_new.detach(), v_new, value
