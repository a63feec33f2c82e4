"""Crash-safe file-system primitives used by treadle's checkpoint writers.

A checkpoint write counts as done only once it is on disk: files are fsynced (many at
once, in one round) and a new or renamed directory entry is durable only after its
parent dir is fsynced (both with :mod:`treadle.fsutil`, strictly). A finished directory is
published under its final name by one rename, or swapped with an existing one
atomically by Linux ``renameat2(RENAME_EXCHANGE)`` (:func:`_rename_exchange`).
Scratch entries are hidden siblings named after their owner's host and pid
(:func:`_scratch_name`, :data:`_SCRATCH_RE`). Files are hashed as they are written
(:class:`_HashingWriter`; past :data:`_READ_BACK_AFTER` bytes by a second thread reading
them back) or read back (:func:`_sha256_file`).

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
import threading
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


# Past this many bytes a file is hashed by a second thread that reads back what was
# written (from the page cache) while the writer goes on: SHA-256 runs at about 2 GB/s,
# 0.26 s of a 0.6 s save of 524 MB when done on the writing thread. Below it, inline:
# starting a thread costs more than hashing a few MB.
_READ_BACK_AFTER = 8 << 20


class _HashingWriter:
    """File-like wrapper hashing bytes as torch.save writes them.

    The first :data:`_READ_BACK_AFTER` bytes are hashed as they pass; the rest by a
    :class:`_ReadBackHasher` thread, which reads them back from the file (``pread`` on
    the same descriptor, so the file must be open for reading too: ``"x+b"``) as they
    are flushed. :meth:`hexdigest` gives the digest of all of it; :meth:`stop` ends the
    thread without one (a failed write). Either must be called before the file closes.

    ``size`` counts the bytes the file accepted. A failed write's OSError (ENOSPC, EIO,
    ...) is kept in ``error`` before it propagates: torch.save replaces it with a
    RuntimeError of its own (its zip writer then fails to finish the file), so the
    caller reads the cause here rather than from torch's message."""

    def __init__(self, f: Any, read_back_after: int | None = None) -> None:
        self._f, self._sha, self.size = f, hashlib.sha256(), 0
        self.error: OSError | None = None
        self._after: float = _READ_BACK_AFTER if read_back_after is None else read_back_after
        if not hasattr(os, "pread"):  # e.g. Windows: all of it inline
            self._after = float("inf")
        self._flushed = 0
        self.reader: _ReadBackHasher | None = None  # once past the threshold

    def _kept(self, call: Any, *args: Any) -> Any:
        """``call(*args)``, its OSError kept in ``error`` (the first one) before it propagates."""
        try:
            return call(*args)
        except OSError as e:
            if self.error is None:
                self.error = e
            raise

    def write(self, data: Any) -> int:
        n = self._kept(self._f.write, data)
        self.size += len(memoryview(data).cast("B"))
        if self.reader is None:
            self._sha.update(data)
            if self.size >= self._after:
                self.flush()
                self.reader = _ReadBackHasher(self._f.fileno(), self._sha, self.size)
        elif self.size - self._flushed >= _CHUNK:  # hand the reader what reached the OS
            self.flush()
            self.reader.advance(self._flushed)
        return n

    def flush(self) -> None:
        self._kept(self._f.flush)
        self._flushed = self.size

    def hexdigest(self) -> str:
        """The SHA-256 of every byte written (waits for the reading thread, raises its error)."""
        if self.reader is None:
            return self._sha.hexdigest()
        self.flush()
        return self.reader.finish(self.size)

    def stop(self) -> None:
        """End the reading thread, if any, without a digest."""
        if self.reader is not None:
            self.reader.stop()


class _ReadBackHasher:
    """A thread that goes on hashing, into ``sha``, the file open as descriptor ``fd``
    from offset ``start``, as far as the writer says it has flushed (:meth:`advance`)."""

    def __init__(self, fd: int, sha: Any, start: int) -> None:
        self._fd, self._sha, self._pos = fd, sha, start
        self._ready, self._done, self._abort = start, False, False
        self._cond = threading.Condition()
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="treadle-hash", daemon=True)
        self._thread.start()

    def advance(self, flushed: int, done: bool = False) -> None:
        with self._cond:
            self._ready, self._done = flushed, done
            self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._ready <= self._pos and not self._done:
                        self._cond.wait()
                    end, done = self._ready, self._done
                while self._pos < end and not self._abort:
                    # pread: the writer's file position is not moved; the GIL is free while
                    # it reads and while a large chunk is hashed.
                    chunk = os.pread(self._fd, min(_CHUNK, end - self._pos), self._pos)
                    if not chunk:
                        raise OSError(errno.EIO, f"read back {self._pos} of {end} bytes written")
                    self._sha.update(chunk)
                    self._pos += len(chunk)
                if done or self._abort:
                    return
        except OSError as e:
            self.error = e

    def finish(self, size: int) -> str:
        self.advance(size, done=True)
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self._sha.hexdigest()

    def stop(self) -> None:
        self._abort = True
        self.advance(self._ready, done=True)
        self._thread.join()


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
