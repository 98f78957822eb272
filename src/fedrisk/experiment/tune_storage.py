"""Where a ``fedrisk tune`` study lives: ``OUT/study.journal``, Optuna's journal storage (one
JSON line per change to the study), appended under a file lock that several worker processes
share and that a ``kill -9`` cannot leave behind; the study of an older fedrisk (``OUT/study.db``,
Optuna's SQLite storage) is copied into it on ``--resume``.

Example (a study written and read back; the file is a plain Optuna journal):
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> new_journal(out, lambda s: optuna_module().create_study(storage=s, study_name=STUDY_NAME))
    >>> study = optuna_module().load_study(study_name=STUDY_NAME, storage=journal_storage(out))
    >>> study.enqueue_trial({"x": 1.0})
    >>> has_study(out), len(study.trials), (out / STUDY_FILE).read_text().count("\\n")
    (True, 1, 2)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedrisk.errors import FedriskError

STUDY_FILE = "study.journal"
OLD_STUDY_FILE = "study.db"  # fedrisk before 2026-11-28 kept the study in Optuna's SQLite storage
JOURNAL_LOCK = ".journal.lock"
STUDY_NAME = "fedrisk"


def optuna_module() -> Any:
    """Optuna, imported on first use, quiet (warnings and experimental-feature notes off)."""
    try:
        import optuna
    except ImportError:  # pragma: no cover - a dependency of fedrisk
        raise FedriskError("fedrisk tune needs optuna (pip install 'optuna>=4,<6')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


@contextlib.contextmanager
def flock(path: Path, blocking: bool = True, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive (or ``shared``) ``flock`` on ``path`` (created if missing); the kernel
    releases it when the holder dies.  Not ``blocking``: a lock held elsewhere is an error."""
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            raise FedriskError(
                f"{path.parent} is in use by another fedrisk tune (or its worker processes); wait for it or stop it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def journal_backend(path: Path) -> Any:
    """Optuna's journal file backend on ``path``, appending without a sync to the disk: every
    change to the study is one JSON line, appended with one ``write`` under an exclusive
    ``flock`` on ``.journal.lock`` beside it (safe for several processes, and released by the
    kernel when a holder is killed, unlike Optuna's symlink and ``O_EXCL`` lock files, which a
    ``kill -9`` leaves behind for a 30 s grace period).  A killed process loses nothing it
    wrote (the operating system holds the pages); only a power cut could lose the last lines.
    Optuna's own ``append_logs`` syncs every line, about 20 ms on a busy disk for each
    reported evaluation.  A line cut short by a kill is dropped on resume (:func:`repair`)."""
    import json

    from optuna.storages.journal import JournalFileBackend

    class Journal(JournalFileBackend):
        def __init__(self, path: Path) -> None:
            super().__init__(str(path))  # reading is Optuna's (it tolerates a line being written)
            self.path, self.lock = path, path.parent / JOURNAL_LOCK

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
            with flock(self.lock):
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)

    return Journal(path)


RECORD_START = b'{"op_code":'  # how Optuna's JournalStorage begins every record


def repair(path: Path) -> int:
    """Drop what a process killed inside a ``write`` left of its record; returns how many
    records were cut short.  Called only while no process uses the study.  Optuna's reader
    skips a record cut short at the end, but the next record is appended to it on the same
    line (with several workers another one may have done so already), and Optuna cannot read
    that line: the complete record at its end is kept, the fragment before it dropped."""
    import json

    def complete(line: bytes) -> bool:
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False

    *lines, tail = path.read_bytes().split(b"\n")  # tail: b"" after a complete last line
    kept, cut = [], int(tail != b"")
    for number, line in enumerate(lines, start=1):
        if not complete(line):
            start = line.rfind(RECORD_START)
            if start <= 0 or not complete(line[start:]):
                raise FedriskError(
                    f"{path}: line {number} is not an Optuna journal record; restore the file or start again "
                    "with --overwrite"
                )
            line, cut = line[start:], cut + 1
        kept.append(line)
    if cut:
        tmp = path.with_name(f".{path.name}.repaired")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return cut


def journal_storage(out: Path) -> Any:
    """Optuna's ``JournalStorage`` on ``OUT/study.journal`` (see :func:`journal_backend`)."""
    return optuna_module().storages.JournalStorage(journal_backend(Path(out).resolve() / STUDY_FILE))


def new_journal(out: Path, fill: Callable[[Any], None]) -> None:
    """Write a study's journal under a temporary name and rename it into place, so that
    ``OUT/study.journal`` exists only once it holds the study (a tune killed while creating it
    leaves no half-made study for ``--resume`` to trip on)."""
    tmp = Path(out).resolve() / f".{STUDY_FILE}.new"
    tmp.unlink(missing_ok=True)
    fill(optuna_module().storages.JournalStorage(journal_backend(tmp)))
    os.replace(tmp, Path(out) / STUDY_FILE)


def migrate(out: Path, echo: Callable[[str], None]) -> None:
    """Copy the SQLite study of an older fedrisk (``OUT/study.db``) into ``OUT/study.journal``,
    every trial with its state, values, intermediate values and attributes, in the same order
    (a trial left running is recovered as any other).  ``study.db`` is only read (SQLite may
    fold a write-ahead log left by a killed tune into it) and left in place."""
    optuna = optuna_module()
    url = f"sqlite:///{(Path(out) / OLD_STUDY_FILE).resolve()}"
    try:
        old = optuna.storages.RDBStorage(url, skip_compatibility_check=True)
        optuna.load_study(study_name=STUDY_NAME, storage=old)
    except Exception as exc:  # any failure to read it is reported as such, on one line
        why = (str(exc).strip().splitlines() or [""])[0]
        raise FedriskError(
            f"{out / OLD_STUDY_FILE} (a study of an older fedrisk) cannot be read: {type(exc).__name__}: {why}"
        ) from None
    new_journal(out, lambda new: optuna.copy_study(from_study_name=STUDY_NAME, from_storage=old, to_storage=new))
    old.engine.dispose()
    echo(
        f"{OLD_STUDY_FILE} (an older fedrisk's SQLite study) copied to {STUDY_FILE}; {OLD_STUDY_FILE} is left in place"
    )


def has_study(out: Path) -> bool:
    """Whether ``out`` holds a tune's study (this version's journal or an older SQLite file)."""
    return (Path(out) / STUDY_FILE).is_file() or (Path(out) / OLD_STUDY_FILE).is_file()
