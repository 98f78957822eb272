"""The linear model and least-squares federations that the exact algorithm tests share.

Test modules import it after putting this folder on ``sys.path`` (the tests folders are not
packages), as ``tests/runtime`` does for its distributed cases.
"""

from __future__ import annotations

import torch

from fedrisk.data.federation import Federation, Samples

F64 = torch.float64
D = 3


class Linear:
    """``f(x) = x @ w`` as a functional model, ``w`` drawn from the run's generator."""

    def init_params(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"w": torch.randn(D, generator=gen, dtype=F64)}

    def apply(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return x @ params["w"]


class ZeroLinear(Linear):
    """``f(x) = x @ w`` starting at ``w = 0`` (every method starts at the same point)."""

    def init_params(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(D)}


def least_squares(sizes: tuple[int, ...], seed: int, shift: float = 0.5, scale: float = 2.0) -> Federation:
    """Client k: rows shifted by ``shift * k``, targets from its own ground truth ``scale * N(0, I)``."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for k, n in enumerate(sizes):
        a = torch.randn(n, D, generator=g, dtype=F64) + shift * k
        clients.append(Samples(a, a @ (scale * torch.randn(D, generator=g, dtype=F64))))
    return Federation("least-squares", clients, num_classes=1)
