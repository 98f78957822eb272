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

A round's new states can be staged (:meth:`DiskClientStates.stage`, what the vectorised
executor does block by block): staged files are not yet states; ``store.update(store.staged(ks))``
renames them into place when the round is applied, and a round that is not applied leaves the
states as they were (its staged files are overwritten or removed later).

Checkpoints (:meth:`DiskClientStates.snapshot` / :meth:`DiskClientStates.restore`) never load
the states: a snapshot is a folder ``snapshots/<name>/`` of hard links to the current files (a
copy where the file system has no hard links), and its reference, which goes into the checkpoint,
holds the SHA-256 digest of every file (a per-file manifest).  A state is never rewritten in
place (a new file is renamed over the old name), so a later round leaves a snapshot's files
intact.  :meth:`restore` makes the folder's files those of the snapshot again (after checking
every digest), which is how a resumed run forgets what the rounds after its checkpoint wrote;
:meth:`prune` removes the snapshots no checkpoint refers to any more.

    >>> ref = store.snapshot()
    >>> store[1] = {"c": torch.full((2,), 7.0)}     # a round after the checkpoint
    >>> store.restore(ref)
    >>> store[1]["c"].tolist(), sorted(ref["sha256"])
    ([1.0, 1.0], [1])
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from fedrisk.errors import FedriskError
from fedrisk.tree import Tree

SNAPSHOTS = "snapshots"
"""The sub-folder of a store that holds its snapshots."""


def is_snapshot_ref(value: Any) -> bool:
    """True for what :meth:`DiskClientStates.snapshot` returns (a checkpoint's ``client_states``
    entry when the states live on disk), False for a dict of states."""
    return isinstance(value, dict) and value.get("store") == "disk" and "snapshot" in value


