"""Safe, checked checkpoint files: a SHA-256 manifest in every file, the previous good file
kept, loading that never executes code.

A checkpoint file is three parts::

    b"FEDRISK-CHECKPOINT\\n"                 magic line
    {"sha256": ..., "bytes": ..., ...}\\n     manifest: one JSON line
    <payload>                                 torch.save of plain containers and tensors

The manifest holds the SHA-256 digest and the length of the payload, the checkpoint format and
the round.  :func:`write_checkpoint` writes the new file to a temporary file (``fsync``), keeps
the current newest file as ``<name>.prev`` (a hard link, or a copy where the file system has
none, renamed into place) and renames the temporary file over ``<name>``: a process killed at
any instant (``kill -9`` included) leaves a complete newest file and a complete previous file.

:func:`read_checkpoint` checks the magic line, the length and the digest *before* it unpickles
anything, then unpickles with ``torch.load(weights_only=True)``: only tensors, numbers,
strings and plain containers can come out, and a file whose pickle names any other callable
(a crafted ``__reduce__``) is refused with :class:`UnsafeCheckpointError` without running it.
A digest only detects accidents (truncation, bit flips); the restricted unpickler is what makes
a file from elsewhere safe to read.  :func:`load_newest` tries ``<name>`` and then
``<name>.prev`` and warns which file was bad and why.

The NumPy and Python global generator states are not plain data in their own types (NumPy's is
a tuple holding an array); :func:`pack_global_rng` / :func:`unpack_global_rng` turn them into
tensors and ints and back.

Example:
    >>> import tempfile, warnings
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "checkpoint.pt"
    >>> write_checkpoint(path, {"round": 1, "w": torch.ones(2)}, round=1)
    >>> write_checkpoint(path, {"round": 2, "w": torch.zeros(2)}, round=2)
    >>> read_checkpoint(path)["round"], read_checkpoint(previous_path(path))["round"]
    (2, 1)
    >>> data = path.read_bytes()
    >>> _ = path.write_bytes(data[: len(data) - 10])  # a truncated newest file
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     state, used = load_newest(path)
    >>> state["round"], used.name, "truncated" in str(caught[0].message)
    (1, 'checkpoint.pt.prev', True)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrisk.errors import FedriskError

MAGIC = b"FEDRISK-CHECKPOINT\n"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 1 << 16
LEGACY_PREFIXES = (b"PK\x03\x04", b"\x80")  # torch.save's zip file, a bare pickle


class CheckpointError(FedriskError):
    """A checkpoint file cannot be used (missing, truncated, corrupted, not a checkpoint)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file names code to run while loading; it was refused, nothing ran."""


class CheckpointWarning(UserWarning):
    """The newest checkpoint was bad and an older one is used."""


def previous_path(path: str | Path) -> Path:
    """Where the previous good checkpoint of ``path`` is kept (``checkpoint.pt.prev``)."""
    p = Path(path)
    return p.with_name(p.name + ".prev")


# ----------------------------------------------------------------------------- writing


def encode(payload: Any, **manifest: Any) -> bytes:
    """Magic line + manifest line (SHA-256 and length of the payload, plus ``manifest``) + payload."""
    out = io.BytesIO()
    write_encoded(out, payload, **manifest)
    return out.getvalue()


BLOCK = 1 << 20
"""Bytes read or copied at a time: a checkpoint is hashed and copied as a stream, so that
writing or reading it never holds a second copy of the states in memory."""


def write_encoded(fh: Any, payload: Any, **manifest: Any) -> None:
    """Write what :func:`encode` returns to the binary file ``fh``, streaming: ``torch.save``
    into an unnamed temporary file, hashed and copied block by block after the manifest line."""
    with tempfile.TemporaryFile() as body:
        torch.save(payload, body)
        length = body.tell()
        body.seek(0)
        digest = hashlib.sha256()
        for block in iter(lambda: body.read(BLOCK), b""):
            digest.update(block)
        head = {"version": MANIFEST_VERSION, "sha256": digest.hexdigest(), "bytes": length, **manifest}
        fh.write(MAGIC + json.dumps(head, sort_keys=True).encode() + b"\n")
        body.seek(0)
        for block in iter(lambda: body.read(BLOCK), b""):
            fh.write(block)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not possible on every platform (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _link_atomically(source: Path, target: Path) -> None:
    """Make ``target`` the file ``source`` is (a hard link, or a copy where the file system has
    none), replacing ``target`` atomically; ``source`` stays in place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    os.unlink(tmp)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # no hard links here: copy
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def replace_with_previous(path: str | Path) -> None:
    """Make ``path`` the previous checkpoint ``<path>.prev`` again (atomically; a hard link, or a
    copy).  For a newest file that is whole but unusable (its client-state snapshot is damaged):
    afterwards the next :func:`write_checkpoint` keeps the good previous file, not the unusable one."""
    path = Path(path)
    _link_atomically(previous_path(path), path)
    _fsync_dir(path.parent)


