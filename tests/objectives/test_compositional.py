"""AUPRC, two-way KL pAUC and CVaR pAUC (fedrisk.objectives.compositional): LibAUC oracle, the
active/passive decomposition, exact risks against direct computations, bad input."""

from __future__ import annotations

import importlib
import importlib.util
import math

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.objectives.compositional import (
    XRiskSpec,
    centralized_surrogate,
    check_compositional_params,
    decomposed_step,
    risk_value,
)

F64 = torch.float64
LABELS = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0])
SPECS = {
    "ap": XRiskSpec("ap", gamma=0.3, margin=0.8),
    "tpauc": XRiskSpec("tpauc", gamma=0.3, gamma_v=0.6, lam=1.3, lam_pos=0.7, margin=0.9),
    "pauc_cvar": XRiskSpec("pauc_cvar", max_fpr=0.3, dual_lr=0.2, margin=1.0),
}


def state(kind: str, n_pos: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    if kind == "ap":
        return torch.rand(n_pos, 2, generator=g, dtype=F64) + 0.5, None
    if kind == "tpauc":
        return torch.rand(n_pos, generator=g, dtype=F64) + 1.0, torch.tensor(1.7, dtype=F64)
    return 0.8 * torch.rand(n_pos, generator=g, dtype=F64), None


def libauc_loss(kind: str, n: int, idx: torch.Tensor, u: torch.Tensor, v: torch.Tensor | None):
    """LibAUC's loss object for ``kind`` with its state set to ``u`` (and ``v``) in float64."""
    if importlib.util.find_spec("libauc") is None:  # skipped only when the package is missing; CI installs it
        pytest.skip("libauc is not installed (pip install --no-deps libauc==2.0.1; see scripts/setup.sh)")
    losses = importlib.import_module("libauc.losses")  # an installed but broken LibAUC fails the test
    s = SPECS[kind]
    if kind == "ap":
        lib = losses.APLoss(data_len=n, gamma=s.gamma, margin=s.margin, device="cpu")
        lib.u_pos, lib.u_all = lib.u_pos.to(F64), lib.u_all.to(F64)
        lib.u_pos[idx, 0], lib.u_all[idx, 0] = u[:, 0], u[:, 1]
    elif kind == "tpauc":
        lib = losses.tpAUC_KL_Loss(
            data_len=n, tau=s.lam_pos, Lambda=s.lam, gammas=(s.gamma, s.gamma_v), margin=s.margin, device="cpu"
        )
        lib.u_pos = lib.u_pos.to(F64)
        lib.u_pos[idx, 0] = u
        lib.w = v.clone()
    else:
        lib = losses.pAUC_CVaR_Loss(
            data_len=n, pos_len=len(idx), beta=s.max_fpr, eta=s.dual_lr, margin=s.margin, device="cpu"
        )
        lib.u_pos = lib.u_pos.to(F64)
        lib.u_pos[idx, 0] = u
    return lib


@pytest.mark.parametrize("kind", ["ap", "tpauc", "pauc_cvar"])
@pytest.mark.parametrize("seed", [0, 1])
def test_centralised_objective_equals_libauc(kind: str, seed: int) -> None:
    """Value, gradient and updated state of one minibatch step equal LibAUC's loss to 1e-6."""
    g = torch.Generator().manual_seed(10 + seed)
    n = len(LABELS)
    h0 = torch.rand(n, generator=g, dtype=F64) * 2 - 0.5
    index = torch.arange(n)
    pos_idx = index[LABELS == 1]
    u, v = state(kind, len(pos_idx), seed)
    lib = libauc_loss(kind, n, pos_idx, u, v)
    h = h0.clone().requires_grad_()
    lib_value = lib(h, LABELS, index)
    (lib_grad,) = torch.autograd.grad(lib_value, h)
    h = h0.clone().requires_grad_()
    value, u_new, v_new = centralized_surrogate(SPECS[kind], h, LABELS, u, v)
    (grad,) = torch.autograd.grad(value, h)
    assert float(value.detach()) == pytest.approx(float(lib_value.detach()), abs=1e-6)
    assert torch.allclose(grad, lib_grad.to(F64), atol=1e-6, rtol=0)
    assert float(grad.abs().max()) > 1e-3  # a non-trivial step
    if kind == "ap":
        assert torch.allclose(u_new[:, 0], lib.u_pos[pos_idx, 0], atol=1e-6)
        assert torch.allclose(u_new[:, 1], lib.u_all[pos_idx, 0], atol=1e-6)
    else:
        assert torch.allclose(u_new, lib.u_pos[pos_idx, 0].to(F64), atol=1e-6)  # CVaR: float32 count in LibAUC
    if kind == "tpauc":
        assert float(v_new) == pytest.approx(float(lib.w), abs=1e-12)


@pytest.mark.parametrize("kind", ["ap", "tpauc", "pauc_cvar"])
def test_decomposition_with_own_partners_is_the_centralised_gradient(kind: str) -> None:
    """G1 + G2 with the step's own scores as (detached) partners = the gradient of the centralised
    loss (both sides of every pair), and the same state update."""
    g = torch.Generator().manual_seed(3)
    a0, b0 = torch.rand(3, generator=g, dtype=F64), torch.rand(5, generator=g, dtype=F64)
    u, v = state(kind, 3, 4)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    loss, u1, v1, _ = decomposed_step(SPECS[kind], a, b, b.detach(), a.detach(), None, u, v)
    ga, gb = torch.autograd.grad(loss, (a, b))
    h = torch.cat([a0, b0]).requires_grad_()
    labels = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0])
    ref, u2, v2 = centralized_surrogate(SPECS[kind], h, labels, u, v)
    (gh,) = torch.autograd.grad(ref, h)
    assert torch.allclose(torch.cat([ga, gb]), gh, atol=1e-12)
    assert torch.allclose(u1, u2, atol=1e-14)
    if kind == "tpauc":
        assert torch.allclose(v1, v2, atol=1e-14)


