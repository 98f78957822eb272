r"""The local primal-dual engine shared by the min-max families (CODA+/CODASCA, FESS-GDA, ...).

Objective-free pure functions over ``(v, α)`` pytrees: a window of local stochastic gradient
descent-ascent (:func:`local_sgda`), the control-variate updates of CODASCA's eqs. (6)-(7)
(:func:`control_variate_difference`, :func:`control_variate_mean`; SCAFFOLD's option II is the
former), the server's extrapolation step (:func:`server_extrapolate`, on ``(v, α)`` with the
dual projected; CODASCA, FSGDA and FESS-GDA) and the adapters from a game's gradients to the
engine's leaf-list :data:`Directions` (:func:`tree_directions`, :func:`flat_directions`).  The
algorithm modules (``codasca.py``, ...) supply the stochastic directions of their objective
through :data:`Directions` and keep the paper-specific schedule, variables and communication.

Everything here is static-shaped tensor code, so it runs under ``torch.func.vmap``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from fedrisk.tree import Tree, tree_map, tree_scale

__all__ = [
    "Directions",
    "LocalWindow",
    "control_variate_difference",
    "control_variate_mean",
    "extrapolate",
    "flat_directions",
    "local_sgda",
    "server_extrapolate",
    "tree_directions",
]

Directions = Callable[[int, list[Tensor], list[Tensor]], tuple[Tensor, list[Tensor], list[Tensor]]]
"""``directions(t, v_leaves, α_leaves) -> (loss, ∇_v F_k leaves, ∇_α F_k leaves)`` at local step ``t``,
both gradients at the same point; leaves in the order of ``torch.utils._pytree.tree_flatten`` of
``v`` and ``α`` (flat lists keep the per-step Python overhead low; :func:`tree_directions` adapts a
function written on trees)."""


class LocalWindow(NamedTuple):
    """The result of one client's window of local SGDA steps (:func:`local_sgda`)."""

    v: Tree
    alpha: Tree
    loss: Tensor
    direction_sum: tuple[Tree, Tree] | None
    """``Σ_t (d_v^t, d_α^t)``: the uncorrected directions (prox / weight decay included), eq. (7)."""
    iterate_sum: tuple[Tree, Tree] | None
    """``Σ_{t=1..I} (v_t, α_t)``: the iterates after every step, for Alg. 2's output average."""


