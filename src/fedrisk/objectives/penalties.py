"""Consensus penalties of the Byzantine-resilient family and their proximal operators.

FRPG / LFRPG (Dong et al., paper 002) couple the server model ``w_0`` with each worker model
``w_n`` through ``lambda * p(w_0 - w_n)`` with the Huber function of the **l2 norm of the whole
difference vector**, eq. (30)::

    p(z) = ||z||^2 / (2 mu)      if ||z|| <= mu
         = ||z|| - mu / 2        otherwise

Its gradient ``z / max(mu, ||z||)`` has norm at most 1 (the paper's ``G = 1``), which is what
bounds a faulty worker's influence by its *count*, not its magnitude.  The proximal operator of
``tau * p`` has the closed form (spec 002 section 1.4)::

    prox_{tau p}(y) = y * mu / (mu + tau)      if ||y|| <= mu + tau
                    = y * (1 - tau / ||y||)    otherwise

RSA (Li et al., 2019) uses the l1 penalty ``||z||_1`` with the coordinate-wise ``sign``
subgradient instead (:func:`l1_penalty`, :func:`l1_subgrad`).

Every function takes a tensor ``z`` of any shape and treats it as one vector (the norm runs over
all entries).  They contain no Python branch on tensor values, so they run under
``torch.func.vmap`` (one row per client).

Example:
    >>> import torch
    >>> z = torch.tensor([3.0, 4.0])
    >>> float(huber_l2(z, mu=1.0)), huber_l2_grad(z, mu=1.0).tolist()
    (4.5, [0.6000000238418579, 0.800000011920929])
    >>> huber_l2_prox(torch.tensor([3.0, 4.0]), tau=1.0, mu=1.0).tolist()
    [2.4000000953674316, 3.200000047683716]
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrisk.errors import check_positive
from fedrisk.objectives.minimax import project_ball

__all__ = [
    "check_positive",
    "huber_l2",
    "huber_l2_grad",
    "huber_l2_prox",
    "l1_penalty",
    "l1_subgrad",
    "project_l2_ball",
]


def _norm(z: Tensor) -> Tensor:
    return torch.linalg.vector_norm(z)


def huber_l2(z: Tensor, mu: float) -> Tensor:
    """The Huber penalty of eq. (30) on the l2 norm of ``z`` (a 0-dim tensor).

    Example:
        >>> float(huber_l2(torch.tensor([0.0, 1e-4], dtype=torch.float64), mu=1e-3))  # ||z||^2 / (2 mu)
        5e-06
    """
    check_positive("mu", mu)
    r = _norm(z)
    return torch.where(r <= mu, r * r / (2 * mu), r - mu / 2)


def huber_l2_grad(z: Tensor, mu: float) -> Tensor:
    """``grad p(z) = z / max(mu, ||z||)``: ``z / mu`` inside the ball, ``z / ||z||`` outside.

    Its norm never exceeds 1 (``G = 1`` in assumption A3).

    Example:
        >>> float(torch.linalg.vector_norm(huber_l2_grad(torch.tensor([1e6, -1e6]), mu=1e-3)))
        1.0
    """
    check_positive("mu", mu)
    return z / torch.clamp(_norm(z), min=mu)


def huber_l2_prox(y: Tensor, tau: float | Tensor, mu: float) -> Tensor:
    """``prox_{tau p}(y) = argmin_z tau p(z) + ||z - y||^2 / 2`` in closed form (spec 002, sec. 1.4).

    The result ``z`` satisfies the optimality condition ``tau grad p(z) + z - y = 0``; both
    branches agree at ``||y|| = mu + tau``.  ``tau`` may be a 0-dim tensor (FRPG's
    ``lambda / alpha_{n,k}``).

    Example:
        >>> y = torch.tensor([0.3, 0.4])          # ||y|| = 0.5 > mu + tau = 0.3
        >>> z = huber_l2_prox(y, tau=0.2, mu=0.1)
        >>> z.tolist(), bool(torch.allclose(0.2 * huber_l2_grad(z, 0.1) + z - y, torch.zeros(2), atol=1e-7))
        ([0.18000000715255737, 0.24000000953674316], True)
    """
    check_positive("mu", mu)
    if not isinstance(tau, Tensor):
        check_positive("tau", tau)
    r = _norm(y)
    inside = y * (mu / (mu + tau))
    outside = y * (1 - tau / torch.clamp(r, min=mu + tau))  # clamp: no division by ||y|| = 0 on the unused branch
    return torch.where(r <= mu + tau, inside, outside)


def project_l2_ball(g: Tensor, radius: float) -> Tensor:
    """``g * min(1, radius / ||g||)``: the projection onto the l2 ball of ``radius``.

    The FRPG server applies it to every received penalty gradient (spec A5 / pitfall P1): an
    honest ``g_n = lambda grad p`` is unchanged, a faulty one is cut to norm ``lambda sqrt(G)``.

    Example:
        >>> project_l2_ball(torch.tensor([3.0, 4.0]), 1.0).tolist()
        [0.6000000238418579, 0.800000011920929]
        >>> project_l2_ball(torch.tensor([0.3, 0.4]), 1.0).tolist()
        [0.30000001192092896, 0.4000000059604645]
    """
    check_positive("radius", radius)
    return project_ball(g.reshape(-1), radius).reshape(g.shape)  # the norm of the whole vector


def l1_penalty(z: Tensor) -> Tensor:
    """RSA's penalty ``||z||_1``.

    Example:
        >>> float(l1_penalty(torch.tensor([1.0, -2.0, 0.5])))
        3.5
    """
    return z.abs().sum()


def l1_subgrad(z: Tensor) -> Tensor:
    """RSA's subgradient of ``||z||_1``: ``sign(z)`` (0 at 0, a valid subgradient).

    Example:
        >>> l1_subgrad(torch.tensor([1.0, -2.0, 0.0])).tolist()
        [1.0, -1.0, 0.0]
    """
    return torch.sign(z)
