"""The spec's "client-offset" federation (FeDXL spec §7.2): where only cross-client pairs help.

Client ``k`` of ``N`` draws ``x_sig ~ N(±0.75 e1, I_5)`` (the sign set by the label, positives with
probability ``pos_ratio``), shifts ``x_sig[0]`` by ``c_k = linspace(-3, 3, N)[k]`` and appends a
one-hot client id (8 dimensions for 8 clients).  A linear scorer trained on *within-client* pairs
(Local Pair) has zero gradient along every client-constant feature, so it cannot learn the
per-client offset correction that the pooled ranking needs; cross-client pairs (FeDXL,
centralised training) can.  The test set is a fresh draw from the same ``N`` client
distributions, pooled.

Example:
    >>> fed, test = client_offset_federation(4, rows=30, test_rows=10, seed=0)
    >>> fed.num_clients, tuple(fed.clients[0].x.shape), tuple(test.x.shape)
    (4, (30, 9), (40, 9))
"""

from __future__ import annotations

import torch

from fedrisk.data.federation import Federation, Samples

__all__ = ["client_offset_federation"]


def client_offset_federation(
    num_clients: int = 8,
    rows: int = 300,
    test_rows: int = 100,
    seed: int = 0,
    pos_ratio: float = 1 / 6,
    offset: float = 3.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[Federation, Samples]:
    """``(federation, pooled test set)`` of the client-offset generator (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    offsets = torch.linspace(-offset, offset, num_clients, dtype=dtype)

    def draw(k: int, m: int) -> Samples:
        y = (torch.rand(m, generator=g) < pos_ratio).long()
        sig = torch.randn(m, 5, generator=g, dtype=dtype)
        sig[:, 0] += 1.5 * (y.to(dtype) - 0.5) + offsets[k]
        onehot = torch.zeros(m, num_clients, dtype=dtype)
        onehot[:, k] = 1
        return Samples(torch.cat([sig, onehot], 1), y)

    clients = [draw(k, rows) for k in range(num_clients)]
    test = Samples.concat([draw(k, test_rows) for k in range(num_clients)])
    return Federation("client_offsets", clients, 2, test=test), test
