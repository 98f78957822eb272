"""Building blocks for client updates: minibatch draws and local SGD loops.

Draws are made by :func:`sample_batches` in ``Algorithm.draw`` (from the client's generator);
the loops below are pure tensor code that runs under ``torch.func.vmap`` too.

Example:
    >>> import torch
    >>> from fedrisk.rng import client_generator
    >>> idx = sample_batches(client_generator(0, round=0, client=2), num_samples=5, steps=3, batch_size=4)
    >>> idx.shape, bool((idx < 5).all())
    (torch.Size([3, 4]), True)
    >>> block = sample_batches(client_generator(0, round=0, client=[1, 2]), torch.tensor([9, 5]), 3, 4)
    >>> block.shape, torch.equal(block[1], idx)
    (torch.Size([2, 3, 4]), True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._C._functorch import maybe_get_level

from fedrisk.algorithms.base import LocalData
from fedrisk.autodiff import in_functorch_transform, under_vmap, value_and_grad
from fedrisk.errors import FedriskError, check_int, check_positive, unknown_name
from fedrisk.rng import ClientRNG
from fedrisk.tree import Tree, tree_map

Sampling = Literal["with_replacement", "shuffle"]
SAMPLING_CHOICES = ("with_replacement", "shuffle")


@dataclass(frozen=True)
class FastPaths:
    """Which of the vectorised executor's fast paths are on (all by default).

    They change speed, never semantics (``fused``: float rounding only); switching one off is
    for A/B benchmarks (``benchmarks/vectorized_ab.py``) and for tests that compare a fast path
    with the generic code.  Use :func:`fast_paths` to switch them.

    * ``gather``: minibatch rows as an embedding lookup under ``vmap`` (:func:`rows`);
    * ``in_place``: under ``vmap`` alone, :func:`sgd_steps` updates its own tensors in place
      from local step 1 on;
    * ``fused``: plain local SGD of a zoo MLP / logistic regression with cross-entropy runs as
      one explicit stacked program without ``vmap`` (:mod:`fedrisk.algorithms.fused`).
    """

    gather: bool = True
    in_place: bool = True
    fused: bool = True


_FAST_PATHS = [FastPaths()]


def active_fast_paths() -> FastPaths:
    """The fast paths in force (see :class:`FastPaths`)."""
    return _FAST_PATHS[-1]


@contextlib.contextmanager
def fast_paths(**switches: bool) -> Iterator[FastPaths]:
    """Switch fast paths on / off inside a ``with`` block (names: the fields of :class:`FastPaths`).

    Example:
        >>> with fast_paths(in_place=False) as active:
        ...     active.in_place, active_fast_paths().gather
        (False, True)
        >>> active_fast_paths().in_place
        True
        >>> with fast_paths(inplace=False):  # doctest: +ELLIPSIS
        ...     pass
        Traceback (most recent call last):
        ...
        fedrisk.errors.FedriskError: unknown fast path 'inplace'. Did you mean 'in_place'? ...
    """
    names = [f.name for f in fields(FastPaths)]
    for name, on in switches.items():
        if name not in names:
            raise unknown_name("fast path", name, names)
        if not isinstance(on, bool):
            raise FedriskError(f"fast path {name!r} must be True or False; got {on!r}")
    _FAST_PATHS.append(replace(active_fast_paths(), **switches))
    try:
        yield _FAST_PATHS[-1]
    finally:
        _FAST_PATHS.pop()


def check_sampling(sampling: str) -> None:
    """Raise a FedriskError unless ``sampling`` is one of :data:`SAMPLING_CHOICES`."""
    if sampling not in SAMPLING_CHOICES:
        raise unknown_name("sampling", sampling, SAMPLING_CHOICES)


def check_local_sgd(lr: float, local_steps: int, batch_size: int, sampling: str, clients_per_round: int | None) -> None:
    """Validate the hyper-parameters every local-SGD algorithm shares (raises FedriskError)."""
    check_positive("lr", lr)
    check_int("local_steps", local_steps, 1)
    check_int("batch_size", batch_size, 1)
    check_sampling(sampling)
    if clients_per_round is not None:
        check_int("clients_per_round", clients_per_round, 1)


def sample_batches(
    rng: ClientRNG,
    num_samples: int | Tensor,
    steps: int,
    batch_size: int,
    sampling: Sampling = "with_replacement",
) -> Tensor:
    """Row indices ``[steps, batch_size]`` below ``num_samples`` (int64).

    ``with_replacement``: i.i.d. uniform rows.  ``shuffle``: consecutive random permutations
    of the rows (epochs without replacement; every epoch visits every row once), cut into
    batches, from :meth:`~fedrisk.rng.ClientRNG.permutations`: a draw costs O(``steps *
    batch_size``) whatever the client's size (a window of one step of 32 rows from 33,333 draws
    32 distinct rows, never a permutation of all).  The epochs start afresh in every round
    (draws are a function of ``(seed, round, client)``).  For a block generator
    (``rng`` of a block, ``num_samples`` an int64 tensor ``[C]``) the result is
    ``[C, steps, batch_size]`` and row ``i`` equals client ``i``'s own draw.
    """
    total = steps * batch_size
    if isinstance(num_samples, Tensor):
        if bool((num_samples <= 0).any()):
            raise FedriskError("a client with no samples cannot draw minibatches")
    elif num_samples <= 0:
        raise FedriskError("a client with no samples cannot draw minibatches")
    if sampling == "with_replacement":
        return rng.integers(num_samples, (steps, batch_size))
    if sampling == "shuffle":
        return rng.permutations(num_samples, total).reshape(*rng.batch_shape, steps, batch_size)
    raise FedriskError(f"unknown sampling {sampling!r}; valid choices: {', '.join(SAMPLING_CHOICES)}")


def sample_batch(
    rng: ClientRNG, num_samples: int | Tensor, batch_size: int, sampling: Sampling = "with_replacement"
) -> Tensor:
    """One minibatch of row indices, ``[batch_size]`` (``[C, batch_size]`` for a block)."""
    return sample_batches(rng, num_samples, 1, batch_size, sampling)[..., 0, :]


def batch(data: LocalData, idx: Tensor) -> tuple[Tensor, Tensor]:
    """The rows ``idx`` of a client's data as ``(x, y)``.

    Under ``vmap`` (the vectorised executor) the rows are gathered by :func:`rows`.
    """
    if active_fast_paths().gather and under_vmap():
        return rows(data.x, idx), rows(data.y, idx)
    return data.x[idx], data.y[idx]


def rows(t: Tensor, idx: Tensor) -> Tensor:
    """``t[idx]`` (rows of ``t`` by an int64 index of any shape) as an embedding lookup.

    The same values; under ``vmap`` several times cheaper: the batching rule of ``x[idx]`` with
    a batched ``x`` and a batched ``idx`` is a two-index advanced indexing (2.4-2.7 ms CPU for
    1000 clients' minibatches of 16 rows of 64 features), that of ``F.embedding`` one row
    gather from the flattened stack (0.4 ms).

    Example:
        >>> t, y, idx = torch.arange(12.0).reshape(3, 2, 2), torch.tensor([5, 6, 7]), torch.tensor([[2, 0], [1, 1]])
        >>> torch.equal(rows(t, idx), t[idx]), torch.equal(rows(y, idx), y[idx])
        (True, True)
    """
    flat = t if t.dim() == 2 else t.reshape(t.shape[0], -1)
    return F.embedding(idx, flat).reshape(*idx.shape, *t.shape[1:])


def supervised_objective(
    apply: Callable[[Tree, Tensor], Tensor], loss: Callable[[Tensor, Tensor], Tensor]
) -> Callable[[Tree, Tensor, Tensor], Tensor]:
    """``params, x, y -> loss(apply(params, x), y)``."""
    return lambda params, x, y: loss(apply(params, x), y)


def sgd_update(param: Tensor, grad: Tensor, lr: float | Tensor) -> Tensor:
    """``param - lr * grad`` (one fused op for a Python-number ``lr``)."""
    if isinstance(lr, (int, float)):
        return torch.add(param, grad, alpha=-lr)
    return param - lr * grad


def sgd_step(params: Tree, grad: Tree, lr: float | Tensor) -> Tree:
    """One SGD step on a whole pytree: :func:`sgd_update` leaf by leaf, ``params - lr * grad``.

    Example:
        >>> sgd_step({"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([1.0, -1.0])}, 0.5)
        {'w': tensor([0.5000, 2.5000])}
    """
    if type(params) is dict and type(grad) is dict and params.keys() == grad.keys():
        # the same as the tree_map below for a flat dict (every model's parameters),
        # without torch.utils._pytree's per-call overhead (the sequential hot loop)
        return {k: sgd_update(p, grad[k], lr) for k, p in params.items()}
    return tree_map(lambda p, g: sgd_update(p, g, lr), params, grad)


def sgd_steps(
    objective: Callable[[Tree, Tensor, Tensor], Tensor],
    params: Tree,
    data: LocalData,
    idx: Tensor,
    lr: float,
    correction: Callable[[Tree, Tree], Tree] | None = None,
    *,
    in_place: bool | None = None,
) -> tuple[Tree, Tensor]:
    """Local SGD: for each row of ``idx``, ``params <- params - lr * (grad + correction)``.

    ``correction(params, grad)`` returns the full direction to use (FedProx adds its proximal
    term, SCAFFOLD its control variates).  Returns the final parameters and the mean loss.

    ``in_place``: update the loop's own tensors in place from step 1 on (the same numbers, bit
    for bit, without a new stack of per-client weights per step).  Only allowed where nothing
    differentiates through the loop; None (the default) does it exactly when running under
    ``vmap`` and no ``grad`` / ``jvp`` transform, with a Python-number ``lr``, and
    :class:`FastPaths` ``in_place`` on.
    """
    if (
        correction is None
        and isinstance(lr, (int, float))
        and type(params) is dict
        and all(isinstance(p, Tensor) for p in params.values())
        and torch.is_grad_enabled()
        and not in_functorch_transform()
    ):
        return _eager_sgd_steps(objective, params, data, idx, lr)
    vg = value_and_grad(objective)
    if in_place is None:
        in_place = active_fast_paths().in_place and under_vmap(only=True)
    in_place = in_place and isinstance(lr, (int, float))
    losses = []
    for t in range(idx.shape[0]):
        x, y = batch(data, idx[t])
        value, g = vg(params, x, y)
        if correction is not None:
            g = correction(params, g)
        if in_place and t > 0 and type(params) is dict and type(g) is dict:
            # params are this loop's own tensors from step 1 on: update them in place
            params = {k: _sgd_update_(p, g[k], lr) for k, p in params.items()}
        else:
            params = sgd_step(params, g, lr)
        losses.append(value)
    return params, torch.stack(losses).mean()


def _sgd_update_(param: Tensor, grad: Tensor, lr: float) -> Tensor:
    """:func:`sgd_update` in place on ``param`` (a tensor the local loop made itself): the same
    ``add`` with ``alpha = -lr``, hence the same numbers, without allocating a new stack of
    per-client weights at every step.  Out of place when ``param`` requires grad or when
    ``grad`` is batched at a vmap level where ``param`` is not (``param`` shared by the block)."""
    if param.requires_grad or maybe_get_level(grad) > maybe_get_level(param):
        return sgd_update(param, grad, lr)
    return param.add_(grad, alpha=-lr)


def _eager_sgd_steps(
    objective: Callable[[Tree, Tensor, Tensor], Tensor],
    params: dict[str, Tensor],
    data: LocalData,
    idx: Tensor,
    lr: float,
) -> tuple[Tree, Tensor]:
    """:func:`sgd_steps` outside ``torch.func`` for a flat dict of parameters, no correction and
    a Python-number ``lr``: the same operations (``value_and_grad``'s ``torch.autograd.grad``
    branch, then ``sgd_update``'s ``torch.add(p, g, alpha=-lr)``), hence the same numbers, with
    the per-step bookkeeping of the generic loop hoisted out.  This is the sequential executor's
    hot loop: for small models every microsecond per step shows (about 4% on a logistic
    regression with batches of 16).
    """
    names = list(params)
    values = list(params.values())
    losses = []
    for t in range(idx.shape[0]):
        x, y = batch(data, idx[t])
        leaves = [v.detach().requires_grad_(True) for v in values]
        loss = objective(dict(zip(names, leaves)), x, y)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        values = [torch.add(v, torch.zeros_like(v) if g is None else g, alpha=-lr) for v, g in zip(values, grads)]
        losses.append(loss.detach())
    return dict(zip(names, values)), torch.stack(losses).mean()


def full_batch_objective(
    apply: Callable[[Tree, Tensor], Tensor], loss: Callable[[Tensor, Tensor], Tensor]
) -> Callable[[Tree, LocalData], Tensor]:
    """``params, data -> mean over the client's real rows of loss(apply(params, x_m), y_m)``.

    Under ``torch.func`` (the vectorised executor): per-row losses (``vmap`` over rows) averaged
    with :meth:`LocalData.valid`, so padding rows do not count; eagerly: ``loss`` on the first
    ``size`` rows (the same mean, up to rounding).  Either way the full local objective f_k(params),
    e.g. for PERM's gradients at the global model.

    Example:
        >>> x, y = torch.tensor([[1.0], [3.0], [0.0]]), torch.tensor([0.0, 0.0, 0.0])
        >>> f = full_batch_objective(lambda p, x: x @ p, lambda o, t: ((o.reshape(-1) - t) ** 2).mean())
        >>> float(f(torch.ones(1), LocalData(x, y, torch.tensor(2))))  # (1 + 9) / 2, the padding row ignored
        5.0
    """

    def objective(params: Tree, data: LocalData) -> Tensor:
        if not in_functorch_transform():  # eager: no padding to mask, one batched call (the same mean)
            n = int(data.size)
            return loss(apply(params, data.x[:n]), data.y[:n])
        per_row = torch.func.vmap(lambda x, y: loss(apply(params, x[None]), y[None]))(data.x, data.y)
        mask = data.valid()
        return (per_row * mask).sum() / mask.sum()

    return objective
