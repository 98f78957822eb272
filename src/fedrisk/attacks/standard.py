"""The standard Byzantine attacks, configurable from ``[attack]``.

Every reply attack replaces, for each Byzantine client, every floating tensor leaf of its reply
(model, gradient or FRPG's penalty gradient ``g``: whatever the algorithm sends) and keeps the
other leaves.  Statistics of *honest* replies are taken leaf by leaf over the round's
non-Byzantine replies (the omniscient attacker of the literature).

========================  ====================================================================
``gaussian``              ``scale * N(0, I)``, redrawn every round and per client (paper 002:
                          ``scale = 1e4``)
``sign_flip``             ``-scale x`` the client's own honest reply
``alie``                  "a little is enough" (Baruch et al., 2019): ``mean_h - z std_h`` per
                          coordinate; ``z`` from ``n`` and ``f`` when not given
``ipm``                   inner-product manipulation (Xie et al., 2020): ``-epsilon mean_h``
``zero``                  all zeros
``same_value``            every entry ``value``
``label_flip``            a data attack: the Byzantine clients' labels ``y -> C - 1 - y``
                          before the run; they then follow the algorithm honestly
========================  ====================================================================

Example:
    >>> import torch
    >>> from fedrisk.aggregators.base import InMemoryReplies
    >>> from fedrisk.algorithms.base import FedInfo, RoundContext
    >>> r = InMemoryReplies({k: {"g": torch.tensor([float(k), 1.0])} for k in range(4)})
    >>> ctx = RoundContext(0, FedInfo(4, (1,) * 4, 2))
    >>> IPM(epsilon=0.5).apply(ctx, r, [3], torch.Generator()).as_dict()[3]["g"].tolist()
    [-0.5, -0.5]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from fedrisk.aggregators.base import InMemoryReplies, Replies
from fedrisk.algorithms.base import RoundContext
from fedrisk.attacks.base import Attack
from fedrisk.errors import FedriskError
from fedrisk.tree import Tree, tree_map

__all__ = [
    "ALIE",
    "IPM",
    "GaussianAttack",
    "LabelFlipAttack",
    "ReplyAttack",
    "SameValueAttack",
    "SignFlipAttack",
    "ZeroAttack",
    "alie_z",
]


def _is_float(x: Any) -> bool:
    return isinstance(x, Tensor) and x.is_floating_point()


def _finite_number(name: str, value: Any, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        need = "a finite number > 0" if positive else "a finite number"
        raise FedriskError(f"{name} = {value!r} is not allowed; it must be {need}")
    if positive and not value > 0:
        raise FedriskError(f"{name} = {value!r} is not allowed; it must be a finite number > 0")
    return float(value)


class ReplyAttack(Attack):
    """Base of the attacks that forge replies: subclasses define :meth:`forge_leaf`.

    ``forge_leaf(own, honest, gen)`` gets the Byzantine client's own leaf, the honest clients'
    leaves stacked ``[h, ...]`` (None when the attack does not need them) and the round's attack
    generator, and returns the forged leaf.
    """

    omniscient: bool = False

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        raise NotImplementedError

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        every = replies.as_dict()
        bad = set(int(k) for k in byzantine)
        honest_ids = [k for k in replies.clients if k not in bad]
        if self.omniscient and not honest_ids:
            raise FedriskError(
                f"attack {self.name!r} needs at least one honest reply to imitate; every client is Byzantine"
            )
        out: dict[int, dict[str, Any]] = {}
        stacked: dict[str, Tree] = {}
        for k in replies.clients:
            if k not in bad:
                out[k] = every[k]
                continue
            forged = {}
            for key, value in every[k].items():
                if self.omniscient and key not in stacked:
                    stacked[key] = tree_map(
                        lambda *xs: torch.stack(xs) if _is_float(xs[0]) else None, *[every[h][key] for h in honest_ids]
                    )
                honest = stacked.get(key)
                forged[key] = self._forge_tree(value, honest, gen)
            out[k] = forged
        return InMemoryReplies(out)

    def _forge_tree(self, own: Tree, honest: Tree | None, gen: torch.Generator) -> Tree:
        if honest is None:
            return tree_map(lambda x: self.forge_leaf(x, None, gen) if _is_float(x) else x, own)
        return tree_map(lambda x, h: self.forge_leaf(x, h, gen) if _is_float(x) else x, own, honest)


class GaussianAttack(ReplyAttack):
    """``scale * N(0, I)`` in place of every Byzantine reply, redrawn every round (paper 002 uses 1e4).

    Example:
        >>> own = torch.zeros(3)
        >>> GaussianAttack(scale=2.0).forge_leaf(own, None, torch.Generator().manual_seed(0)).shape
        torch.Size([3])
    """

    name = "gaussian"

    def __init__(self, scale: float = 1e4) -> None:
        self.scale = _finite_number("gaussian: scale", scale, positive=True)

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        noise = torch.randn(own.shape, generator=gen, dtype=torch.float64)
        return (self.scale * noise).to(own.dtype).to(own.device)


class SignFlipAttack(ReplyAttack):
    """``-scale x`` the Byzantine client's own (honestly computed) reply.

    Example:
        >>> SignFlipAttack().forge_leaf(torch.tensor([1.0, -2.0]), None, torch.Generator()).tolist()
        [-1.0, 2.0]
    """

    name = "sign_flip"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = _finite_number("sign_flip: scale", scale, positive=True)

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        return -self.scale * own


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s (2019) ``z_max``: ``s = floor(n/2 + 1) - f``, ``z = Phi^{-1}((n - s) / n)``.

    Example:
        >>> round(alie_z(20, 4), 4)
        0.3853
    """
    if not 0 < f < n:
        raise FedriskError(f"alie: needs 0 < f < n Byzantine clients; got f = {f}, n = {n}")
    s = n // 2 + 1 - f
    p = (n - s) / n
    p = min(max(p, 1e-6), 1 - 1e-6)
    return NormalDist().inv_cdf(p)


