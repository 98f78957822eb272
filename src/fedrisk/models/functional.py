"""Use an ``nn.Module`` as a pure function of a parameter dict.

Federated algorithms keep one parameter set per client (or a stack of them) as plain
``dict[str, Tensor]`` keyed by ``module.named_parameters()`` names, and evaluate the network
with ``torch.func.functional_call``; the module object itself only supplies the architecture.
:class:`FunctionalModel` bundles this with deterministic initialisation, and
:func:`flatten` / :func:`unflatten` / :func:`stack_params` convert between representations.

Example:
    >>> import torch
    >>> from torch import nn
    >>> fm = FunctionalModel(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))
    >>> params = fm.init_params(seed=0, dtype=torch.float64)
    >>> list(params), fm.num_params(params)
    (['0.weight', '0.bias', '2.weight', '2.bias'], 21)
    >>> fm.apply(params, torch.zeros(5, 3, dtype=torch.float64)).shape
    torch.Size([5, 1])
    >>> stacked = stack_params([fm.init_params(s) for s in range(4)])
    >>> fm.apply_stacked(stacked, torch.zeros(4, 5, 3)).shape  # one input batch per client
    torch.Size([4, 5, 1])
    >>> torch.equal(unflatten(flatten(params), params)["2.bias"], params["2.bias"])
    True
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.instancenorm import _InstanceNorm

from fedrisk.errors import FedriskError

__all__ = ["FunctionalModel", "Params", "flatten", "stack_params", "unflatten"]

Params = dict[str, Tensor]
"""Parameters by ``named_parameters()`` name."""

_UNIT_AFFINE = (nn.GroupNorm, nn.LayerNorm, _InstanceNorm)


def _check_stateless(module: nn.Module) -> None:
    """Reject layers whose forward pass updates buffers (running statistics)."""
    for name, sub in module.named_modules():
        tracks = isinstance(sub, _InstanceNorm) and sub.track_running_stats
        if isinstance(sub, _BatchNorm) or tracks:
            raise FedriskError(
                f"layer {name or '<root>'!r} ({type(sub).__name__}) keeps running statistics, "
                "which functional federated training cannot carry; use GroupNorm (or no "
                "normalisation) instead"
            )


def _default_init(module: nn.Module, gen: torch.Generator) -> Params:
    """Fresh float32 CPU values for ``module``'s own parameters, drawn from ``gen``.

    Reproduces PyTorch's default ``reset_parameters`` for linear / conv layers (Kaiming-uniform
    weights with ``a = sqrt(5)``, uniform biases in ``+-1/sqrt(fan_in)``) and for norm layers
    (ones / zeros); other modules run their own ``reset_parameters`` on a copy, inside
    ``torch.random.fork_rng`` seeded from ``gen`` so the global RNG is left untouched.
    """
    own = dict(module.named_parameters(recurse=False))
    fresh = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in own.items()}
    if isinstance(module, (nn.Linear, _ConvNd)):
        weight = nn.init.kaiming_uniform_(fresh["weight"], a=math.sqrt(5), generator=gen)
        if "bias" in fresh:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(fresh["bias"], -bound, bound, generator=gen)
        return fresh
    if isinstance(module, _UNIT_AFFINE):
        return {k: torch.ones_like(v) if k == "weight" else torch.zeros_like(v) for k, v in fresh.items()}
    return _fallback_init(module, gen)


def _fallback_init(module: nn.Module, gen: torch.Generator) -> Params:
    if not hasattr(module, "reset_parameters"):
        raise TypeError(
            f"cannot initialise {type(module).__name__}: it owns parameters but has no "
            "reset_parameters() and is not a Linear / Conv / norm layer"
        )
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    clone = copy.deepcopy(module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        clone.reset_parameters()
    return {k: v.detach().float().clone() for k, v in clone.named_parameters(recurse=False)}


class FunctionalModel:
    """A module evaluated as ``f(params, x)``; see the module docstring for an example.

    The module must not contain BatchNorm (or InstanceNorm with running statistics); a
    :class:`~fedrisk.errors.FedriskError` says so otherwise.  Constant buffers are allowed and
    are taken from the module.  The module's own parameter values are never used by
    :meth:`apply` (every parameter must be in ``params``).
    """

    def __init__(self, module: nn.Module) -> None:
        _check_stateless(module)
        self.module = module
        self.names = [name for name, _ in module.named_parameters()]
        self._buffers = dict(module.named_buffers())
        self._functional_forward = getattr(module, "functional_forward", None)

    def init_params(
        self,
        seed: int | torch.Generator = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Params:
        """Fresh parameters with PyTorch's default initialisation, deterministic in ``seed``.

        ``seed`` is an int or a CPU ``torch.Generator`` (which is advanced).  Values are drawn
        module by module in ``named_modules()`` order from that generator only (the global
        RNG is neither used nor changed), in float32 on the CPU, and then cast to ``dtype`` and
        moved to ``device``, so a float64 init is exactly the float32 init, widened.  For a
        model whose layers are created in ``named_modules()`` order (all zoo models) the
        values equal those of ``torch.manual_seed(seed)`` followed by building the module.

        Example:
            >>> fm = FunctionalModel(torch.nn.Linear(2, 1))
            >>> torch.equal(fm.init_params(7)["weight"], fm.init_params(7)["weight"])
            True
        """
        gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
        values: Params = {}
        for prefix, sub in self.module.named_modules():
            if next(sub.parameters(recurse=False), None) is None:
                continue
            for key, value in _default_init(sub, gen).items():
                values[f"{prefix}.{key}" if prefix else key] = value
        return {name: values[name].to(dtype=dtype, device=device) for name in self.names}

    def apply(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        """``module(x)`` evaluated with ``params`` (differentiable in both, vmap-able).

        Modules that define ``functional_forward(params, x)`` (the zoo's logreg and mlp) are
        evaluated through it directly, which avoids ``functional_call``'s per-call overhead.
        """
        if self._functional_forward is not None:
            if len(params) != len(self.names):
                missing = sorted(set(self.names) - set(params))
                raise RuntimeError(f"missing parameters {missing} (expected exactly {self.names})")
            return self._functional_forward(params, x)
        state = {**self._buffers, **params} if self._buffers else dict(params)
        return functional_call(self.module, state, (x,), strict=True)

    def apply_stacked(self, stacked: Mapping[str, Tensor], x: Tensor, *, shared_input: bool = False) -> Tensor:
        """:meth:`apply` vmapped over the leading (client) dimension of ``stacked``.

        ``x`` has the same leading dimension (one batch per parameter set) unless
        ``shared_input=True``, in which case every parameter set sees the same batch ``x``.

        Example:
            >>> fm = FunctionalModel(torch.nn.Linear(2, 3))
            >>> stacked = stack_params([fm.init_params(0), fm.init_params(1)])
            >>> fm.apply_stacked(stacked, torch.ones(4, 2), shared_input=True).shape
            torch.Size([2, 4, 3])
        """
        return vmap(self.apply, in_dims=(0, None if shared_input else 0))(dict(stacked), x)

    def num_params(self, params: Mapping[str, Tensor] | None = None) -> int:
        """Number of scalars in ``params`` (default: in the module), unstacked."""
        tensors = params.values() if params is not None else self.module.parameters()
        return sum(t.numel() for t in tensors)


def flatten(params: Mapping[str, Tensor]) -> Tensor:
    """Concatenate all parameters (in dict order) into one 1-D tensor.

    Works under ``torch.func.vmap`` for stacked parameters.

    Example:
        >>> flatten({"a": torch.ones(2, 2), "b": torch.zeros(1)}).tolist()
        [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    if not params:
        raise ValueError("flatten: params is empty")
    return torch.cat([p.reshape(-1) for p in params.values()])


def unflatten(vec: Tensor, like: Mapping[str, Tensor]) -> Params:
    """Split a 1-D ``vec`` back into tensors with the names and shapes of ``like``.

    The inverse of :func:`flatten`; the result has ``vec``'s dtype and device.

    Example:
        >>> like = {"a": torch.ones(2, 2), "b": torch.zeros(1)}
        >>> {k: v.shape for k, v in unflatten(torch.arange(5.0), like).items()}
        {'a': torch.Size([2, 2]), 'b': torch.Size([1])}
    """
    sizes = [p.numel() for p in like.values()]
    if vec.dim() != 1 or vec.shape[0] != sum(sizes):
        raise ValueError(f"unflatten: expected a 1-D tensor of {sum(sizes)} values; got shape {list(vec.shape)}")
    chunks = torch.split(vec, sizes)
    return {k: c.reshape(p.shape) for (k, p), c in zip(like.items(), chunks)}


def stack_params(params: Sequence[Mapping[str, Tensor]]) -> Params:
    """Stack parameter dicts along a new leading dimension (for ``torch.func.vmap``).

    Example:
        >>> stack_params([{"w": torch.zeros(3)}, {"w": torch.ones(3)}])["w"].shape
        torch.Size([2, 3])
    """
    if not params:
        raise ValueError("stack_params: need at least one parameter dict")
    return {k: torch.stack([p[k] for p in params]) for k in params[0]}