def test_ap_step_against_a_direct_transcription() -> None:
    """FeDXL's AP step with passive pools: G1 (active positives vs the passive positives and
    negatives, weights from the *updated* u) and G2 (passive positives with their stored ũ vs the
    active positives and negatives), written out by hand; a change of ũ moves G2 only."""
    spec = XRiskSpec("ap", gamma=0.3, margin=0.8)
    g = torch.Generator().manual_seed(5)
    a0, b0 = torch.rand(2, generator=g, dtype=F64), torch.rand(3, generator=g, dtype=F64)
    pn, pp = torch.rand(3, generator=g, dtype=F64), torch.rand(2, generator=g, dtype=F64)
    u = torch.rand(2, 2, generator=g, dtype=F64) + 0.5
    pu = torch.tensor([[0.2, 1.0], [0.9, 3.0]], dtype=F64)
    a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    loss, u_new, _, _ = decomposed_step(spec, a, b, pn, pp, pu, u)
    ga, gb = torch.autograd.grad(loss, (a, b))

    def hinge(x: float, z: float) -> float:  # (m − (x − z))_+ ; ℓ = hinge², ∂ℓ/∂x = −2 hinge, ∂ℓ/∂z = +2 hinge
        return max(0.0, spec.margin - (x - z))

    partners = [(float(x), 1.0) for x in pp] + [(float(x), 0.0) for x in pn]
    want_a, want_b = [0.0, 0.0], [0.0, 0.0, 0.0]
    for i, ai in enumerate(a0.tolist()):
        g_pos = sum(y * hinge(ai, z) ** 2 for z, y in partners) / len(partners)
        g_all = sum(hinge(ai, z) ** 2 for z, _ in partners) / len(partners)
        up = (1 - spec.gamma) * float(u[i, 0]) + spec.gamma * g_pos
        ua = (1 - spec.gamma) * float(u[i, 1]) + spec.gamma * g_all
        assert float(u_new[i, 0]) == pytest.approx(up) and float(u_new[i, 1]) == pytest.approx(ua)
        for z, y in partners:  # G1
            want_a[i] += (up - ua * y) / ua**2 * (-2 * hinge(ai, z)) / (2 * len(partners))
    cols = [(float(x), 1.0, ("a", i)) for i, x in enumerate(a0)] + [(float(x), 0.0, ("b", j)) for j, x in enumerate(b0)]
    for zeta, anchor in enumerate(pp.tolist()):  # G2
        for c, y, (side, j) in cols:
            w = (float(pu[zeta, 0]) - float(pu[zeta, 1]) * y) / float(pu[zeta, 1]) ** 2
            d = w * 2 * hinge(anchor, c) / (len(pp) * len(cols))
            if side == "a":
                want_a[j] += d
            else:
                want_b[j] += d
    assert torch.allclose(ga, torch.tensor(want_a, dtype=F64), atol=1e-12)
    assert torch.allclose(gb, torch.tensor(want_b, dtype=F64), atol=1e-12)