class ALIE(ReplyAttack):
    """ "A little is enough": every Byzantine reply is ``mean_h - z std_h`` (coordinate-wise over
    the honest replies, ``std`` with Bessel's correction, 0 for one honest reply).

    ``z = 0`` (default) means Baruch et al.'s ``z_max`` for the round's ``n`` and ``f``
    (:func:`alie_z`).

    Example:
        >>> honest = torch.tensor([[0.0], [2.0]])
        >>> ALIE(z=1.0).forge_leaf(torch.zeros(1), honest, torch.Generator()).tolist()
        [-0.41421353816986084]
    """

    name = "alie"
    omniscient = True

    def __init__(self, z: float = 0.0) -> None:
        self.z = _finite_number("alie: z", z)
        self._round_z = self.z

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        n, f = len(replies.clients), len(set(byzantine) & set(replies.clients))
        self._round_z = self.z if self.z != 0 else alie_z(n, f)
        return super().apply(ctx, replies, byzantine, gen)

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        assert honest is not None
        std = honest.std(dim=0) if honest.shape[0] > 1 else torch.zeros_like(honest[0])
        return honest.mean(dim=0) - self._round_z * std


class IPM(ReplyAttack):
    """Inner-product manipulation: every Byzantine reply is ``-epsilon x`` the honest mean.

    Example:
        >>> IPM(epsilon=0.1).forge_leaf(torch.zeros(1), torch.tensor([[1.0], [3.0]]), torch.Generator()).tolist()
        [-0.20000000298023224]
    """

    name = "ipm"
    omniscient = True

    def __init__(self, epsilon: float = 0.1) -> None:
        self.epsilon = _finite_number("ipm: epsilon", epsilon, positive=True)

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        assert honest is not None
        return -self.epsilon * honest.mean(dim=0)


class ZeroAttack(ReplyAttack):
    """Every Byzantine reply is all zeros.

    Example:
        >>> ZeroAttack().forge_leaf(torch.ones(2), None, torch.Generator()).tolist()
        [0.0, 0.0]
    """

    name = "zero"

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        return torch.zeros_like(own)


class SameValueAttack(ReplyAttack):
    """Every entry of every Byzantine reply is ``value`` (RSA's "same-value" attack).

    Example:
        >>> SameValueAttack(value=100.0).forge_leaf(torch.ones(2), None, torch.Generator()).tolist()
        [100.0, 100.0]
    """

    name = "same_value"

    def __init__(self, value: float = 100.0) -> None:
        self.value = _finite_number("same_value: value", value)

    def forge_leaf(self, own: Tensor, honest: Tensor | None, gen: torch.Generator) -> Tensor:
        return torch.full_like(own, self.value)


class LabelFlipAttack(Attack):
    """Data attack: the Byzantine clients' training labels become ``C - 1 - y`` before the run
    (paper 002: ``y -> 9 - y``); their replies are then computed honestly and left alone.

    Example:
        >>> from fedrisk.data.federation import Federation, Samples
        >>> fed = Federation("toy", [Samples(torch.zeros(2, 1), torch.tensor([0, 1]))] * 2, num_classes=3)
        >>> [c.y.tolist() for c in LabelFlipAttack().poison(fed, [1]).clients]
        [[0, 1], [2, 1]]
    """

    name = "label_flip"

    def apply(self, ctx: RoundContext, replies: Replies, byzantine: Sequence[int], gen: torch.Generator) -> Replies:
        return replies

    def poison(self, federation: Any, byzantine: Sequence[int]) -> Any:
        from fedrisk.data.transforms import label_flip_attack

        bad = set(int(k) for k in byzantine)
        clients = [
            dataclasses.replace(s, y=label_flip_attack(s.y, federation.num_classes)) if k in bad else s
            for k, s in enumerate(federation.clients)
        ]
        return dataclasses.replace(federation, clients=clients)