def local_sgda(
    directions: Directions,
    v: Tree,
    alpha: Tree,
    steps: int,
    lr: float,
    *,
    prox_coef: float = 0.0,
    ref: Tree | None = None,
    weight_decay: float = 0.0,
    shift_v: Tree | None = None,
    shift_alpha: Tree | None = None,
    project_dual: Callable[[Tree], Tree] | None = None,
    sum_directions: bool = False,
    sum_iterates: bool = False,
    lr_dual: float | None = None,
) -> LocalWindow:
    r"""``steps`` local steps of simultaneous stochastic gradient descent-ascent.

    The inner loop of Alg. 2 (``shift = None``) and of Alg. 4 (``shift_v = c_v − c_v^k``,
    ``shift_alpha = c_α − c_α^k``)::

        (ℓ, g_v, g_α) = directions(t, v_t, α_t)            # both at the same (v_t, α_t) (P1; leaf lists)
        d_v = g_v + λ (v_t − ref) + wd · v_t               # ∇_v F_k^s, eq. (5)'s prox (+ decay)
        v_{t+1} = v_t − η (d_v + shift_v)                  # descent on v
        α_{t+1} = Π(α_t + η_α (g_α + shift_α))             # ascent on α (Π: optional projection)

    ``lr_dual`` is the dual step ``η_α`` (``None``: the same as ``lr``; FESS-GDA's and Local SGDA's
    separate ``η_{y,l}``).

    Unless the directions are summed (eq. (7)), the primal step is evaluated in the equivalent
    form ``v_{t+1} = (1 − η(λ + wd)) v_t − η g_v + η(λ ref − shift_v)`` whose last term is
    constant through the window: two tensor operations per parameter per step, as plain SGD
    with a prox term would need (same numbers up to rounding).

    Pure tensor code (static loop over ``steps``), so it runs under ``torch.func.vmap``.

    Example (one step on ``F = v α`` from ``(1, 2)``: ``v ← 1 − 0.5·2``, ``α ← 2 + 0.5·1``):
        >>> import torch
        >>> d = lambda t, v, a: (v[0] * a[0], [a[0]], [v[0]])
        >>> w = local_sgda(d, torch.tensor(1.0), torch.tensor(2.0), steps=1, lr=0.5)
        >>> float(w.v), float(w.alpha), float(w.loss)
        (0.0, 2.5, 2.0)
    """
    # The loop runs on flat leaf lists (no pytree work per step): the same arithmetic, markedly
    # less Python overhead than one tree_map per operation.
    xs, v_spec = pytree.tree_flatten(v)
    ys, a_spec = pytree.tree_flatten(alpha)
    refs = v_spec.flatten_up_to(ref) if prox_coef else None
    s_v = v_spec.flatten_up_to(shift_v) if shift_v is not None else None
    s_a = a_spec.flatten_up_to(shift_alpha) if shift_alpha is not None else None
    dir_v: list[Tensor] | None = None
    dir_a: list[Tensor] | None = None
    it_v: list[Tensor] | None = None
    it_a: list[Tensor] | None = None
    # the fused form: v ← decay · v − η g_v + k_v,  α ← α + η g_α + k_α   (k constant in the window)
    decay = 1.0 - lr * (prox_coef + weight_decay)
    k_v: list[Tensor] | None = None
    if prox_coef and s_v is not None:
        k_v = [lr * (prox_coef * r - s) for r, s in zip(refs, s_v)]  # type: ignore[arg-type]
    elif prox_coef:
        k_v = [(lr * prox_coef) * r for r in refs]  # type: ignore[union-attr]
    elif s_v is not None:
        k_v = [-lr * s for s in s_v]
    lr_a = lr if lr_dual is None else lr_dual
    k_a = [lr_a * s for s in s_a] if s_a is not None else None
    losses = []
    for t in range(steps):
        loss, d_v, d_a = directions(t, xs, ys)
        if sum_directions:  # the explicit form, keeping the directions of eq. (7)
            if prox_coef:  # ∇(λ/2)||v − v_0^s||² = λ (v − v_0^s)    (eq. (5); never on α, P5)
                d_v = [torch.add(g, x - r, alpha=prox_coef) for g, x, r in zip(d_v, xs, refs)]  # type: ignore[arg-type]
            if weight_decay:  # the code's "− lr·wd·v", folded into the direction
                d_v = [torch.add(g, x, alpha=weight_decay) for g, x in zip(d_v, xs)]
            dir_v = d_v if dir_v is None else [u + g for u, g in zip(dir_v, d_v)]
            dir_a = d_a if dir_a is None else [u + g for u, g in zip(dir_a, d_a)]
            if s_v is not None:  # Alg. 4: g − c^k + c
                d_v = [g + s for g, s in zip(d_v, s_v)]
            if s_a is not None:
                d_a = [g + s for g, s in zip(d_a, s_a)]
            xs = [torch.add(x, g, alpha=-lr) for x, g in zip(xs, d_v)]  # descent on v
            ys = [torch.add(y, g, alpha=lr_a) for y, g in zip(ys, d_a)]  # ascent on α
        else:
            if k_v is not None:
                xs = [torch.add(k, x, alpha=decay) for k, x in zip(k_v, xs)]
            elif decay != 1.0:
                xs = [decay * x for x in xs]
            xs = [torch.add(x, g, alpha=-lr) for x, g in zip(xs, d_v)]  # descent on v
            if k_a is not None:
                ys = [y + k for y, k in zip(ys, k_a)]
            ys = [torch.add(y, g, alpha=lr_a) for y, g in zip(ys, d_a)]  # ascent on α
        if project_dual is not None:
            ys = a_spec.flatten_up_to(project_dual(pytree.tree_unflatten(ys, a_spec)))
        if sum_iterates:
            it_v = xs if it_v is None else [u + x for u, x in zip(it_v, xs)]
            it_a = ys if it_a is None else [u + y for u, y in zip(it_a, ys)]
        losses.append(loss)

    def v_tree(leaves: list[Tensor] | None) -> Tree:
        return pytree.tree_unflatten(leaves, v_spec)

    def a_tree(leaves: list[Tensor] | None) -> Tree:
        return pytree.tree_unflatten(leaves, a_spec)

    return LocalWindow(
        v_tree(xs),
        a_tree(ys),
        torch.stack(losses).mean(),
        (v_tree(dir_v), a_tree(dir_a)) if sum_directions else None,
        (v_tree(it_v), a_tree(it_a)) if sum_iterates else None,
    )