class DiskClientStates(MutableMapping[int, Tree]):
    """Clients ``0 .. num_clients - 1``; state of client ``k`` in ``folder/client-<k>.pt``.

    A new store starts from the initial states: state files already in ``folder`` (left by an
    earlier run) are removed; its snapshots are kept for :meth:`restore`.
    """

    def __init__(
        self,
        folder: str | Path,
        num_clients: int,
        initial: Callable[[int], Tree],
        device: str | torch.device = "cpu",
    ) -> None:
        self.folder = Path(folder)
        self.device = torch.device(device)  # where states are read to (the simulation's device)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.num_clients = int(num_clients)
        self.initial = initial
        self.files_written = 0
        self.digests: dict[int, str] = {}  # SHA-256 of every state file written (or restored)
        self._clear()

    def path(self, k: int) -> Path:
        return self.folder / f"client-{int(k)}.pt"

    def _check(self, k: int) -> int:
        k = int(k)
        if not 0 <= k < self.num_clients:
            raise KeyError(k)
        return k

    def _clear(self) -> None:
        for pattern in ("client-*.pt", ".client-*.tmp", ".client-*.staged"):
            for p in self.folder.glob(pattern):
                p.unlink()
        self.digests = {}
        self._staged: dict[int, str] = {}

    def __getitem__(self, k: int) -> Tree:
        k = self._check(k)
        if k not in self.digests:
            return self.initial(k)
        p = self.path(k)
        try:
            data = p.read_bytes()
            if hashlib.sha256(data).hexdigest() != self.digests[k]:
                raise ValueError("its SHA-256 digest differs from the one recorded when it was written")
            return torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
        except Exception as exc:
            raise FedriskError(f"cannot read the state of client {k} from {p}: {type(exc).__name__}: {exc}") from None

    def __setitem__(self, k: int, state: Tree) -> None:
        k = self._check(k)
        self.digests[k] = self._write(k, state, self.path(k))  # a new file: snapshots keep linking the old one
        self._staged.pop(k, None)
        self.files_written += 1

    def _write(self, k: int, state: Tree, target: Path) -> str:
        """Write ``state`` to ``target`` atomically (temporary file + rename); its SHA-256."""
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        fd, tmp = tempfile.mkstemp(prefix=f".client-{k}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return hashlib.sha256(data).hexdigest()

    # -- a round's new states, staged until the round is applied -----------------------------
    def staged_path(self, k: int) -> Path:
        return self.folder / f".client-{int(k)}.staged"

    def stage(self, k: int, state: Tree) -> None:
        """Write client ``k``'s new state to a staged file, which is not yet its state: an
        executor stages each block's new states as the block finishes, so that a round never
        holds every participant's new state in memory; :meth:`update` with :meth:`staged`
        applies them (renames), and a round that is not applied leaves the states as they were."""
        k = self._check(k)
        self._staged[k] = self._write(k, state, self.staged_path(k))

    def staged(self, clients: Iterable[int]) -> StagedStates:
        """The staged new states of ``clients`` as a mapping (read from disk on access) that
        :meth:`update` applies by renaming the files."""
        return StagedStates(self, [int(k) for k in clients])

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        if isinstance(other, StagedStates) and other.store is self and not kwargs:
            for k in other.clients:
                os.replace(self.staged_path(k), self.path(k))  # a new file: snapshots keep the old one
                self.digests[k] = self._staged.pop(k)
                self.files_written += 1
            return
        super().update(other, **kwargs)

    def __delitem__(self, k: int) -> None:
        raise TypeError("client states cannot be deleted")

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_clients))

    def __len__(self) -> int:
        return self.num_clients

    def nbytes_on_disk(self) -> int:
        """Bytes of every state file written so far."""
        return sum(p.stat().st_size for p in self.folder.glob("client-*.pt"))

    # -- checkpoints ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Link the current state files into a new ``snapshots/<name>/`` and return its
        reference ``{"store": "disk", "snapshot": name, "sha256": {client: digest}}`` (plain
        data, for the checkpoint).  Nothing is loaded; the folder appears complete or not at all."""
        name = f"snap-{uuid.uuid4().hex[:16]}"
        root = self.folder / SNAPSHOTS
        tmp = root / f".{name}.tmp"
        tmp.mkdir(parents=True)
        for k in sorted(self.digests):
            _link_or_copy(self.path(k), tmp / self.path(k).name)
        os.replace(tmp, root / name)
        return {"store": "disk", "snapshot": name, "sha256": dict(sorted(self.digests.items()))}

    def restore(self, ref: dict[str, Any]) -> None:
        """Make the state files those of the snapshot ``ref`` (every digest checked first)."""
        problem = snapshot_problem(self.folder, ref)
        if problem is not None:
            raise FedriskError(problem)
        for k in ref["sha256"]:
            self._check(int(k))
        snap = self.folder / SNAPSHOTS / str(ref["snapshot"])
        digests = {int(k): str(v) for k, v in ref["sha256"].items()}
        self._clear()
        for k in digests:
            _link_or_copy(snap / self.path(k).name, self.path(k))
        self.digests = digests

    def snapshots(self) -> list[str]:
        """The names of the complete snapshots in the folder."""
        root = self.folder / SNAPSHOTS
        return sorted(p.name for p in root.glob("snap-*") if p.is_dir()) if root.is_dir() else []

    def prune(self, keep: Iterable[str]) -> None:
        """Remove every snapshot (and unfinished one) not named in ``keep``."""
        root = self.folder / SNAPSHOTS
        if not root.is_dir():
            return
        keep = set(keep)
        for p in root.iterdir():
            if p.is_dir() and p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)


class StagedStates(Mapping[int, Tree]):
    """A round's new client states staged on disk by :meth:`DiskClientStates.stage` (read on
    access, digest checked); ``store.update(staged)`` applies them."""

    def __init__(self, store: DiskClientStates, clients: list[int]) -> None:
        missing = [k for k in clients if k not in store._staged]
        if missing:
            raise KeyError(f"clients {missing} have no staged state")
        self.store, self.clients = store, clients

    def __getitem__(self, k: int) -> Tree:
        if k not in self.clients:
            raise KeyError(k)
        p = self.store.staged_path(k)
        data = p.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.store._staged[k]:
            raise FedriskError(f"the staged new state of client {k} ({p}) changed on disk")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)

    def __iter__(self) -> Iterator[int]:
        return iter(self.clients)

    def __len__(self) -> int:
        return len(self.clients)


def snapshot_problem(folder: str | Path, ref: dict[str, Any]) -> str | None:
    """None when every file of the snapshot ``ref`` in the store ``folder`` is there with the
    SHA-256 digest the checkpoint recorded, else what is wrong (the first missing, truncated or
    altered file, by client and path).  Reads each file once, block by block; loads nothing.

    Example:
        >>> import tempfile, torch
        >>> store = DiskClientStates(tempfile.mkdtemp(), 2, initial=lambda k: {"c": torch.zeros(1)})
        >>> store[1] = {"c": torch.ones(1)}
        >>> ref = store.snapshot()
        >>> snapshot_problem(store.folder, ref) is None
        True
        >>> (store.folder / SNAPSHOTS / ref["snapshot"] / "client-1.pt").unlink()
        >>> snapshot_problem(store.folder, ref).endswith("client-1.pt) is missing")
        True
    """
    folder = Path(folder)
    name = str(ref.get("snapshot"))
    if not re.fullmatch(r"snap-[0-9a-f]{1,64}", name):  # a name from a file: never a path elsewhere
        return f"the checkpoint names its client states {name!r}, which is not a snapshot name (snap-<hex>)"
    snap = folder / SNAPSHOTS / name
    if not snap.is_dir():
        return (
            f"the checkpoint's client states {snap} are missing; they live in the run directory's "
            f"{folder.name}/{SNAPSHOTS} folder (resume in the run directory that wrote the checkpoint)"
        )
    try:
        digests = sorted((int(k), str(v)) for k, v in ref["sha256"].items())
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"the checkpoint's reference to its client states in {snap} is malformed (no client -> SHA-256 table)"
    for k, digest in digests:
        p = snap / f"client-{k}.pt"
        if not p.is_file():
            return f"the checkpoint's state of client {k} ({p}) is missing"
        if _sha256_file(p) != digest:
            return f"the checkpoint's state of client {k} ({p}) is corrupted (its SHA-256 differs from the manifest's)"
    return None


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # no hard links on this file system
        shutil.copyfile(src, dst)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
