"""Projections and games of fedrisk.objectives.minimax (spec 001 §7.1-U5)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fedrisk.errors import FedriskError
from fedrisk.objectives.minimax import (
    group_losses,
    make_projection,
    per_sample_cross_entropy,
    project_ball,
    project_box,
    project_simplex,
    quadratic_game,
    quadratic_grad_phi,
    wgan_objective,
    wgan_phi,
)

F64 = torch.float64


def brute_force_simplex(v: torch.Tensor) -> torch.Tensor:
    """The projection by enumerating supports: for support S the KKT point is max(v - θ_S, 0) with
    θ_S = (Σ_S v - 1)/|S|; keep the feasible candidates that satisfy the KKT conditions
    (p_i = v_i - θ > 0 on S, v_j <= θ off S) and return the closest one."""
    n = v.shape[0]
    best, best_d = None, float("inf")
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            theta = (v[s].sum() - 1) / size
            p = torch.zeros_like(v)
            p[s] = v[s] - theta
            off = [j for j in range(n) if j not in support]
            if (p[s] <= 0).any() or (off and (v[off] > theta + 1e-12).any()):
                continue
            d = float(((p - v) ** 2).sum())
            if d < best_d:
                best, best_d = p, d
    assert best is not None
    return best


def test_simplex_projection_matches_the_brute_force_kkt_solution() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = 1 + trial % 6
        v = torch.randn(n, generator=g, dtype=F64) * (0.1 + trial % 4)
        p = project_simplex(v)
        torch.testing.assert_close(p, brute_force_simplex(v), rtol=0, atol=1e-12)
        assert abs(float(p.sum()) - 1) < 1e-12 and bool((p >= 0).all())


def test_simplex_projection_is_rowwise_and_idempotent() -> None:
    g = torch.Generator().manual_seed(1)
    v = torch.randn(7, 5, generator=g, dtype=F64) * 3
    p = project_simplex(v)
    for i in range(7):
        torch.testing.assert_close(p[i], project_simplex(v[i]), rtol=0, atol=1e-15)
    torch.testing.assert_close(project_simplex(p), p, rtol=0, atol=1e-15)
    # ties and a point far outside
    tie = project_simplex(torch.tensor([5.0, 5.0, -9.0], dtype=F64))
    torch.testing.assert_close(tie, torch.tensor([0.5, 0.5, 0.0], dtype=F64))


def test_simplex_projection_runs_under_vmap() -> None:
    v = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    torch.testing.assert_close(torch.vmap(project_simplex)(v), project_simplex(v))


def test_box_and_ball() -> None:
    v = torch.tensor([-3.0, 0.2, 9.0], dtype=F64)
    assert project_box(v, -1.0, 1.0).tolist() == [-1.0, 0.2, 1.0]
    b = project_ball(v, 2.0)
    assert abs(float(b.norm()) - 2.0) < 1e-12
    torch.testing.assert_close(b / b.norm(), v / v.norm())
    inside = torch.tensor([0.1, 0.2], dtype=F64)
    assert torch.equal(project_ball(inside, 1.0), inside)
    with pytest.raises(FedriskError, match=r"low = 2\.0 must be <= high = 1\.0"):
        project_box(v, 2.0, 1.0)
    with pytest.raises(FedriskError, match="radius"):
        project_ball(v, 0.0)


def test_make_projection_checks_names_and_shapes() -> None:
    with pytest.raises(FedriskError, match="unknown dual_set 'sphere'"):
        make_projection("sphere", 3)
    with pytest.raises(FedriskError, match="dimension must be an integer >= 1"):
        make_projection("simplex", 0)
    proj = make_projection("box", 2, low=0.0, high=1.0)
    with pytest.raises(FedriskError, match=r"dimension 2; got y of shape \(3,\)"):
        proj(torch.zeros(3))
    with pytest.raises(FedriskError, match=r"got y of shape \(\)"):
        make_projection("simplex", 1)(torch.tensor(1.0))
    assert make_projection("none", 2)(torch.tensor([5.0, -5.0])).tolist() == [5.0, -5.0]


def test_group_losses_ignore_absent_groups() -> None:
    per = torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=F64)
    out = group_losses(per, torch.tensor([2, 2, 0, 2]), 4)
    assert out.tolist() == [3.0, 0.0, 13.0 / 3, 0.0]


def test_wgan_closed_form_phi_is_the_max_over_phi() -> None:
    """Φ(μ, σ) = max_φ f: the maximiser φ* = (A, B)/(2λ) attains the closed form (spec §4.1)."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(500, generator=g, dtype=F64)
    mu, sigma, lam = 0.3, 0.7, 0.01
    real, fake = 0.1 * z, mu + sigma * z
    a = (real - fake).mean()
    b = (real**2 - fake**2).mean()
    phi_star = torch.stack([a, b]) / (2 * lam)
    value = float(wgan_objective(real, fake, phi_star, lam))
    assert value == pytest.approx(wgan_phi(mu, sigma, z, 0.0, 0.1, lam), rel=1e-12)
    # any other φ gives less (strong concavity)
    assert float(wgan_objective(real, fake, phi_star + 0.01, lam)) < value


