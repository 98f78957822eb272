"""Pairwise surrogates, the KL-DRO pAUC form, the decomposition identity and the pAUC metric (spec §7.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fedrisk.errors import FedriskError
from fedrisk.metrics.classification import parse_metric, partial_auroc
from fedrisk.objectives.xrisk import (
    PAIRWISE_LOSSES,
    check_xrisk_params,
    decomposed_surrogate,
    inner_loss,
    kl_pauc_risk,
    moving_average,
    outer_grad,
    outer_value,
    pairwise_loss,
)

F64 = torch.float64


def test_surrogate_values_and_signs() -> None:
    a, b = torch.tensor([0.9], dtype=F64), torch.tensor([0.4], dtype=F64)
    assert pairwise_loss("squared_hinge", a, b).item() == pytest.approx(0.25, abs=1e-15)
    assert pairwise_loss("square", a, b).item() == pytest.approx(0.25, abs=1e-15)
    assert pairwise_loss("sigmoid", a, b).item() == pytest.approx(1 / (1 + np.exp(0.5)), abs=1e-15)
    assert pairwise_loss("logistic", a, b).item() == pytest.approx(np.log1p(np.exp(-0.5)), abs=1e-15)
    # the squared hinge is zero once a - b >= m (the corrected sign of spec §1.4)
    assert pairwise_loss("squared_hinge", torch.tensor([2.0]), torch.tensor([1.0])).item() == 0.0
    g = torch.Generator().manual_seed(0)
    for name in PAIRWISE_LOSSES:  # scores in (0, 1) (sigmoid outputs): a − b < m = 1 for every pair
        a = torch.rand(50, dtype=F64, generator=g).requires_grad_(True)
        b = torch.rand(50, dtype=F64, generator=g).requires_grad_(True)
        ga, gb = torch.autograd.grad(pairwise_loss(name, a, b).sum(), (a, b))
        assert bool((ga <= 0).all()) and bool((gb >= 0).all()), name  # ∂_a ℓ <= 0 <= ∂_b ℓ
        for kind in ("auc", "pauc"):  # the inner pAUC loss keeps the monotonicity
            ga, gb = torch.autograd.grad(inner_loss(kind, name, a, b, lam=0.7).sum(), (a, b))
            assert bool((ga <= 0).all()) and bool((gb >= 0).all()), (name, kind)
    a, b = torch.randn(7, dtype=F64, generator=g), torch.randn(5, dtype=F64, generator=g)
    psm = pairwise_loss("sigmoid", a, b) + pairwise_loss("sigmoid", b, a).T  # PSM symmetry
    assert torch.allclose(psm, torch.ones_like(psm), atol=1e-15)


def test_kl_pauc_is_the_dro_value_and_the_outer_function() -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(6, dtype=F64, generator=g), torch.rand(9, dtype=F64, generator=g)
    lam = 0.8
    L = torch.clamp(1 - a[:, None] + b[None, :], min=0) ** 2
    # max_{p in simplex} Σ p_j L_j − λ KL(p, 1/n) is attained at p ∝ exp(L/λ)
    p = torch.softmax(L / lam, dim=1)
    dro = ((p * L).sum(1) - lam * (p * torch.log(p * L.shape[1])).sum(1)).mean()
    assert float(kl_pauc_risk(a, b, lam=lam)) == pytest.approx(float(dro), abs=1e-12)
    u = torch.tensor([1.0, 2.5], dtype=F64)
    assert outer_value("pauc", u, 2.0).tolist() == pytest.approx([0.0, 2 * np.log(2.5)])
    assert outer_grad("pauc", u, 2.0).tolist() == pytest.approx([2.0, 0.8])
    assert outer_value("auc", u).tolist() == u.tolist() and outer_grad("auc", u).tolist() == [1.0, 1.0]
    assert moving_average(u, torch.tensor([3.0, 0.5], dtype=F64), 0.5).tolist() == [2.0, 1.5]


@pytest.mark.parametrize(("kind", "surrogate"), [("auc", "sigmoid"), ("auc", "square"), ("pauc", "squared_hinge")])
def test_decomposition_equals_autograd_of_the_federated_objective(kind: str, surrogate: str) -> None:
    """(1/N) Σ_i (Δ_i1 + Δ_i2) (eqs. (4)–(6), (10)) = ∇F of eq. (3) / (8), float64, 1e-10 (spec §7.1-1)."""
    g = torch.Generator().manual_seed(2)
    N, d, lam = 4, 5, 0.9
    sizes = [(3, 5), (1, 7), (4, 2), (2, 6)]  # unequal |S1^i|, |S2^i|
    data = [(torch.randn(p, d, dtype=F64, generator=g), torch.randn(n, d, dtype=F64, generator=g)) for p, n in sizes]
    w = torch.randn(d, dtype=F64, generator=g) * 0.3

    def h(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ w)  # bounded, non-linear in w

    def inner_mean(w: torch.Tensor, xp: torch.Tensor) -> torch.Tensor:  # g(w, z, S2) with equal client weights
        return torch.stack([inner_loss(kind, surrogate, h(w, xp), h(w, xn), lam=lam).mean(1) for _, xn in data]).mean(0)

    def F(w: torch.Tensor) -> torch.Tensor:  # eq. (3) (linear f) / eq. (8)
        return torch.stack([outer_value(kind, inner_mean(w, xp), lam).mean() for xp, _ in data]).mean()

    wr = w.clone().requires_grad_(True)
    want = torch.autograd.grad(F(wr), wr)[0]

    total = torch.zeros_like(w)
    with torch.no_grad():
        u = [inner_mean(w, xp) for xp, _ in data]  # the exact g (no staleness)
        scores = [(h(w, xp), h(w, xn)) for xp, xn in data]
    for i, (xp, xn) in enumerate(data):
        for j in range(N):
            wr = w.clone().requires_grad_(True)
            a, b = h(wr, xp), h(wr, xn)
            delta1 = decomposed_surrogate(
                kind, surrogate, a, b, scores[j][1], scores[j][0], u[i], u[j], lam=lam, neg_weight=0.0
            )  # Δ_i1: own positives, client j's negatives
            delta2 = decomposed_surrogate(
                kind, surrogate, a, b, scores[j][1], scores[j][0], u[i], u[j], lam=lam, pos_weight=0.0
            )  # Δ_i2: own negatives, client j's positives (+ their u)
            total += torch.autograd.grad(delta1 + delta2, wr)[0] / (N * N)
    assert torch.allclose(total, want, rtol=1e-10, atol=1e-12), (total, want)


def test_bad_xrisk_parameters_are_named() -> None:
    ok = {"kind": "pauc", "surrogate": "squared_hinge", "lam": 1.0, "gamma": 0.1, "beta": 0.1, "margin": 1.0}
    for key, value, needle in [
        ("lam", 0.0, r"lam = 0.0 is out of range; allowed: \(0.0, inf\)"),
        ("lam", -1.0, "lam = -1.0 is out of range"),
        ("beta", 0.0, r"beta = 0.0 is out of range; allowed: \(0.0, 1.0\]"),
        ("beta", 1.5, "beta = 1.5 is out of range"),
        ("gamma", 2.0, "gamma = 2.0 is out of range"),
        ("kind", "ndcg", "unknown xrisk 'ndcg'"),
        ("surrogate", "hinge", "unknown surrogate 'hinge'"),
    ]:
        with pytest.raises(FedriskError, match=needle):
            check_xrisk_params(**{**ok, key: value})
    for bound in (0.0, 1.2, -0.1):
        with pytest.raises(FedriskError, match=r"max_fpr = .* is out of range; allowed: \(0.0, 1.0\]"):
            check_xrisk_params(**ok, max_fpr=bound)
        for kind in ("pauroc", "spauroc"):
            with pytest.raises(FedriskError, match="max_fpr"):
                parse_metric(f"{kind}:{bound}")
    check_xrisk_params(**ok, max_fpr=1.0)


@pytest.mark.parametrize("max_fpr", [0.3, 0.5])
def test_pauc_metric_in_both_conventions(max_fpr: float) -> None:
    """The metric equals an independent count (plain A / max_fpr) and scikit-learn (McClish), spec §7.1-8."""
    rng = np.random.default_rng(3)
    n_pos, n_neg = 37, 60  # max_fpr * n_neg is an integer: the ROC cut falls on a vertex
    s = np.concatenate([rng.normal(0.7, 1, n_pos), rng.normal(0, 1, n_neg)])
    y = np.concatenate([np.ones(n_pos), np.zeros(n_neg)])
    k = round(max_fpr * n_neg)
    top_negatives = np.sort(s[y == 0])[::-1][:k]  # the negatives ranked above the FPR bound
    plain = np.mean(s[y == 1][:, None] > top_negatives[None, :])  # (1/(n+ k)) Σ_{j ≤ k} Σ_i 1[s_i > s_(j)]
    assert partial_auroc(s, y, max_fpr) == pytest.approx(plain, abs=1e-12)
    area = plain * max_fpr
    mcclish = 0.5 * (1 + (area - max_fpr**2 / 2) / (max_fpr - max_fpr**2 / 2))
    assert partial_auroc(s, y, max_fpr, standardized=True) == pytest.approx(mcclish, abs=1e-12)
    sklearn_value = roc_auc_score(y, s, max_fpr=max_fpr)
    assert partial_auroc(s, y, max_fpr, standardized=True) == pytest.approx(sklearn_value, abs=1e-9)
    # the config names: pauroc (plain) and spauroc (McClish)
    assert parse_metric(f"pauroc:{max_fpr}")(s, y) == pytest.approx(plain, abs=1e-12)
    assert parse_metric(f"spauroc:{max_fpr}")(s, y) == pytest.approx(sklearn_value, abs=1e-9)


# ----------------------------------------------------------------------------- pinned by mutation testing


def test_defaults_and_margins_against_hand_values() -> None:
    """Default ``λ = 1``, ``m = 1``, and a non-default margin reaching the surrogate through
    :func:`xrisk`, :func:`kl_pauc_risk`, :func:`pairwise_auc_risk` and both terms of
    :func:`decomposed_surrogate` (the training tests all ran at ``m = 1``)."""
    from fedrisk.objectives.xrisk import pairwise_auc_risk, square_pair, xrisk

    a, b = torch.tensor([0.9, 0.2], dtype=F64), torch.tensor([0.4, 0.7, 0.1], dtype=F64)
    d = a[:, None] - b[None, :]
    hinge = lambda m: torch.clamp(m - d, min=0) ** 2  # noqa: E731
    torch.testing.assert_close(square_pair(a[:, None], b[None, :]), (1 - d) ** 2)
    u = torch.tensor([1.5, 3.0], dtype=F64)
    torch.testing.assert_close(outer_value("pauc", u), torch.log(u))  # λ = 1
    kl = lambda m, lam: (lam * torch.log(torch.exp(hinge(m) / lam).mean(1))).mean()  # noqa: E731
    torch.testing.assert_close(xrisk("pauc", "squared_hinge", a, b), kl(1.0, 1.0))
    torch.testing.assert_close(kl_pauc_risk(a, b), kl(1.0, 1.0))
    torch.testing.assert_close(xrisk("pauc", "squared_hinge", a, b, lam=0.5, margin=0.6), kl(0.6, 0.5))
    torch.testing.assert_close(kl_pauc_risk(a, b, lam=0.5, margin=0.6), kl(0.6, 0.5))
    torch.testing.assert_close(pairwise_auc_risk(a, b), torch.sigmoid(-d).mean())  # PSM by default
    torch.testing.assert_close(pairwise_auc_risk(a, b, "squared_hinge", margin=0.6), hinge(0.6).mean())
    torch.testing.assert_close(pairwise_auc_risk(a, b, "square"), ((1 - d) ** 2).mean())
    # decomposed: G1 pairs the active a with the passive negatives, G2 the passive positives with b
    pn, pp, ua, up = b[:2], a.flip(0), torch.tensor([1.2, 2.0], dtype=F64), torch.tensor([1.1, 1.7], dtype=F64)
    for lam, m, kw in ((1.0, 1.0, {}), (0.5, 0.6, {"lam": 0.5, "margin": 0.6})):
        L1 = torch.exp(torch.clamp(m - (a[:, None] - pn[None, :]), min=0) ** 2 / lam)
        L2 = torch.exp(torch.clamp(m - (pp[:, None] - b[None, :]), min=0) ** 2 / lam)
        want = (lam / ua * L1.mean(1)).mean() + (lam / up[:, None] * L2).mean()
        got = decomposed_surrogate("pauc", "squared_hinge", a, b, pn, pp, ua, up, **kw)
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)


@pytest.mark.parametrize("fn", ["inner_loss", "outer_value", "outer_grad"])
def test_an_unknown_kind_is_named(fn: str) -> None:
    call = {
        "inner_loss": lambda: inner_loss("pauc2", "square", torch.ones(2), torch.ones(3)),
        "outer_value": lambda: outer_value("pauc2", torch.ones(2)),
        "outer_grad": lambda: outer_grad("pauc2", torch.ones(2)),
    }[fn]
    with pytest.raises(FedriskError, match=r"^unknown xrisk 'pauc2'\. Did you mean 'pauc'\? Valid choices: ap, auc, "):
        call()


def test_inner_loss_and_outer_grad_default_to_lambda_one() -> None:
    a, b = torch.tensor([0.9, 0.2], dtype=F64), torch.tensor([0.4, 0.7, 0.1], dtype=F64)
    torch.testing.assert_close(inner_loss("pauc", "square", a, b), torch.exp((1 - (a[:, None] - b[None, :])) ** 2))
    u = torch.tensor([1.5, 3.0], dtype=F64)
    torch.testing.assert_close(outer_grad("pauc", u), 1 / u)


def test_squared_hinge_default_margin_and_unknown_surrogate() -> None:
    from fedrisk.objectives.xrisk import squared_hinge_pair

    a, b = torch.tensor([0.9, 0.2], dtype=F64), torch.tensor([0.4, 0.1], dtype=F64)
    torch.testing.assert_close(squared_hinge_pair(a, b), torch.clamp(1 - (a - b), min=0) ** 2)
    with pytest.raises(FedriskError, match=r"^unknown surrogate 'squre'\. Did you mean 'square'\? Valid choices: "):
        pairwise_loss("squre", a, b)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("lam", "x", "lam must be a number; got 'x'"),
        ("gamma", True, "gamma must be a number; got True"),
        ("beta", float("nan"), "beta must be a number; got nan"),
        ("margin", None, "margin must be a number; got None"),
        ("margin", 0.0, r"margin = 0.0 is out of range; allowed: (0.0, inf)"),
        ("margin", -1.0, r"margin = -1.0 is out of range; allowed: (0.0, inf)"),
    ],
)
def test_xrisk_params_are_numbers_and_name_themselves(key: str, value: object, message: str) -> None:
    kw = {"kind": "pauc", "surrogate": "squared_hinge", "lam": 1.0, "gamma": 0.1, "beta": 0.1, "margin": 1.0}
    with pytest.raises(FedriskError) as err:
        check_xrisk_params(**{**kw, key: value})
    assert str(err.value) == message
