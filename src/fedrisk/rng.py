"""Deterministic random streams.

Every random draw in a federated run is a pure function of ``(seed, round, party, stream)``,
so results do not depend on the executor, the order in which clients are processed, the block
size or the number of processes.

* **Clients** draw from a :class:`ClientRNG`: a *counter-based* generator (SplitMix64's
  bijective mixer applied to ``key + counter``).  Its numbers are computed, not stepped, so the
  draws of a whole block of clients are one vectorised computation whose row ``i`` is bit for
  bit what client ``i``'s own generator gives: the vectorised executor draws a round's
  minibatch indices for a thousand clients in about a millisecond, where one
  ``torch.Generator`` per client costs 10-20 ms.  Each method call consumes one *call
  index*, so a client's successive calls give independent numbers, exactly like successive
  calls on a stateful generator.
* **The server** and data preparation use ``torch.Generator`` objects seeded by
  :func:`derive_seed` (one per round, never on a hot path).

Example:
    >>> a = client_generator(0, round=3, client=7)
    >>> b = client_generator(0, round=3, client=7)
    >>> bool((a.integers(100, (4,)) == b.integers(100, (4,))).all())
    True
    >>> block = client_generator(0, round=3, client=[5, 6, 7])  # three clients at once
    >>> bool((block.integers(100, (4,))[2] == client_generator(0, 3, 7).integers(100, (4,))).all())
    True
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["SERVER", "ClientRNG", "client_generator", "derive_seed", "generator", "mix64", "server_generator"]

SERVER = -1

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment (odd): keys and counters are spread by it
_CALL = 0xD1B54A32D192ED03  # another odd constant: separates the call index from the counter
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed that depends on every key (stable across processes and Python versions)."""
    text = "/".join(str(k) for k in keys).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def generator(*keys: int | str) -> torch.Generator:
    """A ``torch.Generator`` seeded by :func:`derive_seed` of ``keys``."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(*keys))
    return gen


def server_generator(seed: int, round: int, stream: str = "server") -> torch.Generator:
    """The server's generator in ``round`` (client sampling, server-side randomness)."""
    return generator(seed, round, SERVER, stream)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function, a bijection of 64-bit words (``uint64`` arrays, wrapping).

    Example:
        >>> hex(int(mix64(np.array([1], dtype=np.uint64))[0]))
        '0x5692161d100b05e5'
    """
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_M1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _mix64_int(z: int) -> int:
    """:func:`mix64` of one Python int (the same bits; no numpy call overhead)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=32)
def _spread_counters(n: int) -> np.ndarray:
    """``GOLDEN * (arange(n) + 1)`` (wrapping), read-only: the counters of a call of n words."""
    out = np.uint64(_GOLDEN) * np.arange(1, n + 1, dtype=np.uint64)
    out.flags.writeable = False
    return out


PERMUTATION_ELEMENTS = 1 << 22
"""Bound on the ``clients x epochs x rows`` array one chunk of :meth:`ClientRNG.permutations` sorts."""

_DISTINCT = 1 << 62
"""Counter offset of the partial epoch's stream of uniform draws (the sorted epochs use the
counters ``(e << 32) | j`` with ``e, j < 2**32``: the two never meet)."""


