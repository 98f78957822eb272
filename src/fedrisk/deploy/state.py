"""Durable client state on a SuperNode: a node-local store keyed by experiment and client id.

Flower's ``Context.state`` lives in memory, per run and per process; fedrisk's client states
(SCAFFOLD / CODASCA control variates, PERM's personal weights, FeDXL's pools) must survive a
SuperNode restart.  The store keeps one checkpoint file per (experiment, client)::

    ROOT/<experiment>/client-<id>.pt        the state after the newest round the node finished
    ROOT/<experiment>/client-<id>.pt.prev   the one before

written with :func:`fedrisk.experiment.checkpoint.write_checkpoint` (SHA-256 manifest, atomic
rename, the previous good file kept) and read with :func:`~fedrisk.experiment.checkpoint.load_newest`
(the restricted unpickler: a file from elsewhere cannot run code; a damaged newest file falls
back to the previous one with a warning).  ``experiment`` is the config fingerprint
(:func:`fedrisk.deploy.handshake.fingerprint`), so a node serving another config never reads
this one's states.

Example:
    >>> import tempfile, torch
    >>> store = ClientStateStore(tempfile.mkdtemp())
    >>> store.load("3f2a", 0) is None           # a fresh node
    True
    >>> store.save("3f2a", 0, 4, {"c": torch.ones(2)})
    >>> ClientStateStore(store.root).load("3f2a", 0)   # after a restart
    (4, {'c': tensor([1., 1.])})
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fedrisk.errors import FedriskError
from fedrisk.experiment.checkpoint import CheckpointError, load_newest, previous_path, read_checkpoint, write_checkpoint

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ClientStateStore:
    """Client states on a node's disk under ``root``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, experiment: str, client: int) -> Path:
        """The file of ``client``'s state in ``experiment``."""
        if not isinstance(experiment, str) or not _SAFE.fullmatch(experiment):
            raise FedriskError(
                f"experiment id {experiment!r} cannot name a directory; allowed: letters, digits, '_', '.', '-' "
                "(not starting with '.' or '-')"
            )
        if isinstance(client, bool) or not isinstance(client, int) or client < 0:
            raise FedriskError(f"client id {client!r} is not allowed; allowed: an integer >= 0")
        return self.root / experiment / f"client-{client}.pt"

    def save(self, experiment: str, client: int, round: int, state: Any) -> None:
        """Keep ``state``, the client's state after ``round`` (atomically; the previous file is kept)."""
        payload = {"experiment": experiment, "client": client, "round": round, "state": state}
        write_checkpoint(self.path(experiment, client), payload, round=round, client=client)

    def load(self, experiment: str, client: int) -> tuple[int, Any] | None:
        """``(round, state)`` of the newest good file, or None when the node never kept one."""
        path = self.path(experiment, client)
        if not path.exists() and not previous_path(path).exists():
            return None
        payload, used = load_newest(path)
        if payload.get("experiment") != experiment or payload.get("client") != client:
            raise FedriskError(
                f"{used} holds the state of client {payload.get('client')!r} of experiment "
                f"{payload.get('experiment')!r}, not client {client} of {experiment!r}; remove the file"
            )
        return int(payload["round"]), payload["state"]

    def load_before(self, experiment: str, client: int, round: int) -> tuple[int, Any] | None:
        """``(round, state)`` of the newest kept state from a round before ``round`` (the newest file
        or the previous one), or None: what a node starts from when ``round`` is sent again (after
        a restart, the node may have finished it without its reply reaching the server).

        Example:
            >>> import tempfile
            >>> store = ClientStateStore(tempfile.mkdtemp())
            >>> store.save("e", 0, 3, "after 3"); store.save("e", 0, 4, "after 4")
            >>> store.load_before("e", 0, 4), store.load_before("e", 0, 5), store.load_before("e", 0, 2)
            ((3, 'after 3'), (4, 'after 4'), None)
        """
        path = self.path(experiment, client)
        for candidate in (path, previous_path(path)):
            if not candidate.exists():
                continue
            try:
                payload = read_checkpoint(candidate)
            except CheckpointError:
                continue
            if payload.get("experiment") == experiment and payload.get("client") == client and payload["round"] < round:
                return int(payload["round"]), payload["state"]
        return None

    def state_before(self, experiment: str, client: int, round: int) -> tuple[int, Any] | None:
        """What ``round`` starts from when the node already kept a state of ``round`` or later (a
        round sent again after a restart, or a server resumed from its checkpoint): the kept state
        of a round before ``round``; None when the client took part in no round before (only one
        state kept); a :class:`FedriskError` when both kept states are from ``round`` or later (the
        server resumed from further back than the node keeps: deployed runs checkpoint every round).

        Example:
            >>> import tempfile
            >>> store = ClientStateStore(tempfile.mkdtemp())
            >>> store.save("e", 0, 5, "after 5")
            >>> store.state_before("e", 0, 5) is None    # round 5 was the client's first
            True
            >>> store.save("e", 0, 6, "after 6")
            >>> store.state_before("e", 0, 6)
            (5, 'after 5')
            >>> store.state_before("e", 0, 5)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            fedrisk.errors.FedriskError: client 0 of e: the node keeps its states after rounds 6 and 5, none ...
        """
        before = self.load_before(experiment, client, round)
        path = self.path(experiment, client)
        if before is None and path.exists() and previous_path(path).exists():
            rounds = []
            for candidate in (path, previous_path(path)):
                try:
                    rounds.append(str(read_checkpoint(candidate)["round"]))
                except (CheckpointError, KeyError):
                    rounds.append("?")
            raise FedriskError(
                f"client {client} of {experiment}: the node keeps its states after rounds {' and '.join(rounds)}, "
                f"none from before round {round}; resume the run from a later checkpoint (or start it again)"
            )
        return before

    def discard_newest(self, experiment: str, client: int) -> None:
        """Forget the newest kept state (before saving the state of a round sent again, so that the
        state before that round stays the previous one)."""
        self.path(experiment, client).unlink(missing_ok=True)
