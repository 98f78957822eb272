r"""Federated minimax problems ``min_x max_{y ∈ Y} (1/M) Σ_i f_i(x, y)``: projections onto ``Y``
and the games of FESS-GDA's paper (spec ``shared/specs/001_fessgda.md``) as pure functions.

Projections (the ``P_Y`` of Alg. 1, spec §1.1; all act on the last dimension, so a batch of
vectors is projected row by row):

* :func:`project_simplex` — the probability simplex ``{y : Σ y = 1, y ≥ 0}`` (eq. (2)), exact
  and sort-based (O(C log C));
* :func:`project_box` — ``[low, high]`` coordinate-wise;
* :func:`project_ball` — the Euclidean ball ``||y|| ≤ radius``;
* :func:`make_projection` — one of them (or the identity for ``Y = R^d``) by name, checking the
  shape of ``y`` on every call.

Games (``f(x, y; batch)``, ``x`` the model / generator parameters, ``y`` the dual variable):

* :func:`group_losses` / :func:`weighted_group_loss` — eq. (2)'s ``Σ_c y_c F_c(x)`` with ``F_c``
  the mean loss of the batch's samples of group (class or sensitive attribute) ``c`` (spec §6-11:
  ``F̂_c = 0`` when the batch has no sample of ``c``);
* :func:`wgan_objective` — the 1-D WGAN of §4.1: ``mean D_φ(real) − mean D_φ(G(z)) − λ||φ||²``
  with the quadratic discriminator ``D_φ(t) = φ₁ t + φ₂ t²``; :func:`wgan_phi` its primal
  function in closed form;
* :func:`quadratic_game` — the NC-SC game of spec §7.2-B2,
  ``c Σ_k cos(x_k) + yᵀ(A x + r) − (μ/2)||y||²``, with :func:`quadratic_grad_phi` the exact
  ``∇Φ(x) = −c sin(x) + Aᵀ(A x + b)/μ``.

Example:
    >>> import torch
    >>> project_simplex(torch.tensor([0.5, 1.5, -1.0])).tolist()
    [0.0, 1.0, 0.0]
    >>> [round(v, 6) for v in project_ball(torch.tensor([3.0, 4.0]), 1.0).tolist()]
    [0.6, 0.8]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from fedrisk.errors import FedriskError, check_range, unknown_name

__all__ = [
    "DUAL_SETS",
    "group_losses",
    "make_projection",
    "per_sample_cross_entropy",
    "project_ball",
    "project_box",
    "project_simplex",
    "quadratic_game",
    "quadratic_grad_phi",
    "quadratic_matrix",
    "weighted_group_loss",
    "wgan_affine_directions",
    "wgan_objective",
    "wgan_phi",
]

DUAL_SETS = ("simplex", "box", "ball", "none")
"""The dual sets :func:`make_projection` knows (``"none"``: ``Y = R^d``, no projection)."""


# ============================================================================================
# projections
# ============================================================================================


def project_simplex(v: Tensor) -> Tensor:
    r"""The Euclidean projection of ``v`` onto the probability simplex (last dimension).

    The sort-based algorithm (Held et al. 1974; Duchi et al. 2008): with ``u`` the entries sorted
    in decreasing order and ``ρ = max{j : u_j − (Σ_{i≤j} u_i − 1)/j > 0}``, the projection is
    ``max(v − θ, 0)`` with ``θ = (Σ_{i≤ρ} u_i − 1)/ρ``.  Pure tensor code (no Python branch on
    values), so it runs under ``torch.func.vmap``.

    Example:
        >>> import torch
        >>> project_simplex(torch.tensor([0.2, 0.3, 0.5])).tolist()  # already on the simplex
        [0.20000000298023224, 0.30000001192092896, 0.5]
        >>> project_simplex(torch.tensor([[2.0, 0.0], [0.3, 0.3]], dtype=torch.float64)).tolist()
        [[1.0, 0.0], [0.5, 0.5]]
    """
    n = v.shape[-1]
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = torch.cumsum(u, dim=-1) - 1
    j = torch.arange(1, n + 1, dtype=v.dtype, device=v.device)
    active = (u - css / j) > 0
    rho = active.to(v.dtype).cumsum(-1).amax(-1, keepdim=True).clamp(min=1)  # the last active index (1-based)
    theta = css.gather(-1, (rho - 1).long()) / rho
    return torch.clamp(v - theta, min=0)


def project_box(v: Tensor, low: float | Tensor, high: float | Tensor) -> Tensor:
    """Coordinate-wise clipping onto ``[low, high]``.

    Example:
        >>> import torch
        >>> project_box(torch.tensor([-2.0, 0.5, 3.0]), -1.0, 1.0).tolist()
        [-1.0, 0.5, 1.0]
    """
    if not isinstance(low, Tensor) and not isinstance(high, Tensor) and low > high:
        raise FedriskError(f"project_box: low = {low} must be <= high = {high}")
    return torch.clamp(v, min=low, max=high)


def project_ball(v: Tensor, radius: float) -> Tensor:
    """The projection onto the Euclidean ball ``{y : ||y|| ≤ radius}`` (last dimension).

    Example:
        >>> import torch
        >>> project_ball(torch.tensor([0.3, 0.4]), 1.0).tolist()  # inside: unchanged
        [0.30000001192092896, 0.4000000059604645]
    """
    check_range("radius", radius, 0.0, None, low_inclusive=False)
    norm = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return v * (radius / torch.clamp(norm, min=radius))


def make_projection(
    dual_set: str, dim: int, *, low: float = -1.0, high: float = 1.0, radius: float = 1.0
) -> Callable[[Tensor], Tensor]:
    """``P_Y`` for ``Y`` = ``dual_set`` of dimension ``dim``; the returned function refuses a ``y``
    whose last dimension is not ``dim`` (a projection that does not match y's shape).

    Example:
        >>> import torch
        >>> proj = make_projection("simplex", 3)
        >>> proj(torch.tensor([1.0, 1.0, 4.0])).tolist()
        [0.0, 0.0, 1.0]
        >>> proj(torch.ones(4))
        Traceback (most recent call last):
        fedrisk.errors.FedriskError: the simplex projection is for dual variables of dimension 3; got y of shape (4,)
    """
    if dual_set not in DUAL_SETS:
        raise unknown_name("dual_set", dual_set, DUAL_SETS)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise FedriskError(f"the dual dimension must be an integer >= 1; got {dim!r}")
    if dual_set == "box" and low > high:
        raise FedriskError(f"dual box: low = {low} must be <= high = {high}")
    if dual_set == "ball":
        check_range("dual_radius", radius, 0.0, None, low_inclusive=False)
    base: Callable[[Tensor], Tensor] = {
        "simplex": project_simplex,
        "box": lambda y: project_box(y, low, high),
        "ball": lambda y: project_ball(y, radius),
        "none": lambda y: y,
    }[dual_set]

    def project(y: Tensor) -> Tensor:
        if y.dim() == 0 or y.shape[-1] != dim:
            raise FedriskError(
                f"the {dual_set} projection is for dual variables of dimension {dim}; got y of shape {tuple(y.shape)}"
            )
        return base(y)

    return project


# ============================================================================================
# games
# ============================================================================================


def group_losses(per_sample: Tensor, groups: Tensor, num_groups: int) -> Tensor:
    r"""``F̂_c`` = the mean of ``per_sample`` over the rows of group ``c`` (0 for an absent group).

    Example:
        >>> import torch
        >>> group_losses(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 2]), 3).tolist()
        [2.0, 0.0, 5.0]
    """
    ids = torch.arange(num_groups, device=groups.device)
    onehot = (groups.long()[:, None] == ids).to(per_sample.dtype)  # [B, C] (no value checks: vmap-safe)
    sums = per_sample @ onehot
    counts = onehot.sum(0)
    return sums / torch.clamp(counts, min=1)


def weighted_group_loss(per_sample: Tensor, groups: Tensor, y: Tensor) -> Tensor:
    r"""Eq. (2) on a minibatch: ``Σ_c y_c F̂_c`` (spec §6-11; ``∇_y`` is the vector ``F̂``).

    Example:
        >>> import torch
        >>> weighted_group_loss(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), torch.tensor([0.5, 0.5])).item()
        3.5
    """
    return torch.dot(y, group_losses(per_sample, groups, y.shape[-1]))


def wgan_objective(real: Tensor, fake: Tensor, phi: Tensor, lam: float) -> Tensor:
    r"""The 1-D WGAN of §4.1 on a batch: ``mean D_φ(real) − mean D_φ(fake) − λ ||φ||²`` with
    ``D_φ(t) = φ₁ t + φ₂ t²`` (``fake = G(z) = μ + σ z``).  ``(2λ)``-strongly concave in ``φ``.

    Example:
        >>> import torch
        >>> wgan_objective(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0, 1.0]), 0.5).item()
        1.0
    """

    def d(t: Tensor) -> Tensor:
        return phi[0] * t + phi[1] * t * t

    return d(real).mean() - d(fake).mean() - lam * torch.dot(phi, phi)


def wgan_affine_directions(
    mu: Tensor, sigma: Tensor, z: Tensor, real: Tensor, phi: Tensor, lam: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r""":func:`wgan_objective` for the affine generator ``g = μ + σ z`` and its gradients in closed
    form (spec §4.1): with ``u_j = −(φ₁ + 2φ₂ g_j)/B``::

        ∇_μ = Σ u_j,   ∇_σ = Σ u_j z_j,   ∇_φ = (mean(x − g), mean(x² − g²)) − 2λφ

    Returns ``(f, ∇_μ, ∇_σ, ∇_φ)``; equal to autograd's to rounding, without a backward pass.

    Example:
        >>> import torch
        >>> one = lambda v: torch.tensor(v, dtype=torch.float64)
        >>> z, real, phi = one([0.0, 1.0]), one([0.0, 0.1]), one([1.0, 0.0])
        >>> f, gm, gs, gp = wgan_affine_directions(one(1.0), one(1.0), z, real, phi, 0.5)
        >>> float(f), float(gm), float(gs), gp.tolist()
        (-1.95, -1.0, -0.5, [-2.45, -2.495])
    """
    g = mu + sigma * z
    phi1, phi2 = phi[0], phi[1]
    n = z.shape[-1]
    dx, dx2 = (real - g).mean(), (real * real - g * g).mean()
    value = phi1 * dx + phi2 * dx2 - lam * torch.dot(phi, phi)
    u = -(phi1 + 2 * phi2 * g) / n
    grad_phi = torch.stack([dx, dx2]) - 2 * lam * phi
    return value, u.sum(), torch.dot(u, z), grad_phi


def wgan_phi(mu: float, sigma: float, z: Tensor, target_mu: float, target_sigma: float, lam: float) -> float:
    r"""``Φ(μ, σ) = max_φ f = (A² + B²)/(4λ)`` with ``A = (μ̂ − μ) + (σ̂ − σ) m₁`` and
    ``B = (μ̂² − μ²) + 2(μ̂σ̂ − μσ) m₁ + (σ̂² − σ²) m₂`` (``m₁, m₂`` the first two moments of the
    shared noise ``z``; spec §4.1, derived).

    Example:
        >>> import torch
        >>> wgan_phi(0.0, 0.1, torch.tensor([-1.0, 1.0]), 0.0, 0.1, 0.01)
        0.0
    """
    m1, m2 = float(z.mean()), float((z * z).mean())
    a = (target_mu - mu) + (target_sigma - sigma) * m1
    b = (target_mu**2 - mu**2) + 2 * (target_mu * target_sigma - mu * sigma) * m1 + (target_sigma**2 - sigma**2) * m2
    return (a * a + b * b) / (4 * lam)


def quadratic_game(x: Tensor, y: Tensor, rows: Tensor, a: Tensor, curvature: float, mu: float) -> Tensor:
    r"""The NC-SC game of spec §7.2-B2 on a batch: ``c Σ_k cos(x_k) + yᵀ(A x + mean(rows)) − (μ/2)||y||²``.

    ``rows`` are ``[B, d2]`` draws of ``b + δ_i + noise``; nonconvex in ``x``, μ-strongly concave in ``y``.

    Example:
        >>> import torch
        >>> x, y = torch.zeros(2), torch.ones(2)
        >>> quadratic_game(x, y, torch.ones(1, 2), torch.eye(2), 1.0, 2.0).item()
        2.0
    """
    return curvature * torch.cos(x).sum() + torch.dot(y, a @ x + rows.mean(0)) - 0.5 * mu * torch.dot(y, y)


def quadratic_grad_phi(x: Tensor, a: Tensor, b: Tensor, curvature: float, mu: float) -> Tensor:
    r"""``∇Φ(x) = −c sin(x) + Aᵀ(A x + b)/μ`` for :func:`quadratic_game` (``y*(x) = (A x + b)/μ``).

    Example:
        >>> import torch
        >>> quadratic_grad_phi(torch.zeros(2), torch.eye(2), torch.ones(2), 1.0, 2.0).tolist()
        [0.5, 0.5]
    """
    return -curvature * torch.sin(x) + a.T @ (a @ x + b) / mu


def per_sample_cross_entropy(outputs: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy per row: softmax on ``[B, C]`` logits, binary (logit) on ``[B]`` / ``[B, 1]``.

    Example:
        >>> import torch
        >>> [round(v, 4) for v in per_sample_cross_entropy(torch.zeros(2, 4), torch.tensor([0, 3])).tolist()]
        [1.3863, 1.3863]
        >>> [round(v, 4) for v in per_sample_cross_entropy(torch.tensor([0.0, 2.0]), torch.tensor([1, 1])).tolist()]
        [0.6931, 0.1269]
    """
    if outputs.dim() == 1 or outputs.shape[-1] == 1:
        s = outputs.reshape(-1)
        return F.softplus(s) - labels.reshape(-1).to(s.dtype) * s
    return torch.logsumexp(outputs, -1) - outputs.gather(-1, labels.long()[:, None])[:, 0]


@functools.lru_cache(maxsize=16)
def quadratic_matrix(seed: int, rows: int, cols: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """The coupling ``A ∈ R^{rows × cols}`` of the quadratic game: ``N(0, 1/cols)`` entries, seeded.

    Example:
        >>> quadratic_matrix(0, 3, 2).shape
        torch.Size([3, 2])
    """
    g = torch.Generator().manual_seed(int(seed))
    return (torch.randn(rows, cols, generator=g, dtype=torch.float64) / math.sqrt(cols)).to(dtype)