def tree_directions(fn: Callable[[int, Tree, Tree], tuple[Tensor, Tree, Tree]], v: Tree, alpha: Tree) -> Directions:
    """Adapt ``fn(t, v, α) -> (loss, ∇_v F, ∇_α F)`` written on trees shaped like ``v`` and ``α``
    to the leaf-list :data:`Directions` of :func:`local_sgda`.

    Example:
        >>> import torch
        >>> game = lambda t, v, a: (a * v["x"], {"x": a}, v["x"])  # F = α x
        >>> d = tree_directions(game, {"x": torch.tensor(1.0)}, torch.tensor(2.0))
        >>> [float(u) for u in d(0, [torch.tensor(1.0)], [torch.tensor(2.0)])[1]]
        [2.0]
    """
    v_spec, a_spec = pytree.tree_structure(v), pytree.tree_structure(alpha)

    def flat(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        loss, g_v, g_a = fn(t, pytree.tree_unflatten(xs, v_spec), pytree.tree_unflatten(ys, a_spec))
        return loss, v_spec.flatten_up_to(g_v), a_spec.flatten_up_to(g_a)

    return flat


def flat_directions(fn: Callable[[int, Tree, Tensor], tuple[Tensor, Tree, Tensor]], x: Tree, y: Tensor) -> Directions:
    """:func:`tree_directions` with a fast path for a flat dict ``x`` (every model's parameters)
    and a tensor ``y``: no pytree work per local step (the Local SGDA family's directions).

    Example:
        >>> import torch
        >>> game = lambda t, x, y: (y[0] * x["w"], {"w": y[0]}, x["w"])  # f = y w
        >>> d = flat_directions(game, {"w": torch.ones(1)}, torch.ones(1))
        >>> d(0, [torch.tensor([2.0])], [torch.tensor([3.0])])[1:]
        ([tensor(3.)], [tensor([2.])])
    """
    if type(x) is not dict or not isinstance(y, Tensor) or not all(isinstance(v, Tensor) for v in x.values()):
        return tree_directions(fn, x, y)
    names = list(x)

    def flat(t: int, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        loss, gx, gy = fn(t, dict(zip(names, xs)), ys[0])
        return loss, [gx[k] for k in names], [gy]

    return flat


def control_variate_difference(
    c_local: Tree, c_global: Tree, start: Tree, end: Tree, steps: int, lr: float, *, ascent: bool = False
) -> Tree:
    r"""Eq. (6), the difference form of the local control variate update::

        c_v^k ← c_v^k − c_v + (v_{r−1} − v_{r,I}^k) / (I η_l)        (descent, primal)
        c_α^k ← c_α^k − c_α + (α_{r,I}^k − α_{r−1}) / (I η_l)        (``ascent=True``, dual)

    ``c_global`` is the *old* global control variate (the one used during the window, P7).
    With a constant ``η_l`` in the window it equals :func:`control_variate_mean` (eq. (7)).

    Example:
        >>> import torch
        >>> float(control_variate_difference(torch.tensor(0.0), torch.tensor(0.0),
        ...                                  torch.tensor(1.0), torch.tensor(0.4), steps=2, lr=0.1))
        3.0
    """
    scale = 1.0 / (steps * lr)
    if ascent:
        return tree_map(lambda ck, c, s, e: ck - c + scale * (e - s), c_local, c_global, start, end)
    return tree_map(lambda ck, c, s, e: ck - c + scale * (s - e), c_local, c_global, start, end)


def control_variate_mean(direction_sum: Tree, steps: int) -> Tree:
    r"""Eq. (7): the mean of the (uncorrected) stochastic directions used in the window,
    ``c^k = (1/I) Σ_t ∇f_k^s(v_{r,t}^k, α_{r,t}^k; z_{r,t}^k)``.

    Example:
        >>> import torch
        >>> control_variate_mean(torch.tensor([2.0, 4.0]), steps=2).tolist()
        [1.0, 2.0]
    """
    return tree_scale(1.0 / steps, direction_sum)


def extrapolate(previous: Tree, mean: Tree, global_lr: float) -> Tree:
    r"""Alg. 4's server step ``v_r = v_{r−1} + η_g (v̂_r − v_{r−1})`` (``η_g > 1`` extrapolates).

    ``η_g = 1`` returns ``mean`` itself: the plain average, exactly (spec §7.1-7).

    Example:
        >>> import torch
        >>> extrapolate(torch.tensor(1.0), torch.tensor(2.0), 1.5).item()
        2.5
    """
    if global_lr == 1.0:
        return mean
    return tree_map(lambda p, m: p + global_lr * (m - p), previous, mean)


def server_extrapolate(
    primal: Tree,
    primal_mean: Tree,
    dual: Tree,
    dual_mean: Tree,
    global_lr: float,
    global_lr_dual: float | None = None,
    project_dual: Callable[[Tree], Tree] | None = None,
) -> tuple[Tree, Tree]:
    r"""The server step of the primal-dual families on ``(v, α)`` (CODASCA's Alg. 4, FSGDA's and
    FESS-GDA's ``(x, y)``)::

        v_r = v_{r−1} + η_g (v̂_r − v_{r−1}),     α_r = Π(α_{r−1} + η_{g,α} (α̂_r − α_{r−1}))

    with ``η_{g,α} = global_lr_dual`` (None: ``η_g``) and ``Π = project_dual`` (None: none).  The
    dual is projected because ``η_g > 1`` can leave the feasible set even when every client's
    iterate is feasible (``α_{r−1} = 0.5``, ``α̂_r = 0``, ``η_g = 1.5`` give ``−0.25``); a mean of
    feasible values (``η_g ≤ 1``) never does, and projecting it changes nothing.

    Example:
        >>> import torch
        >>> v, a = server_extrapolate(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(0.5),
        ...                           torch.tensor(0.0), 1.5, project_dual=lambda a: a.clamp(min=0))
        >>> float(v), float(a)
        (2.5, 0.0)
    """
    dual_lr = global_lr if global_lr_dual is None else global_lr_dual
    dual = extrapolate(dual, dual_mean, dual_lr)
    return extrapolate(primal, primal_mean, global_lr), (dual if project_dual is None else project_dual(dual))
