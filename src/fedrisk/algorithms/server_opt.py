"""Server-side steps in the optax style: small ``init`` / ``update`` pairs that compose.

The server turns the aggregated pseudo-gradient ``delta = mean(client models) - global model``
into the step it applies: ``global <- global + update``.  ``server_lr(1.0)`` is plain
averaging; ``server_lr(eta_g)`` with ``eta_g > 1`` extrapolates (CODASCA, FSGDA);
``server_momentum(beta)`` is FedAvgM; ``server_adam(lr)`` is Adam on the pseudo-gradient
``-delta`` (FedAdam, Reddi et al., ICLR 2021, Alg. 2, with Adam's bias correction).  On a
one-client federation with one local step of lr 1 (``centralized``), ``delta`` is minus the
minibatch gradient, so ``server_adam`` is exactly ``torch.optim.Adam``: the paper's central
pre-training (CODASCA, Yuan et al., ICML 2021, §6: Adam, batch 32, 2 epochs).

Example:
    >>> import torch
    >>> opt = chain(server_momentum(0.9), server_lr(2.0))
    >>> state = opt.init({"w": torch.zeros(1)})
    >>> step, state = opt.update({"w": torch.ones(1)}, state, {"w": torch.zeros(1)})
    >>> step["w"].tolist()
    [2.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fedrisk.errors import check_range
from fedrisk.tree import Tree, tree_axpy, tree_map, tree_scale, tree_zeros_like


class ServerOpt(NamedTuple):
    init: Callable[[Tree], Tree]
    update: Callable[[Tree, Tree, Tree], tuple[Tree, Tree]]


def identity() -> ServerOpt:
    """Apply the aggregated delta as it is (plain averaging)."""
    return ServerOpt(lambda params: {}, lambda delta, state, params: (delta, state))


def server_lr(eta: float) -> ServerOpt:
    """Scale the delta by the global learning rate ``eta`` (> 1 extrapolates)."""
    check_range("server learning rate", eta, 0.0, None, low_inclusive=False)
    return ServerOpt(lambda params: {}, lambda delta, state, params: (tree_scale(eta, delta), state))


def server_momentum(beta: float, nesterov: bool = False) -> ServerOpt:
    """Heavy-ball momentum on the delta: ``m <- beta m + delta``; step ``m`` (or Nesterov's)."""
    check_range("server momentum", beta, 0.0, 1.0, high_inclusive=False)

    def init(params: Tree) -> Tree:
        return {"momentum": tree_zeros_like(params)}

    def update(delta: Tree, state: Tree, params: Tree) -> tuple[Tree, Tree]:
        m = tree_axpy(beta, state["momentum"], delta)
        step = tree_axpy(beta, m, delta) if nesterov else m
        return step, {"momentum": m}

    return ServerOpt(init, update)


def server_adam(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> ServerOpt:
    """Adam (Kingma & Ba, 2015, Alg. 1) on the pseudo-gradient ``g = -delta``.

    With ``t`` the step count (state ``count``):

        m <- b1 m + (1 - b1) delta,    v <- b2 v + (1 - b2) delta^2
        step = lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    (``m`` is kept for ``delta`` rather than ``g``, so the step is added, not subtracted; the
    arithmetic is ``torch.optim.Adam``'s, so one client with one local step of lr 1 reproduces it
    to rounding).

    Example:
        >>> opt = server_adam(0.1)
        >>> state = opt.init({"w": torch.zeros(2)})
        >>> step, state = opt.update({"w": torch.tensor([4.0, -0.5])}, state, {"w": torch.zeros(2)})
        >>> [round(x, 6) for x in step["w"].tolist()], int(state["count"])   # first step: lr * sign(delta)
        ([0.1, -0.1], 1)
    """
    check_range("Adam learning rate", lr, 0.0, None, low_inclusive=False)
    check_range("Adam beta1", b1, 0.0, 1.0, high_inclusive=False)
    check_range("Adam beta2", b2, 0.0, 1.0, high_inclusive=False)
    check_range("Adam eps", eps, 0.0, None, low_inclusive=False)

    def init(params: Tree) -> Tree:
        return {"m": tree_zeros_like(params), "v": tree_zeros_like(params), "count": torch.zeros((), dtype=torch.int64)}

    def update(delta: Tree, state: Tree, params: Tree) -> tuple[Tree, Tree]:
        count = state["count"] + 1
        m = tree_map(lambda mi, d: mi * b1 + d * (1 - b1), state["m"], delta)
        v = tree_map(lambda vi, d: vi * b2 + d * d * (1 - b2), state["v"], delta)
        t = float(count)
        step_size = lr / (1 - b1**t)
        root_bc2 = (1 - b2**t) ** 0.5
        step = tree_map(lambda mi, vi: step_size * mi / (vi.sqrt() / root_bc2 + eps), m, v)
        return step, {"m": m, "v": v, "count": count}

    return ServerOpt(init, update)


def chain(*opts: ServerOpt) -> ServerOpt:
    """Apply ``opts`` one after another (each state kept under its position)."""

    def init(params: Tree) -> Tree:
        return {str(i): o.init(params) for i, o in enumerate(opts)}

    def update(delta: Tree, state: Tree, params: Tree) -> tuple[Tree, Tree]:
        new_state = {}
        for i, o in enumerate(opts):
            delta, new_state[str(i)] = o.update(delta, state[str(i)], params)
        return delta, new_state

    return ServerOpt(init, update)


def apply_step(params: Tree, step: Tree) -> Tree:
    return tree_map(lambda p, s: p + s, params, step)
