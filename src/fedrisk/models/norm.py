"""BatchNorm under the functional interface: running statistics as explicit state.

A BatchNorm layer keeps ``running_mean`` / ``running_var`` buffers that its forward pass
updates in place in training mode.  Federated state is explicit (pytrees handed from call to
call, stacked under ``vmap``), so :class:`~fedrisk.models.functional.FunctionalModel` routes
every ``BatchNorm1d/2d/3d`` of its module through :func:`batch_norm` with the statistics held
in a :class:`NormScope`:

* **train** (inside ``client_update``): the layer normalises with the batch's own mean and
  (biased) variance, as ``nn.BatchNorm`` in ``train()`` mode, and the scope's statistics move
  to ``(1 - momentum) * running + momentum * batch`` (the unbiased batch variance for
  ``running_var``), once per forward call, as PyTorch's ``BatchNorm`` does;
* **eval** (evaluation, server-side code, a direct ``FunctionalModel.apply``): the layer
  normalises with the scope's running statistics, as ``nn.BatchNorm`` in ``eval()`` mode;
* **frozen** (training under ``norm_stats = "frozen"``): eval-mode normalisation, no update.

A training-mode forward pass inside a ``vmap`` opened *within* the training scope (a per-row
``vmap``: per-sample gradients, :func:`~fedrisk.algorithms.local.full_batch_objective`'s rows
under the vectorised executor) has one row per call and so no batch statistics: it is refused
with the layer's name (the ``vmap`` over clients that the vectorised executor opens *around*
the scope is not per-row and is fine; eval and frozen statistics are row-wise and always fine).

The batch statistics are detached: running statistics carry no gradient.  A forward pass run
inside ``torch.func.grad`` (the vectorised executor) leaves its new statistics wrapped at the
gradient transform's level; :meth:`NormScope.read` unwraps them once that transform has
returned, so the statistics flow from local step to local step whatever loop an algorithm
writes (plain autograd, ``torch.func``, under ``vmap`` or not).

Example:
    >>> import torch
    >>> bn = torch.nn.BatchNorm1d(3)
    >>> scope = NormScope({"running_mean": torch.zeros(3), "running_var": torch.ones(3)}, train=True)
    >>> x = torch.arange(12.0).reshape(4, 3)
    >>> y = batch_norm(scope, "", bn, x)
    >>> ref = torch.nn.BatchNorm1d(3)
    >>> torch.allclose(y, ref(x), atol=1e-6), torch.allclose(scope.result()["running_mean"], ref.running_mean)
    (True, True)
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._C._functorch import TransformType, get_unwrapped, is_gradtrackingtensor, maybe_get_level
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
from torch.nn.modules.batchnorm import _BatchNorm

from fedrisk.errors import FedriskError

__all__ = ["NORM_POLICIES", "STAT_BUFFERS", "NormScope", "active", "batch_norm", "route_batch_norm", "unwrap_dead"]

NORM_POLICIES = ("averaged", "local", "frozen")
"""What happens to the running statistics between rounds (``FunctionalModel(norm_stats=)``):
averaged with the parameters (size-weighted, as FedAvg implementations average a state_dict),
kept by each client (FedBN, Li et al. 2021), or frozen at their initial values."""

STAT_BUFFERS = ("running_mean", "running_var")
"""The buffers of a BatchNorm layer that are federated state (``num_batches_tracked`` is only
read when ``momentum`` is None, which :class:`FunctionalModel` refuses)."""


def vmap_depth() -> int:
    """How many ``torch.func.vmap`` transforms are running now.

    Example:
        >>> vmap_depth(), int(torch.func.vmap(lambda x: x + vmap_depth())(torch.zeros(1)))
        (0, 1)
    """
    return sum(1 for i in retrieve_all_functorch_interpreters() if i.key() == TransformType.Vmap)


def unwrap_dead(t: Tensor) -> Tensor:
    """``t`` without the wrappers of ``torch.func.grad`` transforms that have returned.

    Example:
        >>> kept = []
        >>> _ = torch.func.grad(lambda x: kept.append(x.detach() * 2) or (x**2).sum())(torch.ones(2))
        >>> unwrap_dead(kept[0])
        tensor([2., 2.])
    """
    while is_gradtrackingtensor(t) and maybe_get_level(t) == -2:  # -2: the transform has exited
        t = get_unwrapped(t)
    return t


class NormScope:
    """The running statistics of one model evaluation context (see the module docstring).

    ``stats`` maps ``"<layer>.running_mean"`` / ``"<layer>.running_var"`` to tensors; ``train``
    selects batch statistics; ``update=False`` (frozen) normalises with the running statistics
    even in training and never changes them.
    """

    def __init__(self, stats: Mapping[str, Tensor], *, train: bool, update: bool = True) -> None:
        self.stats = dict(stats)
        self.train = train
        self.update = update
        self.vmap_depth = vmap_depth()  # a deeper vmap in a training forward is per-row

    def read(self, name: str) -> Tensor:
        return unwrap_dead(self.stats[name])

    def result(self) -> dict[str, Tensor]:
        """The current statistics, unwrapped (call it after the last forward pass)."""
        return {k: unwrap_dead(v) for k, v in self.stats.items()}


def batch_norm(scope: NormScope, prefix: str, bn: _BatchNorm, x: Tensor) -> Tensor:
    """``bn(x)`` with the running statistics of ``scope`` (``prefix``: the layer's name)."""
    if x.dim() < 2:
        raise ValueError(f"BatchNorm layer {prefix!r} expects inputs [N, C, ...]; got shape {list(x.shape)}")
    sep = "." if prefix else ""
    mean_key, var_key = f"{prefix}{sep}running_mean", f"{prefix}{sep}running_var"
    weight, bias = bn.weight, bn.bias
    if scope.train and scope.update:
        if vmap_depth() > scope.vmap_depth:
            raise FedriskError(
                f"BatchNorm layer {prefix!r} is in training mode under a per-row vmap (per-sample gradients, "
                "full-batch objectives under the vectorised executor): one row has no batch statistics; use "
                'GroupNorm or LayerNorm, model.norm_stats = "frozen", or the sequential executor'
            )
        out = F.batch_norm(x, None, None, weight, bias, True, 0.0, bn.eps)
        dims = [0, *range(2, x.dim())]
        xd = x.detach()
        momentum = float(bn.momentum)  # type: ignore[arg-type]  (None is refused by FunctionalModel)
        mean = xd.mean(dims)
        var = xd.var(dims, correction=1)
        scope.stats[mean_key] = scope.read(mean_key) * (1 - momentum) + mean * momentum
        scope.stats[var_key] = scope.read(var_key) * (1 - momentum) + var * momentum
        return out
    shape = [1, x.shape[1], *([1] * (x.dim() - 2))]
    mean, var = scope.read(mean_key), scope.read(var_key)
    out = (x - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + bn.eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


_ACTIVE: list[tuple[NormScope, dict[int, str]]] = []
"""The scope of the ``FunctionalModel.apply`` running now, with its layers' names by ``id``."""


@contextlib.contextmanager
def active(scope: NormScope, names: Mapping[int, str]) -> Iterator[None]:
    """Route the BatchNorm layers named in ``names`` (by ``id(layer)``) through ``scope``."""
    _ACTIVE.append((scope, dict(names)))
    try:
        yield
    finally:
        _ACTIVE.pop()


def route_batch_norm(layer: _BatchNorm) -> None:
    """Make ``layer`` (on this instance only) run :func:`batch_norm` while a :func:`active` scope
    names it, and its own ``forward`` otherwise; idempotent.  A bound method, so that a
    ``copy.deepcopy`` of the module routes the copy's own layer."""
    if getattr(layer, "_fedrisk_routed", False):
        return
    layer.forward = types.MethodType(_routed_forward, layer)  # type: ignore[method-assign]
    layer._fedrisk_routed = True  # type: ignore[attr-defined]


def _routed_forward(layer: _BatchNorm, x: Tensor) -> Tensor:
    if _ACTIVE:
        scope, names = _ACTIVE[-1]
        prefix = names.get(id(layer))
        if prefix is not None:
            return batch_norm(scope, prefix, layer, x)
    return type(layer).forward(layer, x)
