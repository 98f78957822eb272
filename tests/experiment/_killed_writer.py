"""``python _killed_writer.py PHASE N -- fedrisk run arguments``: run the CLI, and SIGKILL this
process at ``PHASE`` of the ``N``-th checkpoint write (used by ``test_kill.py``).

Phases of :func:`fedrisk.experiment.checkpoint.write_checkpoint`:

* ``tmp_written``: the new file is complete in its temporary file (fsync'd), nothing renamed;
* ``prev_kept``: the current newest file is linked to ``checkpoint.pt.prev``, the new one not
  yet renamed over ``checkpoint.pt``;
* ``replaced``: the new file is in place, the directory not yet fsync'd;
* ``torn``: the new file's manifest line and half of its first payload block are written to
  the temporary file (a kill mid-write).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import fedrisk.experiment.checkpoint as ck
from fedrisk.cli import main


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillingOS:
    """``os`` for the checkpoint module, with the kill at the chosen phase of the chosen write."""

    def __init__(self, phase: str, nth: int) -> None:
        self.phase, self.nth, self.writes, self.replaces = phase, nth, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).endswith(".tmp"):  # the new file's fsync
            self.writes += 1
            self.replaces = 0
            if self.writes == self.nth and self.phase == "tmp_written":
                die()

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)
        if self.writes != self.nth:
            return
        self.replaces += 1
        kept = str(dst).endswith(".prev")
        if (self.phase == "prev_kept" and kept) or (self.phase == "replaced" and not kept):
            die()


class TornFile:
    """The new checkpoint file of the ``nth`` write: its first payload block is written half,
    then the process is killed (its manifest line, the first write, is complete)."""

    def __init__(self, fh: Any, torn: bool) -> None:
        self.fh, self.torn, self.calls = fh, torn, 0

    def __enter__(self) -> TornFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fh.close()

    def write(self, data: bytes) -> int:
        self.calls += 1
        if self.torn and self.calls == 2:
            self.fh.write(data[: len(data) // 2])
            self.fh.flush()
            die()
        return self.fh.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


if __name__ == "__main__":
    phase, nth, args = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
    if phase == "torn":
        real_fdopen = os.fdopen
        opened = [0]

        class TornOS(KillingOS):
            def fdopen(self, fd: int, *a: Any, **k: Any) -> TornFile:
                opened[0] += 1
                return TornFile(real_fdopen(fd, *a, **k), torn=opened[0] == nth)

        ck.os = TornOS("none", nth)
    else:
        ck.os = KillingOS(phase, nth)
    sys.exit(main(args))
