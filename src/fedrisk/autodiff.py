"""Gradients of functions of parameter pytrees that work in every executor.

:func:`value_and_grad` uses ``torch.func.grad_and_value`` when called inside a torch.func
transform (the vectorised executor runs ``client_update`` under ``vmap``) and plain
``torch.autograd.grad`` otherwise, which is markedly faster for small models in a Python
loop.  Both give the same numbers.

Example:
    >>> import torch
    >>> f = lambda p, x: ((p["w"] * x) ** 2).sum()
    >>> val, g = value_and_grad(f)({"w": torch.tensor([1.0, 2.0])}, torch.tensor([1.0, 1.0]))
    >>> float(val), g["w"].tolist()
    (5.0, [2.0, 4.0])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch._C._functorch import TransformType, get_interpreter_stack, peek_interpreter_stack
from torch.utils import _pytree as pytree

from fedrisk.tree import Tree


def in_functorch_transform() -> bool:
    """True while running under ``torch.func`` (vmap / grad)."""
    return peek_interpreter_stack() is not None


def under_vmap(only: bool = False) -> bool:
    """True while running under ``torch.func.vmap``; with ``only=True``, under ``vmap`` and no
    other transform (no ``grad`` / ``jvp``: nothing differentiates through the code).

    Example:
        >>> under_vmap(), bool(torch.func.vmap(lambda x: torch.tensor(under_vmap()))(torch.ones(2)).all())
        (False, True)
        >>> bool(torch.func.vmap(torch.func.grad(lambda x: x * under_vmap(only=True)))(torch.ones(2)).any())
        False
    """
    keys = [i.key() for i in get_interpreter_stack() or ()]
    return bool(keys) and (all if only else any)(k == TransformType.Vmap for k in keys)


def _flatten(tree: Tree) -> tuple[list[Any], Callable[[list[Any]], Tree]]:
    """The leaves of ``tree`` and a function that rebuilds a tree of its structure from leaves.

    A flat ``dict`` of tensors (every model's parameters) takes a fast path that skips
    ``torch.utils._pytree`` (several microseconds per call, paid at every local step by the
    sequential executor); it gives the same leaves in the same (insertion) order.
    """
    if type(tree) is dict and all(isinstance(v, Tensor) for v in tree.values()):
        keys = list(tree)
        return list(tree.values()), lambda leaves: dict(zip(keys, leaves))
    leaves, spec = pytree.tree_flatten(tree)
    return leaves, lambda new: pytree.tree_unflatten(new, spec)


def value_and_grad(
    fn: Callable[..., Tensor], argnums: int = 0, has_aux: bool = False
) -> Callable[..., tuple[Any, Tree]]:
    """``(value, grad)`` of a scalar ``fn`` w.r.t. the pytree argument ``argnums``.

    With ``has_aux=True`` ``fn`` returns ``(value, aux)`` and the result is
    ``((value, aux), grad)``.
    """

    def wrapped(*args: Any) -> tuple[Any, Tree]:
        if in_functorch_transform() or torch.is_grad_enabled() is False:
            gv = torch.func.grad_and_value(fn, argnums=argnums, has_aux=has_aux)
            grads, value = gv(*args)
            return value, grads
        leaves, rebuild = _flatten(args[argnums])
        leaves = [x.detach().requires_grad_(True) for x in leaves]
        new_args = list(args)
        new_args[argnums] = rebuild(leaves)
        out = fn(*new_args)
        loss = out[0] if has_aux else out
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]
        if has_aux:
            value = (out[0].detach(), pytree.tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, out[1]))
        else:
            value = out.detach()
        return value, rebuild(grads)

    return wrapped


def grad(fn: Callable[..., Tensor], argnums: int = 0) -> Callable[..., Tree]:
    """The gradient of a scalar ``fn`` w.r.t. the pytree argument ``argnums``."""
    vg = value_and_grad(fn, argnums)
    return lambda *args: vg(*args)[1]