def test_risks_against_direct_computation() -> None:
    g = torch.Generator().manual_seed(7)
    h = torch.rand(9, generator=g, dtype=F64)
    y = torch.tensor([1, 0, 1, 0, 0, 1, 0, 0, 0])
    hp, hn = h[y == 1], h[y == 0]

    def sh(x: float, z: float) -> float:
        return max(0.0, 1.0 - (x - z)) ** 2

    # AP (eq. (19)): −mean_i Σ_{j pos} ℓ / Σ_j ℓ over all j
    ap = -sum(sum(sh(float(i), float(j)) for j in hp) / sum(sh(float(i), float(j)) for j in h) for i in hp) / len(hp)
    assert float(risk_value("ap", "squared_hinge", hp, h, y.bool())) == pytest.approx(ap, abs=1e-12)
    # two-way KL: λ' log mean_i (mean_j exp(ℓ/λ))^(λ/λ')
    lam, lam_pos = 0.7, 1.9
    inner = [sum(math.exp(sh(float(i), float(j)) / lam) for j in hn) / len(hn) for i in hp]
    tp = lam_pos * math.log(sum(x ** (lam / lam_pos) for x in inner) / len(inner))
    assert float(risk_value("tpauc", "squared_hinge", hp, hn, lam=lam, lam_pos=lam_pos)) == pytest.approx(tp)
    # CVaR at the optimum equals min_s s + mean_j (ℓ − s)_+ / β (scanned over the pair losses)
    beta = 3 / 6
    cvar = 0.0
    for i in hp:
        losses = [sh(float(i), float(j)) for j in hn]
        cvar += min(s + sum(max(0.0, x - s) for x in losses) / (beta * len(losses)) for s in losses)
    cvar /= len(hp)
    assert float(risk_value("pauc_cvar", "squared_hinge", hp, hn, max_fpr=beta)) == pytest.approx(cvar, abs=1e-12)


def test_sopa_threshold_converges_to_the_quantile() -> None:
    """Iterating the threshold step with fixed losses drives s to the (1 − β) quantile (top-k)."""
    spec = XRiskSpec("pauc_cvar", max_fpr=0.25, dual_lr=0.01)
    losses = torch.arange(1.0, 9.0, dtype=F64)[None, :]  # 8 negatives, top-k = 2 -> s in [6, 7)
    s = torch.zeros(1, dtype=F64)
    from fedrisk.objectives.compositional import update_state

    for _ in range(3000):
        s = update_state(spec, s, losses)
    assert 6.0 - 0.05 <= float(s) <= 7.0 + 0.05


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (XRiskSpec("pauc_cvar", max_fpr=0.0), r"max_fpr = 0.0 is out of range; allowed: \(0.0, 1.0\]"),
        (XRiskSpec("pauc_cvar", max_fpr=1.2), "max_fpr = 1.2 is out of range"),
        (XRiskSpec("pauc_cvar", dual_lr=-1.0), "dual_lr = -1.0 is out of range"),
        (XRiskSpec("tpauc", lam_pos=0.0), "lam_pos = 0.0 is out of range"),
        (XRiskSpec("tpauc", gamma_v=1.5), "gamma_v = 1.5 is out of range"),
        (XRiskSpec("ap", gamma=0.0), "gamma = 0.0 is out of range"),
        (XRiskSpec("ndcg"), "unknown xrisk 'ndcg'"),
        (XRiskSpec("ap", gamma=float("nan")), "gamma must be a number"),
    ],
)
def test_bad_parameters_are_named(spec: XRiskSpec, needle: str) -> None:
    with pytest.raises(FedriskError, match=needle):
        check_compositional_params(spec)