def write_checkpoint(path: str | Path, payload: Any, **manifest: Any) -> None:
    """Write ``payload`` to ``path`` with its manifest; the file there before becomes
    ``<path>.prev`` (only when it is itself a valid checkpoint: a corrupted newest file never
    replaces a good previous one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write_encoded(fh, payload, **manifest)
            fh.flush()
            os.fsync(fh.fileno())
        if path.is_file() and verify(path) is None:
            _link_atomically(path, previous_path(path))  # the current file becomes <path>.prev
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- reading


def _check(path: Path, fh: Any) -> tuple[dict[str, Any], int]:
    """The manifest and the payload's offset in the open file ``fh``, checked (length and
    SHA-256, streaming); raises CheckpointError naming the reason."""
    start = fh.read(len(MAGIC))
    if start != MAGIC:
        if len(start) < len(MAGIC) and MAGIC.startswith(start):
            raise CheckpointError(f"{path} is truncated ({len(start)} bytes)")
        raise CheckpointError(f"{path} is not a fedrisk checkpoint (it does not start with {MAGIC[:-1].decode()!r})")
    line = fh.readline(MAX_MANIFEST_BYTES)
    if not line.endswith(b"\n"):
        raise CheckpointError(f"{path} is truncated or corrupted (no complete manifest line)")
    try:
        head = json.loads(line)
        digest, length = str(head["sha256"]), int(head["bytes"])
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path} is corrupted (its manifest line is not valid)") from None
    offset = len(MAGIC) + len(line)
    actual_length = os.fstat(fh.fileno()).st_size - offset
    if actual_length < length:
        raise CheckpointError(f"{path} is truncated: {actual_length} of {length} payload bytes")
    if actual_length > length:
        raise CheckpointError(f"{path} is corrupted: {actual_length - length} bytes more than its manifest says")
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(BLOCK), b""):
        h.update(block)
    actual = h.hexdigest()
    if actual != digest:
        raise CheckpointError(
            f"{path} is corrupted: SHA-256 {actual[:12]}... differs from its manifest's {digest[:12]}..."
        )
    return head, offset


class _Window(io.RawIOBase):
    """The bytes of ``fh`` from ``offset`` on, as a seekable file (torch.load reads the payload
    in place: no copy of it in memory)."""

    def __init__(self, fh: Any, offset: int) -> None:
        self.fh, self.offset = fh, offset
        self.fh.seek(offset)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.fh.readinto(buffer)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos += self.offset
        return self.fh.seek(pos, whence) - self.offset

    def tell(self) -> int:
        return self.fh.tell() - self.offset


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest line of checkpoint ``path`` (read without the payload; not checked against
    it); ``{}`` when the file is missing or has no readable manifest.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "checkpoint.pt"
        >>> write_checkpoint(path, {"w": torch.ones(1)}, round=3)
        >>> read_manifest(path)["round"], read_manifest(path.with_name("missing.pt"))
        (3, {})
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC) + MAX_MANIFEST_BYTES)
    except OSError:
        return {}
    end = head.find(b"\n", len(MAGIC))
    if not head.startswith(MAGIC) or end < 0:
        return {}
    try:
        manifest = json.loads(head[len(MAGIC) : end])
    except ValueError:
        return {}
    return manifest if isinstance(manifest, dict) else {}


def verify(path: str | Path) -> str | None:
    """None when ``path`` is a complete checkpoint whose digest matches, else the reason."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            _check(path, fh)
    except CheckpointError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    return None