def test_quadratic_game_gradient_of_phi_is_exact() -> None:
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 2, generator=g, dtype=F64)
    b = torch.randn(3, generator=g, dtype=F64)
    x = torch.randn(2, generator=g, dtype=F64, requires_grad=True)
    mu, c = 0.5, 0.7
    y_star = (a @ x + b) / mu
    phi = quadratic_game(x, y_star, b[None], a, c, mu)  # Φ(x) = f(x, y*(x))
    (grad,) = torch.autograd.grad(phi, x)
    torch.testing.assert_close(grad, quadratic_grad_phi(x.detach(), a, b, c, mu), rtol=1e-12, atol=1e-12)


def test_wgan_closed_form_directions_equal_autograd() -> None:
    from fedrisk.objectives.minimax import wgan_affine_directions

    g = torch.Generator().manual_seed(5)
    z = torch.randn(100, generator=g, dtype=F64)
    real = 0.1 * z
    leaves = [torch.tensor(v, dtype=F64, requires_grad=True) for v in (0.7, 1.3)]
    phi = torch.randn(2, generator=g, dtype=F64, requires_grad=True)
    value = wgan_objective(real, leaves[0] + leaves[1] * z, phi, 0.005)
    auto = torch.autograd.grad(value, [*leaves, phi])
    mu, sigma = (leaf.detach() for leaf in leaves)
    f, g_mu, g_sigma, g_phi = wgan_affine_directions(mu, sigma, z, real, phi.detach(), 0.005)
    for got, want in zip((f, g_mu, g_sigma, g_phi), (value.detach(), *auto)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


# -- pinned by the sgda mutation scope (docs/reliability.md) ------------------------------------
def test_box_and_ball_edges_and_rows() -> None:
    """A box of one point is allowed; the ball projects each row of a batch by its own norm; a
    radius <= 0 is refused naming it."""
    v = torch.tensor([-3.0, 0.2, 9.0], dtype=F64)
    assert project_box(v, 0.5, 0.5).tolist() == [0.5, 0.5, 0.5]
    rows = torch.tensor([[3.0, 4.0, 0.0], [0.1, 0.2, 0.2], [0.0, 0.0, -6.0], [1.0, 1.0, 1.0]], dtype=F64)
    want = [[0.6, 0.8, 0.0], [0.1, 0.2, 0.2], [0.0, 0.0, -1.0], [3**-0.5] * 3]
    torch.testing.assert_close(project_ball(rows, 1.0), torch.tensor(want, dtype=F64), rtol=1e-15, atol=1e-15)
    square = rows[:3, :3]  # as many rows as columns: a norm broadcast along the wrong axis shows
    torch.testing.assert_close(project_ball(square, 1.0), torch.tensor(want[:3], dtype=F64), rtol=1e-15, atol=1e-15)
    with pytest.raises(FedriskError) as err:
        project_ball(v, 0.0)
    assert str(err.value) == "radius = 0.0 is out of range; allowed: (0.0, inf)"


def test_make_projection_defaults_and_argument_checks() -> None:
    """Defaults: the box [-1, 1] and the unit ball; the box bounds are checked only for a box and
    the radius only for a ball, each naming the key."""
    v = torch.tensor([-3.0, 0.5, 3.0], dtype=F64)
    assert make_projection("box", 3)(v).tolist() == [-1.0, 0.5, 1.0]
    torch.testing.assert_close(make_projection("ball", 3)(v), v / v.norm(), rtol=1e-15, atol=1e-15)
    assert make_projection("box", 3, low=0.5, high=0.5)(v).tolist() == [0.5, 0.5, 0.5]
    make_projection("simplex", 3, low=1.0, high=0.0, radius=0.0)  # unused bounds are not checked
    with pytest.raises(FedriskError) as err:
        make_projection("box", 3, low=1.0, high=0.0)
    assert str(err.value) == "dual box: low = 1.0 must be <= high = 0.0"
    with pytest.raises(FedriskError) as err:
        make_projection("ball", 3, radius=0.0)
    assert str(err.value) == "dual_radius = 0.0 is out of range; allowed: (0.0, inf)"
    for dim in (True, 2.5, "3"):
        with pytest.raises(FedriskError) as err:
            make_projection("simplex", dim)  # type: ignore[arg-type]
        assert str(err.value) == f"the dual dimension must be an integer >= 1; got {dim!r}"


def test_wgan_phi_with_nonzero_targets_by_hand() -> None:
    """Φ = (A² + B²)/(4λ), A = mean(real − fake), B = mean(real² − fake²), real = μ̂ + σ̂ z,
    fake = μ + σ z (the maximiser φ* = (A, B)/(2λ) of §4.1) with μ̂, σ̂ away from 0 and 1."""
    z = torch.tensor([-1.3, 0.2, 0.9, 2.1, -0.4], dtype=F64)
    mu, sigma, t_mu, t_sigma, lam = 0.3, 0.7, 0.45, 0.35, 0.02
    real, fake = [t_mu + t_sigma * float(u) for u in z], [mu + sigma * float(u) for u in z]
    a = sum(r - f for r, f in zip(real, fake)) / len(z)
    b = sum(r * r - f * f for r, f in zip(real, fake)) / len(z)
    assert wgan_phi(mu, sigma, z, t_mu, t_sigma, lam) == pytest.approx((a * a + b * b) / (4 * lam), rel=1e-12)


def test_per_sample_cross_entropy_by_hand() -> None:
    """Softmax cross-entropy log Σ_c e^{o_c} − o_y per row (also for a batch of one row); a
    binary logit s ([B] or [B, 1]) gives log(1 + e^s) − y s."""
    out = [[0.2, -1.0, 2.5], [1.5, 0.3, -0.7]]
    labels = [2, 0]
    want = [math.log(sum(math.exp(o) for o in row)) - row[y] for row, y in zip(out, labels)]
    got = per_sample_cross_entropy(torch.tensor(out, dtype=F64), torch.tensor(labels))
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), rtol=1e-14, atol=0)
    one = per_sample_cross_entropy(torch.tensor(out[1:], dtype=F64), torch.tensor(labels[1:]))
    torch.testing.assert_close(one, torch.tensor(want[1:], dtype=F64), rtol=1e-14, atol=0)
    logits, y = [0.4, -1.2, 2.0], [1, 0, 1]
    want = torch.tensor([math.log1p(math.exp(s)) - t * s for s, t in zip(logits, y)], dtype=F64)
    for shape in ((3,), (3, 1)):
        got = per_sample_cross_entropy(torch.tensor(logits, dtype=F64).reshape(shape), torch.tensor(y).reshape(shape))
        torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
