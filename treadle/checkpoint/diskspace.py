"""How much room a checkpoint takes and how much the disk has: the figures of a
"disk full" error (:class:`treadle.checkpoint.io.CheckpointWriteError`).

Used only after a save failed, so nothing here is on the fast path. This module
imports nothing from treadle.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["saved_size", "files_on_disk", "free_space", "human_bytes"]


class _CountingSink:
    """A file-like object that keeps no bytes, only how far the file would extend."""

    def __init__(self) -> None:
        self.pos = self.end = 0

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        self.pos += n
        self.end = max(self.end, self.pos)
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.end}[whence]
        self.pos = base + offset
        self.end = max(self.end, self.pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass


def saved_size(obj: Any) -> int | None:
    """The size in bytes of the file ``torch.save(obj, f)`` writes, without writing it.

    torch's own ``serialization.skip_data`` mode (torch >= 2.5) runs torch.save with
    every record header but seeks over the tensor bytes instead of copying them, so the
    figure is exact (each storage counted once, as torch.save dedups them, plus the
    pickle and the zip records) and costs the pickling of the structure only. On an
    older torch: the pickle plus each distinct storage's bytes and a 64-byte-aligned
    record header (torch's layout), close to exact. None if neither works."""
    skip_data = getattr(torch.serialization, "skip_data", None)
    if skip_data is not None:
        try:
            sink = _CountingSink()
            with skip_data():
                torch.save(obj, sink)
            return sink.end
        except Exception:  # an estimate: fall back to counting storages
            pass
    try:
        return _storage_estimate(obj)
    except Exception:
        return None


def _storage_estimate(obj: Any) -> int:
    storages: dict[int, int] = {}

    class _Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:  # as torch.save: storages go beside the pickle
            if isinstance(o, torch.storage.TypedStorage):
                o = o._untyped_storage
            if torch.is_storage(o):
                storages.setdefault(o._cdata, o.nbytes())
                return ("storage", len(storages))
            return None

    sink = _CountingSink()
    _Pickler(sink, protocol=2).dump(obj)
    record = 64 + 64  # a local header (aligned to 64 bytes) and a central directory entry
    return sink.end + sum(n + record for n in storages.values()) + 8 * record


def files_on_disk(sizes: Iterable[int], path: str | os.PathLike[str]) -> int:
    """What files of these sizes, plus their directory, occupy on the file system
    holding ``path``: each rounded up to its allocation unit."""
    try:
        unit = os.statvfs(_existing(Path(path))).f_frsize or 4096
    except (AttributeError, OSError):  # no statvfs (Windows)
        unit = 4096
    return sum(-(-int(n) // unit) * unit for n in sizes) + unit


def _existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: str | os.PathLike[str]) -> tuple[int | None, Path]:
    """``(bytes free to this user, mount point)`` of the file system holding ``path``
    (or its nearest existing ancestor); free is None when it cannot be read."""
    where = _existing(Path(path))
    try:
        free: int | None = shutil.disk_usage(where).free
    except OSError:
        free = None
    mount = where
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return free, mount


def human_bytes(n: int) -> str:
    """``1234567`` -> ``'1.2 MB'`` (decimal units, as disk sizes are sold)."""
    if n < 1000:
        return f"{n} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        n /= 1000
        if n < 999.95 or unit == "PB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
