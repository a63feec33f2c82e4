"""Crash-safe file-system primitives used by treadle's checkpoint writers.

A checkpoint write counts as done only once it is on disk: files are fsynced (many at
once, in one round) and a new or renamed directory entry is durable only after its
parent dir is fsynced (both with :mod:`treadle.fsutil`, strictly). A finished directory is
published under its final name by one rename, or swapped with an existing one
atomically by Linux ``renameat2(RENAME_EXCHANGE)`` (:func:`_rename_exchange`).
Scratch entries are hidden siblings named after their owner's host and pid
(:func:`_scratch_name`, :data:`_SCRATCH_RE`). Files are hashed as they are written
(:class:`_HashingWriter`) or read back (:func:`_sha256_file`).

This module knows nothing about the checkpoint format (that is
:mod:`treadle.checkpoint.io`) and imports nothing from treadle.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
_SCRATCH_RE = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8,})$"
)


def _host_tag() -> str:
    # Without re.sub: compiling its pattern cost 0.1 ms at a process's first save.
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def _scratch_name(name: str, kind: str) -> str:
    # Host and pid let cleanup_stale_tmp decide whether the owner can still be alive.
    return f".{name}.{kind}-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


class _HashingWriter:
    """File-like wrapper hashing bytes as torch.save writes them (no second read pass).

    ``size`` counts the bytes the file accepted. A failed write's OSError (ENOSPC, EIO,
    ...) is kept in ``error`` before it propagates: torch.save replaces it with a
    RuntimeError of its own (its zip writer then fails to finish the file), so the
    caller reads the cause here rather than from torch's message."""

    def __init__(self, f: Any) -> None:
        self._f, self.sha256, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            n = self._f.write(data)
        except OSError as e:
            if self.error is None:
                self.error = e
            raise
        self.sha256.update(data)
        self.size += len(memoryview(data).cast("B"))
        return n

    def flush(self) -> None:
        self._f.flush()


def _is_flat_dir(path: Path) -> bool:
    """Checkpoint dirs contain only files; refuse to replace/delete anything else."""
    return path.is_dir() and not path.is_symlink() and all(not p.is_dir() for p in path.iterdir())


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


_RENAME_EXCHANGE = 2
_renameat2: Any = None


def _rename_exchange(src: Path, dst: Path) -> bool:
    """Atomically swap ``src`` and ``dst`` (Linux renameat2). False when unsupported."""
    global _renameat2
    if not sys.platform.startswith("linux"):
        return False
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (AttributeError, OSError):
            fn = False
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2 = fn
    if _renameat2 is False:
        return False
    at_fdcwd = -100
    if _renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(dst))