def safe_unpickle(path: Path, body: Any) -> Any:
    """``torch.load(weights_only=True)`` of ``body`` (bytes or a binary file): tensors and plain
    containers only; anything else is refused."""
    try:
        return torch.load(io.BytesIO(body) if isinstance(body, bytes) else body, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln or "Unsupported global" in ln]
        if not lines:
            raise CheckpointError(f"cannot read checkpoint {path}: it is corrupted ({type(exc).__name__})") from None
        raise UnsafeCheckpointError(
            f"refused to load {path}: it holds objects other than tensors, numbers, strings and plain "
            f"containers, which could run code when loaded ({lines[0]}). Nothing from it was executed; "
            "only load checkpoints written by fedrisk"
        ) from None
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}: {exc}") from None


def read_checkpoint(path: str | Path) -> Any:
    """The payload of ``path``, checked against its manifest and unpickled safely.

    A file without the magic line (written by fedrisk before manifests existed) is read with the
    same restricted unpickler, without a digest to check.
    """
    path = Path(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below; open's error named here)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    with fh:
        start = fh.read(len(MAGIC))
        fh.seek(0)
        if start != MAGIC and start.startswith(LEGACY_PREFIXES):
            return safe_unpickle(path, fh.read())  # written before manifests existed: restricted, unchecked
        _, offset = _check(path, fh)
        return safe_unpickle(path, _Window(fh, offset))


def load_newest(path: str | Path, check: Callable[[Any], str | None] | None = None) -> tuple[Any, Path]:
    """``(payload, file used)``: ``path`` if it is good, else ``<path>.prev`` with a
    :class:`CheckpointWarning` naming what was wrong with ``path``.

    ``check(payload)`` may name what else a checkpoint needs and lacks (None when all is there;
    for instance damaged client-state files on disk that the payload refers to): a file whose
    payload fails it counts as bad like a damaged file.

    A refused (unsafe) file is never skipped silently: the error is raised even when an older
    file exists, since someone replaced the checkpoint.  When no file is good, the
    :class:`CheckpointError` names every file tried and why it failed.

    Example:
        >>> import tempfile, warnings
        >>> path = Path(tempfile.mkdtemp()) / "checkpoint.pt"
        >>> write_checkpoint(path, {"round": 1}, round=1)
        >>> write_checkpoint(path, {"round": 2}, round=2)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     state, used = load_newest(path, check=lambda p: "lost its states" if p["round"] == 2 else None)
        >>> state["round"], used.name, str(caught[0].message).split(";")[0]
        (1, 'checkpoint.pt.prev', 'lost its states')
    """
    path = Path(path)
    reasons = []
    for candidate in (path, previous_path(path)):
        if not candidate.exists():
            reasons.append(f"{candidate} does not exist")
            continue
        try:
            payload = read_checkpoint(candidate)
        except UnsafeCheckpointError:
            raise
        except CheckpointError as exc:
            reasons.append(str(exc))
            continue
        problem = check(payload) if check is not None else None
        if problem is not None:
            reasons.append(problem)
            continue
        if candidate != path:
            warnings.warn(
                f"{reasons[0]}; resuming from the previous checkpoint {candidate} instead",
                CheckpointWarning,
                stacklevel=2,
            )
        return payload, candidate
    raise CheckpointError("no usable checkpoint: " + "; ".join(reasons))


# ----------------------------------------------------------------------------- global generators


def pack_global_rng() -> dict[str, Any]:
    """The torch (CPU, and CUDA once initialised), NumPy and Python global generator states as
    tensors, ints and strings."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(version), "internal": list(internal), "gauss": gauss},
    }


def unpack_global_rng(state: dict[str, Any]) -> None:
    """Restore what :func:`pack_global_rng` packed (older checkpoints held NumPy's own tuple)."""
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    npy = state["numpy"]
    if isinstance(npy, dict):
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    else:
        np.random.set_state(npy)
    py = state["python"]
    if isinstance(py, dict):
        random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    else:
        random.setstate(py)
