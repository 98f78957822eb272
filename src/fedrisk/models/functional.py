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

import contextlib
import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.modules.instancenorm import _InstanceNorm

from fedrisk.errors import FedriskError

__all__ = ["FunctionalModel", "Params", "flatten", "stack_params", "unflatten"]

Params = dict[str, Tensor]
"""Parameters by ``named_parameters()`` name."""

_UNIT_AFFINE = (nn.GroupNorm, nn.LayerNorm, _InstanceNorm, _BatchNorm)


def _check_functional(module: nn.Module) -> dict[str, _BatchNorm]:
    """The BatchNorm layers that keep running statistics, by name; a FedriskError naming the
    layer and the alternatives for a layer the functional path cannot run."""
    layers: dict[str, _BatchNorm] = {}
    for name, sub in module.named_modules():
        where = f"layer {name or '<root>'!r} ({type(sub).__name__})"
        if isinstance(sub, _InstanceNorm) and sub.track_running_stats:
            raise FedriskError(
                f"{where} keeps running statistics, which the functional path supports for BatchNorm only; "
                "use InstanceNorm with track_running_stats=False, GroupNorm, LayerNorm or BatchNorm"
            )
        if isinstance(sub, _DropoutNd) and sub.p > 0 and sub.training:
            raise FedriskError(
                f"{where} draws from torch's global random generator in training mode, which the executors "
                "cannot reproduce per client; remove it, set p = 0, or call module.eval() on it"
            )
        if any(isinstance(p, nn.parameter.UninitializedParameter) for p in sub.parameters(recurse=False)):
            raise FedriskError(
                f"{where} has uninitialised (lazy) parameters; run one forward pass on a sample batch "
                "before wrapping it, or use the non-lazy layer (nn.Linear, nn.Conv2d)"
            )
        if isinstance(sub, _BatchNorm) and sub.track_running_stats:
            if sub.momentum is None:
                raise FedriskError(
                    f"{where} has momentum=None (a cumulative average over all batches), which federated "
                    "running statistics do not support; set a momentum (PyTorch's default is 0.1)"
                )
            layers[name] = sub
    return layers


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

    Args:
        module: the network.  Constant buffers are taken from it.  Its own parameter values
            are used only with ``init="module"`` (:meth:`apply` always takes ``params``).
        init: ``"fresh"`` (default): :meth:`init_params` draws PyTorch's default
            initialisation from a seed; ``"module"``: it returns the module's own (e.g.
            pretrained) weights, and :meth:`init_stats` its running statistics.
        norm_stats: for a module with BatchNorm layers, what happens to their running
            statistics between rounds: ``"averaged"`` (default), ``"local"`` (FedBN) or
            ``"frozen"`` (see :mod:`fedrisk.models.norm` and
            :mod:`fedrisk.runtime.norm_stats`); a module without BatchNorm takes None only.

    BatchNorm layers are evaluated by :func:`fedrisk.models.norm.batch_norm` with the
    statistics of the innermost :meth:`norm_scope` (eval mode with :meth:`init_stats` outside
    any scope).  Their ``forward`` is redirected on the module instance while :meth:`apply`
    runs (:func:`fedrisk.models.norm.route_batch_norm`); called directly, the module behaves
    as before.

    Example:
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        >>> fm = FunctionalModel(net, init="module")
        >>> fm.stat_names, torch.equal(fm.init_params()["0.weight"], net[0].weight)
        (['1.running_mean', '1.running_var'], True)
        >>> with fm.norm_scope(fm.init_stats(), train=True) as scope:
        ...     _ = fm.apply(fm.init_params(), torch.randn(8, 3))
        >>> bool((scope.result()["1.running_var"] != 1).all())  # moved towards the batch's variance
        True
    """

    def __init__(self, module: nn.Module, *, init: str = "fresh", norm_stats: str | None = None) -> None:
        from fedrisk.models.norm import NORM_POLICIES

        if init not in ("fresh", "module"):
            raise FedriskError(f"FunctionalModel init = {init!r} is not allowed; allowed: 'fresh', 'module'")
        self.norm_layers = _check_functional(module)
        if norm_stats is not None and norm_stats not in NORM_POLICIES:
            raise FedriskError(
                f"norm_stats = {norm_stats!r} is not allowed; allowed: {', '.join(map(repr, NORM_POLICIES))}"
            )
        if norm_stats is not None and not self.norm_layers:
            raise FedriskError(
                f"norm_stats = {norm_stats!r} but {type(module).__name__} has no BatchNorm layer with running "
                "statistics; leave norm_stats unset for this model"
            )
        self.module = module
        self.init = init
        self.norm_stats = (norm_stats or "averaged") if self.norm_layers else None
        self.names = [name for name, _ in module.named_parameters()]
        self.stat_names = [f"{n}.{b}" if n else b for n in self.norm_layers for b in ("running_mean", "running_var")]
        self._buffers = dict(module.named_buffers())
        self._buffer_device = next(iter(self._buffers.values())).device if self._buffers else torch.device("cpu")
        self._buffer_copies: dict[torch.device, dict[str, Tensor]] = {}
        self._functional_forward = getattr(module, "functional_forward", None)
        self._scopes: list[Any] = []
        self._layer_names = {id(layer): prefix for prefix, layer in self.norm_layers.items()}
        from fedrisk.models.norm import route_batch_norm

        for layer in self.norm_layers.values():
            route_batch_norm(layer)

    # -- running statistics -------------------------------------------------------------
    def init_stats(self, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Params:
        """The initial running statistics by buffer name (empty without BatchNorm): PyTorch's
        fresh values (mean 0, variance 1), or the module's own with ``init="module"``."""
        out: Params = {}
        for name in self.stat_names:
            own = self._buffers[name]
            if self.init == "module":
                value = own.detach().clone()
            else:
                value = torch.zeros_like(own) if name.endswith("running_mean") else torch.ones_like(own)
            out[name] = value.to(dtype=dtype, device=device)
        return out

    @contextlib.contextmanager
    def norm_scope(self, stats: Mapping[str, Tensor], *, train: bool, update: bool = True) -> Iterator[Any]:
        """Evaluate BatchNorm layers with ``stats`` inside a ``with`` block (see
        :class:`fedrisk.models.norm.NormScope`); yields the scope, whose ``result()`` holds the
        statistics after the block's forward passes."""
        from fedrisk.models.norm import NormScope

        missing = sorted(set(self.stat_names) - set(stats))
        if missing:
            raise FedriskError(f"norm_scope: running statistics {missing[:4]} are missing (expected {self.stat_names})")
        scope = NormScope({k: stats[k] for k in self.stat_names}, train=train, update=update)
        self._scopes.append(scope)
        try:
            yield scope
        finally:
            self._scopes.pop()

    def split_stats(self, tree: Any) -> tuple[Any, Params | None]:
        """``tree`` without its running statistics, and those statistics (None if it has none).

        The statistics sit beside the parameters they belong to, in the dict of the tree that
        holds the model's parameter names (a state_dict-like flat dict, or e.g. the AUC
        family's ``{"model": {...}, "a", "b"}``).
        """
        if not self.stat_names:
            return tree, None
        found: Params = {}

        def strip(node: Any) -> Any:
            if isinstance(node, Mapping):
                out = {}
                for k, v in node.items():
                    if k in self.stat_names and isinstance(v, Tensor):
                        found[k] = v
                    else:
                        out[k] = strip(v)
                return out
            return node

        stripped = strip(tree)
        return stripped, (found or None)

    def attach_stats(self, tree: Any, stats: Mapping[str, Tensor]) -> Any:
        """``tree`` with ``stats`` merged into the dict that holds the model's parameters (the
        inverse of :meth:`split_stats`); ``tree`` unchanged when there are no statistics."""
        if not stats:
            return tree
        first = self.names[0] if self.names else None

        def merge(node: Any) -> tuple[Any, bool]:
            if isinstance(node, Mapping):
                if first in node:
                    return {**node, **stats}, True
                out, done = {}, False
                for k, v in node.items():
                    out[k], hit = (v, False) if done else merge(v)
                    done = done or hit
                return out, done
            return node, False

        merged, done = merge(tree)
        if not done:
            owner = type(self.module).__name__
            raise FedriskError(f"cannot place the running statistics: no dict of {owner}'s parameters")
        return merged

    def head_names(self) -> list[str]:
        """The parameters of the last layer that has any (in ``named_modules()`` order): the
        head that ``model.reset_head`` re-initialises."""
        last: list[str] = []
        for prefix, sub in self.module.named_modules():
            own = [n for n, _ in sub.named_parameters(recurse=False)]
            if own:
                last = [f"{prefix}.{n}" if prefix else n for n in own]
        return last

    def init_params(
        self,
        seed: int | torch.Generator = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Params:
        """Fresh parameters with PyTorch's default initialisation, deterministic in ``seed``
        (with ``init="module"``: a copy of the module's own parameters, ``seed`` unused).

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
        if self.init == "module":
            own = dict(self.module.named_parameters())
            return {name: own[name].detach().clone().to(dtype=dtype, device=device) for name in self.names}
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
        state = {**self._buffers_on(x.device), **params} if self._buffers else dict(params)
        if not self.norm_layers:
            return functional_call(self.module, state, (x,), strict=True)
        from fedrisk.models.norm import NormScope, active

        scope = self._scopes[-1] if self._scopes else NormScope(self.init_stats(device=x.device), train=False)
        with active(scope, self._layer_names):
            return functional_call(self.module, state, (x,), strict=True)

    def _buffers_on(self, device: torch.device) -> dict[str, Tensor]:
        """The module's constant buffers on ``device`` (copied there once; the module itself
        stays where it was built)."""
        if device == self._buffer_device:
            return self._buffers
        moved = self._buffer_copies.get(device)
        if moved is None:
            moved = self._buffer_copies[device] = {k: v.to(device) for k, v in self._buffers.items()}
        return moved

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
