"""Client states on disk: one file per client, so that a federation of many clients with
per-client state (SCAFFOLD's and CODASCA's control variates, local models) runs in memory
bounded by the clients of one round, not by the federation.

:class:`DiskClientStates` is a ``MutableMapping[int, Tree]`` that the simulation uses in place of
its dict of client states (``Simulation(..., client_store=FOLDER)``).  A client that has never
taken part has no file: its state is its initial state, made on demand by ``initial(k)``
(``Algorithm.init_client``), so nothing is written for it.  A state is written atomically
(temporary file + rename) with ``torch.save`` and read back with ``torch.load(weights_only=True)``
(tensors and plain containers only: nothing in the folder can run code).  Only the states the
executors touch in a round are in memory at a time.

Example:
    >>> import tempfile, torch
    >>> store = DiskClientStates(tempfile.mkdtemp(), 3, initial=lambda k: {"c": torch.zeros(2)})
    >>> store[1] = {"c": torch.ones(2)}
    >>> store[0]["c"].tolist(), store[1]["c"].tolist(), len(store), sorted(store)
    ([0.0, 0.0], [1.0, 1.0], 3, [0, 1, 2])
    >>> store.files_written
    1
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path

import torch

from fedrisk.errors import FedriskError
from fedrisk.tree import Tree


class DiskClientStates(MutableMapping[int, Tree]):
    """Clients ``0 .. num_clients - 1``; state of client ``k`` in ``folder/client-<k>.pt``."""

    def __init__(self, folder: str | Path, num_clients: int, initial: Callable[[int], Tree]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.num_clients = int(num_clients)
        self.initial = initial
        self.files_written = 0

    def path(self, k: int) -> Path:
        return self.folder / f"client-{int(k)}.pt"

    def _check(self, k: int) -> int:
        k = int(k)
        if not 0 <= k < self.num_clients:
            raise KeyError(k)
        return k

    def __getitem__(self, k: int) -> Tree:
        k = self._check(k)
        p = self.path(k)
        if not p.is_file():
            return self.initial(k)
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise FedriskError(f"cannot read the state of client {k} from {p}: {type(exc).__name__}: {exc}") from None

    def __setitem__(self, k: int, state: Tree) -> None:
        k = self._check(k)
        fd, tmp = tempfile.mkstemp(prefix=f".client-{k}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(state, fh)
            os.replace(tmp, self.path(k))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.files_written += 1

    def __delitem__(self, k: int) -> None:
        raise TypeError("client states cannot be deleted")

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_clients))

    def __len__(self) -> int:
        return self.num_clients

    def nbytes_on_disk(self) -> int:
        """Bytes of every state file written so far."""
        return sum(p.stat().st_size for p in self.folder.glob("client-*.pt"))
