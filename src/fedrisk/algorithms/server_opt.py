"""Server-side steps in the optax style: small ``init`` / ``update`` pairs that compose.

The server turns the aggregated pseudo-gradient ``delta = mean(client models) - global model``
into the step it applies: ``global <- global + update``.  ``server_lr(1.0)`` is plain
averaging; ``server_lr(eta_g)`` with ``eta_g > 1`` extrapolates (CODASCA, FSGDA);
``server_momentum(beta)`` is FedAvgM.

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