def _permutation_rows(sub: np.ndarray, sizes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Epochs of sorted permutations for clients with call keys ``sub`` and sizes ``sizes``, row
    ``i`` valid in its first ``lengths[i]`` entries (shape ``(C, max(lengths))``): item ``j`` of
    epoch ``e`` is ranked by ``mix64(sub + GOLDEN * (((e << 32) | j) + 1))``."""
    n_max, width = int(sizes.max()), int(lengths.max())
    epochs = max(1, int((-(-lengths // sizes)).max()))
    e = np.arange(epochs, dtype=np.uint64)[:, None]
    j = np.arange(n_max, dtype=np.uint64)[None, :]
    words = mix64(sub[:, None, None] + np.uint64(_GOLDEN) * (((e << np.uint64(32)) | j) + np.uint64(1)))
    u = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53
    sort_key = u + np.arange(epochs, dtype=np.float64)[:, None]  # epoch first, then the random rank
    valid = np.arange(n_max)[None, None, :] < sizes.reshape(-1, 1, 1)
    sort_key = np.where(valid, sort_key, np.inf).reshape(len(sizes), epochs * n_max)
    return np.argsort(sort_key, axis=-1, kind="stable")[:, :width] % n_max


@functools.lru_cache(maxsize=32)
def _distinct_counters(k: int) -> np.ndarray:
    """``GOLDEN * (DISTINCT + arange(k) + 1)`` (wrapping), read-only: the partial epoch's counters."""
    out = np.uint64(_GOLDEN) * (np.arange(k, dtype=np.uint64) + np.uint64(_DISTINCT + 1))
    out.flags.writeable = False
    return out


def _distinct_draws(sub: np.ndarray, sizes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The first ``counts[i]`` *distinct* values of client ``i``'s stream of uniform draws below
    ``sizes[i]`` (word ``k``: ``mix64(sub + GOLDEN * (DISTINCT + k + 1))``, Lemire's multiply-shift
    as in :meth:`ClientRNG.integers`), in stream order; shape ``(C, max(counts))``, row ``i``
    valid in its first ``counts[i]`` entries.

    Dropping repeats from i.i.d. uniform draws samples without replacement, in order: the result
    is distributed as the first ``counts[i]`` items of a uniform random permutation.  Used for
    ``2 * counts < sizes``, where the expected number of draws is below ``2 * counts``: the cost
    is O(counts), whatever the size.  The result is defined by the stream, so it does not depend
    on how many words a call computes (``k`` doubles until every row has enough).
    """
    need = int(counts.max())
    k = 2 * need + 8
    while True:
        words = mix64(sub[:, None] + _distinct_counters(k))
        cand = (((words >> np.uint64(32)) * sizes.astype(np.uint64)[:, None]) >> np.uint64(32)).astype(np.int64)
        if len(sizes) == 1:  # one client (the sequential executor): dict keeps first occurrences in order
            distinct = list(dict.fromkeys(cand[0].tolist()))
            if len(distinct) >= need:
                return np.array([distinct[:need]], dtype=np.int64)
            k *= 2
            continue
        order = np.argsort(cand, axis=1, kind="stable")  # equal values: the earliest draw first
        ranked = np.take_along_axis(cand, order, 1)
        first_sorted = np.ones(cand.shape, dtype=bool)
        first_sorted[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
        first = np.empty_like(first_sorted)
        np.put_along_axis(first, order, first_sorted, 1)
        rank = np.cumsum(first, axis=1)  # 1 + the number of distinct values seen before
        if bool((rank[:, -1] >= counts).all()):
            break
        k *= 2
    take = first & (rank <= counts[:, None])
    rows, cols = np.nonzero(take)
    out = np.zeros((len(sizes), need), dtype=np.int64)
    out[rows, rank[rows, cols] - 1] = cand[rows, cols]
    return out


@functools.lru_cache(maxsize=64)
def _stream_key(seed: int, round: int, stream: str) -> int:
    return derive_seed(seed, round, "clients", stream)


class ClientRNG:
    """Counter-based random numbers for one client (``keys`` of shape ``()``) or a block of
    clients (``keys`` of shape ``(C,)``: every result gets a leading client dimension).

    Built by :func:`client_generator`.  Algorithms receive one in ``Algorithm.draw``; with
    ``batched_draw = True`` the vectorised executor passes a block one instead and the same
    code draws for every client of the block at once.  Results are ``torch`` tensors on the CPU.

    Args:
        keys: 64-bit keys, one per client (``uint64`` array of shape ``()`` or ``(C,)``).
        calls: the call index to start from (a fresh generator starts at 0).

    Example:
        >>> rng = client_generator(1, round=0, client=[0, 1])
        >>> rng.integers(torch.tensor([3, 1000]), (2,)).shape
        torch.Size([2, 2])
        >>> rng.uniform((3,), dtype=torch.float64).dtype
        torch.float64
    """

    def __init__(self, keys: np.ndarray, calls: int = 0) -> None:
        keys = np.asarray(keys, dtype=np.uint64)
        if keys.ndim > 1:
            raise ValueError(f"ClientRNG keys must have shape () or (C,); got {keys.shape}")
        self._scalar = keys.ndim == 0
        self._keys = keys.reshape(-1)  # 1-D internally: numpy warns on 0-d integer overflow
        self._calls = int(calls)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """``()`` for one client, ``(C,)`` for a block."""
        return () if self._scalar else (len(self._keys),)

    def __len__(self) -> int:
        if self._scalar:
            raise TypeError("a single client's ClientRNG has no length")
        return len(self._keys)

    def __getitem__(self, i: int) -> ClientRNG:
        """Client ``i`` of a block, at the block's current call index."""
        if self._scalar:
            raise TypeError("a single client's ClientRNG cannot be indexed")
        return ClientRNG(self._keys[i], self._calls)

    # -- raw bits ------------------------------------------------------------------------------
    def bits(self, counters: np.ndarray) -> np.ndarray:
        """One call's 64-bit words for ``counters`` (``uint64``): shape ``batch + counters.shape``.

        Word ``(client, counter)`` is ``mix64(mix64(key + CALL * call) + GOLDEN * (counter + 1))``
        with ``call`` counting this generator's calls from 1.
        """
        c = np.asarray(counters, dtype=np.uint64)
        return self._raw(c).reshape(self.batch_shape + c.shape)

    def _next_subkeys(self) -> np.ndarray:
        """Advance the call index; this call's keys ``mix64(key + CALL * call)``, shape ``(C, 1)``."""
        self._calls += 1
        if self._scalar:  # Python ints for one key: a few microseconds less per call
            return np.full((1, 1), _mix64_int(int(self._keys[0]) + _CALL * self._calls), dtype=np.uint64)
        return mix64(self._keys + np.uint64((_CALL * self._calls) & _MASK64))[:, None]

    def _raw(self, c: np.ndarray) -> np.ndarray:
        """The words of one call, shape ``(C,) + c.shape`` (``C = 1`` for one client)."""
        sub = self._next_subkeys().reshape((-1,) + (1,) * c.ndim)
        return mix64(sub + np.uint64(_GOLDEN) * (c + np.uint64(1)))

    def _raw_range(self, n: int) -> np.ndarray:
        """:meth:`_raw` of the counters ``0 .. n-1``, shape ``(C, n)``."""
        return mix64(self._next_subkeys() + _spread_counters(n))

    def _unit(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform float64 in [0, 1), shape ``(C,) + shape``."""
        words = self._raw_range(math.prod(shape)).reshape((-1, *shape))
        return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def _out(self, arr: np.ndarray, shape: tuple[int, ...]) -> Tensor:
        """An internal ``(C,) + shape`` array as the public ``batch + shape`` tensor."""
        return torch.from_numpy(np.ascontiguousarray(arr.reshape(self.batch_shape + shape)))

    # -- distributions -------------------------------------------------------------------------
    def integers(self, high: int | Tensor | Sequence[int], shape: Sequence[int]) -> Tensor:
        """Uniform integers in ``[0, high)`` (int64), shape ``batch + shape``.

        ``high`` is an int or one bound per client (shape ``batch``), each in ``[1, 2**31)``.
        Lemire's multiply-shift on the top 32 bits (bias below ``high / 2**32``).
        """
        shape = tuple(shape)
        words = self._raw_range(math.prod(shape)) >> np.uint64(32)
        if self._scalar and type(high) is int:  # the sequential executor's hot path
            if not 1 <= high < 2**31:
                raise ValueError(f"ClientRNG.integers: high must be in [1, 2**31); got {high}")
            scaled = words[0] * np.uint64(high)
        else:
            h = self._per_client(high, "high")
            if (h < 1).any() or (h >= 2**31).any():
                raise ValueError(f"ClientRNG.integers: high must be in [1, 2**31); got {h.tolist()}")
            scaled = words * h.astype(np.uint64)[:, None]
        return self._out((scaled >> np.uint64(32)).astype(np.int64), shape)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform floats in ``[0, 1)`` (53 random bits, then cast to ``dtype``)."""
        shape = tuple(shape)
        return self._out(self._unit(shape), shape).to(dtype)

    def normal(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normal floats (Box-Muller on two uniform words per number)."""
        shape = tuple(shape)
        u = self._unit((2, *shape))
        z = np.sqrt(-2.0 * np.log1p(-u[:, 0])) * np.cos(2.0 * np.pi * u[:, 1])
        return self._out(z, shape).to(dtype)

    def bernoulli(self, p: float, shape: Sequence[int]) -> Tensor:
        """Booleans that are True with probability ``p``."""
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"ClientRNG.bernoulli: p must be in [0, 1]; got {p}")
        shape = tuple(shape)
        return self._out(self._unit(shape) < p, shape)

    def permutations(self, n: int | Tensor | Sequence[int], total: int) -> Tensor:
        """``total`` indices: consecutive random permutations of ``range(n)`` (epochs), cut.

        ``n`` is an int or one size per client; shape ``batch + (total,)``, int64.  With
        ``total = q * n + m`` (``0 <= m < n``) the ``q`` full epochs are uniform random
        permutations (item ``j`` of epoch ``e`` ranked by the word of counter ``(e << 32) | j``)
        and the last ``m`` indices are ``m`` distinct rows in uniform random order: for
        ``2 * m >= n`` the first ``m`` of epoch ``q``'s permutation, for ``2 * m < n`` the first
        ``m`` distinct values of a stream of uniform draws (:func:`_distinct_draws`).  Both paths
        cost O(``total``), never O(``n``) beyond it: a batch of 32 from 33,333 rows computes
        72 random words (more only if they hold fewer than 32 distinct rows), not a
        permutation of 33,333.  A client's result does not depend on
        the other clients of its block.
        """
        if self._scalar and type(n) is int and 0 < 2 * total < n < 2**32:  # one client, a batch of a large one
            sub = self._next_subkeys()[0]
            return self._out(_distinct_draws(sub, np.array([n], dtype=np.int64), np.array([total])), (total,))
        h = self._per_client(n, "n")
        if (h < 1).any() or (h >= 2**32).any():
            raise ValueError(f"ClientRNG.permutations: n must be in [1, 2**32); got {h.tolist()}")
        if total < 0:
            raise ValueError(f"ClientRNG.permutations: total must be >= 0; got {total}")
        sub = self._next_subkeys()[:, 0]
        rest = total % h
        drawn = np.where(2 * rest < h, rest, 0)  # the partial epoch's indices drawn without sorting
        sorted_len = total - drawn
        out = np.zeros((len(h), total), dtype=np.int64)
        # clients in order of size, in chunks whose [clients, epochs, n_max] sort stays below
        # PERMUTATION_ELEMENTS (a block mixing tiny and large clients would otherwise need
        # len(block) x epochs of the smallest x rows of the largest); results do not depend on it
        by_size = np.argsort(h, kind="stable") if len(h) > 1 else np.zeros(1, dtype=np.int64)
        by_size = by_size[sorted_len[by_size] > 0]
        start = 0
        while start < len(by_size):
            end = start + 1
            epochs = -(-int(sorted_len[by_size[start]]) // int(h[by_size[start]]))
            while end < len(by_size):
                epochs = max(epochs, -(-int(sorted_len[by_size[end]]) // int(h[by_size[end]])))
                if (end + 1 - start) * epochs * int(h[by_size[end]]) > PERMUTATION_ELEMENTS:
                    break
                end += 1
            rows = by_size[start:end]
            part = _permutation_rows(sub[rows], h[rows], sorted_len[rows])
            out[rows, : part.shape[1]] = part
            start = end
        if drawn.any():
            if (drawn == total).all():  # no full epoch (the usual case for batches of large clients)
                return self._out(_distinct_draws(sub, h, drawn), (total,))
            rows = np.nonzero(drawn)[0]
            tail = _distinct_draws(sub[rows], h[rows], drawn[rows])
            pos = np.arange(total)[None, :] - sorted_len[rows, None]  # position within the tail
            picked = np.take_along_axis(tail, np.clip(pos, 0, tail.shape[1] - 1), 1)
            out[rows] = np.where(pos >= 0, picked, out[rows])
        return self._out(out, (total,))

    def torch_generator(self) -> torch.Generator:
        """A ``torch.Generator`` seeded from this client's stream (one client only).

        For draws that need a torch sampling function this class lacks (``torch.multinomial``
        ...).  Draws made through it are reproducible but cannot be batched over a block.
        """
        if not self._scalar:
            raise TypeError("torch_generator() is for one client; index the block first (rng[i])")
        seed = int(self._raw(np.zeros((1,), dtype=np.uint64))[0, 0]) & ((1 << 63) - 1)
        return torch.Generator().manual_seed(seed)

    # -- helpers -------------------------------------------------------------------------------
    def _per_client(self, value: int | Tensor | Sequence[int], name: str) -> np.ndarray:
        """``value`` as an int64 array of shape ``(C,)`` (``(1,)`` for one client)."""
        arr = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"ClientRNG: {name} must be integers; got {arr.dtype}")
        arr = arr.astype(np.int64)
        if arr.ndim == 0:
            return np.full(len(self._keys), int(arr), dtype=np.int64)
        if arr.shape != self.batch_shape:
            raise ValueError(f"ClientRNG: {name} must be one int or have shape {self.batch_shape}; got {arr.shape}")
        return arr.reshape(-1)

    def __repr__(self) -> str:
        who = "1 client" if self._scalar else f"{len(self._keys)} clients"
        return f"ClientRNG({who}, calls={self._calls})"


def client_generator(seed: int, round: int, client: int | Sequence[int] | Tensor, stream: str = "update") -> ClientRNG:
    """The generator of ``client`` in ``round`` (rounds count from 0), or of a block of clients.

    ``client`` is one id (a single client's generator) or a sequence of ids (a block whose
    row ``i`` equals ``client_generator(seed, round, client[i])``).
    """
    base = _stream_key(int(seed), int(round), stream)
    if isinstance(client, (int, np.integer)) and not isinstance(client, bool):  # one client: Python ints
        return ClientRNG(np.uint64(_mix64_int(base + _GOLDEN * (int(client) + 1))))
    ids = client.detach().cpu().numpy() if isinstance(client, Tensor) else np.asarray(client)
    if ids.dtype.kind not in "iu" or ids.ndim > 1:
        raise ValueError(f"client must be an int or a 1-D sequence of ints; got {client!r}")
    keys = mix64(np.uint64(base) + np.uint64(_GOLDEN) * (ids.reshape(-1).astype(np.uint64) + np.uint64(1)))
    return ClientRNG(keys.reshape(ids.shape))
