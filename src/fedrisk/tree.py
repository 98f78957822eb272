"""Small pytree helpers over nested dicts / tuples / lists of tensors.

All federated state in fedrisk (parameters, control variates, server and client state) is a
pytree whose leaves are tensors (or Python scalars).  These helpers are pure functions.

Example:
    >>> import torch
    >>> a = {"w": torch.ones(2), "b": torch.zeros(1)}
    >>> tree_axpy(2.0, a, a)["w"].tolist()
    [3.0, 3.0]
    >>> tree_nbytes(a)
    12
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

Tree = Any


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """Apply ``fn`` leaf-wise over one or more trees of the same structure."""
    return pytree.tree_map(fn, tree, *rest)


def tree_leaves(tree: Tree) -> list[Any]:
    return pytree.tree_leaves(tree)


def tensor_leaves(tree: Tree) -> list[Tensor]:
    """The tensor leaves of ``tree`` in pytree order.  Nested plain dicts (model parameters,
    replies, states) skip ``torch.utils._pytree``: the executors call this for every client of
    every round (byte ledger, NaN checks), where its per-call overhead showed."""
    if isinstance(tree, Tensor):
        return [tree]
    if type(tree) is dict:
        return [x for v in tree.values() for x in tensor_leaves(v)]
    return [x for x in pytree.tree_leaves(tree) if isinstance(x, Tensor)]


def tree_add(a: Tree, b: Tree) -> Tree:
    return tree_map(lambda x, y: x + y, a, b)


def tree_sub(a: Tree, b: Tree) -> Tree:
    return tree_map(lambda x, y: x - y, a, b)


def tree_scale(alpha: float | Tensor, a: Tree) -> Tree:
    return tree_map(lambda x: alpha * x, a)


def tree_axpy(alpha: float | Tensor, x: Tree, y: Tree) -> Tree:
    """``alpha * x + y`` leaf-wise."""
    return tree_map(lambda u, v: alpha * u + v, x, y)


def tree_lerp(a: Tree, b: Tree, weight: float | Tensor) -> Tree:
    """``a + weight * (b - a)`` leaf-wise."""
    return tree_map(lambda u, v: u + weight * (v - u), a, b)


def tree_zeros_like(a: Tree) -> Tree:
    return tree_map(torch.zeros_like, a)


def tree_clone(a: Tree) -> Tree:
    return tree_map(lambda x: x.clone() if isinstance(x, Tensor) else x, a)


def tree_detach(a: Tree) -> Tree:
    return tree_map(lambda x: x.detach() if isinstance(x, Tensor) else x, a)


def tree_vdot(a: Tree, b: Tree) -> Tensor:
    """Sum over leaves of the inner products."""
    return sum((torch.sum(x * y) for x, y in zip(tensor_leaves(a), tensor_leaves(b))), torch.tensor(0.0))


def tree_norm(a: Tree) -> Tensor:
    """The Euclidean norm of all leaves taken together."""
    leaves = tensor_leaves(a)
    return torch.sqrt(sum(torch.sum(x * x) for x in leaves))


def tree_flatten_vector(a: Tree) -> Tensor:
    """All tensor leaves concatenated into one 1-D tensor (leaf order of ``tree_leaves``)."""
    return torch.cat([x.reshape(-1) for x in tensor_leaves(a)])


def tree_unflatten_vector(vec: Tensor, like: Tree) -> Tree:
    """Inverse of :func:`tree_flatten_vector` for a tree shaped like ``like``.  Leading
    dimensions of ``vec`` (e.g. rows ``[T, d]``) become leading dimensions of every leaf."""
    leaves, spec = pytree.tree_flatten(like)
    batch = vec.shape[:-1]
    out, offset = [], 0
    for leaf in leaves:
        n = leaf.numel()
        out.append(vec[..., offset : offset + n].reshape(*batch, *leaf.shape))
        offset += n
    if offset != vec.shape[-1]:
        raise ValueError(f"vector has {vec.shape[-1]} entries, the tree needs {offset}")
    return pytree.tree_unflatten(out, spec)


def tree_nbytes(a: Tree) -> int:
    """Bytes needed to send the tensor leaves of ``a`` (numel x element size)."""
    return sum(x.numel() * x.element_size() for x in tensor_leaves(a))


def tree_stack(trees: Sequence[Tree]) -> Tree:
    """Stack trees of equal structure along a new leading dimension."""
    return tree_map(lambda *xs: torch.stack(xs), *trees)


def tree_unstack(tree: Tree, n: int) -> list[Tree]:
    """Split a stacked tree into ``n`` trees (inverse of :func:`tree_stack`)."""
    return [tree_map(lambda x, i=i: x[i], tree) for i in range(n)]


def tree_all_finite(a: Tree) -> bool:
    """True when every tensor leaf is finite (one reduction per leaf, one sync)."""
    leaves = [x for x in tensor_leaves(a) if x.is_floating_point() and x.numel()]
    if not leaves:
        return True
    total = torch.stack([x.sum() for x in leaves]).sum()
    return bool(torch.isfinite(total)) or all(bool(torch.isfinite(x).all()) for x in leaves)


def tree_to(a: Tree, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Tree:
    def move(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        return x.to(device) if device is not None else x

    return tree_map(move, a)
