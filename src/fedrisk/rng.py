"""Deterministic random streams.

Every random draw in a federated run comes from a ``torch.Generator`` seeded from a tuple
``(seed, round, party, stream)``.  Results therefore do not depend on the executor, the
order in which clients are processed, or the number of processes.

Example:
    >>> g1 = client_generator(0, round=3, client=7)
    >>> g2 = client_generator(0, round=3, client=7)
    >>> int(torch.randint(100, (1,), generator=g1)) == int(torch.randint(100, (1,), generator=g2))
    True
"""

from __future__ import annotations

import hashlib

import torch

SERVER = -1


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed that depends on every key (stable across processes and Python versions)."""
    text = "/".join(str(k) for k in keys).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def generator(*keys: int | str) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(derive_seed(*keys))
    return gen


def client_generator(seed: int, round: int, client: int, stream: str = "update") -> torch.Generator:
    """The generator of ``client`` in ``round`` (rounds count from 0)."""
    return generator(seed, round, client, stream)


def server_generator(seed: int, round: int, stream: str = "server") -> torch.Generator:
    return generator(seed, round, SERVER, stream)
