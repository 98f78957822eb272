"""Where a simulation's tensors live: ``Simulation(..., device=...)`` and the config key
``run.device``.

:func:`resolve_device` turns a user's choice into a :class:`torch.device`:

* ``None`` / ``"cpu"``: the CPU (the default);
* ``"cuda"``: the current CUDA device (under ``torchrun``: the GPU ``LOCAL_RANK``, as the
  distributed executor's NCCL backend uses it); ``"cuda:N"``: GPU ``N``;
* ``"auto"``: ``"cuda"`` when a CUDA GPU is available, else the CPU.

A CUDA choice without a CUDA GPU is a one-line :class:`~fedrisk.errors.FedriskError` that names
the key and what is allowed.  Random numbers are always drawn from CPU generators
(:mod:`fedrisk.rng`), so a seed gives the same streams on every device; the draws are moved to
the device where they meet the device's tensors (:func:`to_device`).

Example:
    >>> resolve_device(None), resolve_device("cpu")
    (device(type='cpu'), device(type='cpu'))
    >>> resolve_device("gpu", key="run.device")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedrisk.errors.FedriskError: run.device = 'gpu' is not a device; allowed: 'cpu', 'auto' (CUDA when ...
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch import Tensor

from fedrisk.errors import FedriskError
from fedrisk.tree import tensor_leaves, tree_map

DEVICE_CHOICES = "'cpu', 'auto' (CUDA when available), 'cuda' or 'cuda:N'"
_SPEC = re.compile(r"cpu|auto|cuda(?::(\d+))?")


def check_device_spec(spec: str, key: str = "device") -> str | None:
    """The problem with the spelling of ``spec`` (None when it is one of :data:`DEVICE_CHOICES`);
    whether a GPU is present is checked by :func:`resolve_device` when the run starts.

    Example:
        >>> check_device_spec("cuda:1"), check_device_spec("CUDA")
        (None, "device = 'CUDA' is not a device; allowed: 'cpu', 'auto' (CUDA when available), 'cuda' or 'cuda:N'")
    """
    if isinstance(spec, str) and _SPEC.fullmatch(spec):
        return None
    return f"{key} = {spec!r} is not a device; allowed: {DEVICE_CHOICES}"


def resolve_device(spec: str | torch.device | None, key: str = "device") -> torch.device:
    """The :class:`torch.device` of ``spec`` (see the module docstring); ``key`` names the
    setting in error messages (``"run.device"`` for a config)."""
    if spec is None:
        return torch.device("cpu")
    text = str(spec) if isinstance(spec, torch.device) else spec
    problem = check_device_spec(text, key)
    if problem:
        raise FedriskError(problem)
    if text == "cpu" or (text == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "this PyTorch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise FedriskError(f"{key} = {text!r} needs a CUDA GPU but {build}; allowed here: 'cpu' or 'auto'")
    count = torch.cuda.device_count()
    index = _SPEC.fullmatch(text).group(1)  # type: ignore[union-attr]
    if index is None:  # "cuda" / "auto": torchrun's LOCAL_RANK, else the current device
        local = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", int(local) % count if local is not None else torch.cuda.current_device())
    if int(index) >= count:
        raise FedriskError(
            f"{key} = {text!r}: there {'is' if count == 1 else 'are'} {count} CUDA device(s); allowed: 'cuda:0'"
            + (f" .. 'cuda:{count - 1}'" if count > 1 else "")
        )
    return torch.device("cuda", int(index))


def to_device(tree: Any, device: torch.device | None) -> Any:
    """``tree`` with its tensors on ``device`` (any pytree: dicts, lists, tuples); ``tree``
    itself when ``device`` is None or every tensor is there already.

    Example:
        >>> t = {"idx": torch.arange(3), "n": 2}
        >>> to_device(t, torch.device("cpu")) is t
        True
    """
    if device is None or all(_same(x, device) for x in tensor_leaves(tree)):
        return tree
    return tree_map(lambda x: x.to(device) if isinstance(x, Tensor) and not _same(x, device) else x, tree)


def plan_device(plan: Any, default: torch.device) -> torch.device:
    """Where a round's replies belong: the device of the server's broadcast, else of the
    per-client payloads (PERM's shuffle rounds broadcast nothing), else ``default``.

    Example:
        >>> from fedrisk.algorithms.base import RoundPlan
        >>> plan_device(RoundPlan([0], per_client={0: {"w": torch.zeros(1, device="meta")}}), torch.device("cpu"))
        device(type='meta')
    """
    leaves = tensor_leaves(dict(plan.broadcast))
    if not leaves and plan.per_client is not None and plan.clients:
        leaves = tensor_leaves(dict(plan.per_client[plan.clients[0]]))
    return leaves[0].device if leaves else default


def _same(x: Tensor, device: torch.device) -> bool:
    return x.device.type == device.type and (device.index is None or x.device.index == device.index)
