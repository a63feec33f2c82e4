"""Managing a directory of checkpoints (e.g. ``work_dir/checkpoints/``).

Finding them (:func:`list_checkpoints`, :func:`find_latest_checkpoint`), deleting
them (:func:`remove_checkpoint`, :func:`prune_checkpoints`) and tidying the hidden
scratch entries that saves of dead processes left behind (:func:`cleanup_stale_tmp`).
What a single checkpoint is, and how it is written and read, is
:mod:`treadle.checkpoint.io`; these functions are re-exported from there.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .durable import _SCRATCH_RE, _fsync_dir, _host_tag, _is_flat_dir, _scratch_name
from .io import LEGACY_SUFFIXES, MANIFEST_NAME, CheckpointError, CheckpointWarning, read_manifest, verify_checkpoint

__all__ = [
    "list_checkpoints", "find_latest_checkpoint", "remove_checkpoint", "prune_checkpoints", "cleanup_stale_tmp",
]

logger = logging.getLogger("treadle")

# Slack for clock granularity when comparing a scratch dir's mtime to a process start time.
_START_TIME_SLACK_S = 2.0


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, CheckpointWarning, stacklevel=3)


# ----------------------------------------------------------------------------- discovery


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Checkpoint dirs (with a manifest) in ``directory``, oldest to newest.

    Ordered by the manifest's ``meta["iter"]`` when every checkpoint has one,
    otherwise by creation time. Hidden scratch dirs and symlinks are ignored.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found: list[tuple[Any, float, str, Path]] = []
    for p in directory.iterdir():
        if p.name.startswith(".") or p.is_symlink() or not (p / MANIFEST_NAME).is_file():
            continue
        it: Any = None
        try:
            m = read_manifest(p)
            created = float(m.get("created", 0.0))
            it = m.get("meta", {}).get("iter")
        except CheckpointError:  # still listed: find_latest_checkpoint reports it
            created = (p / MANIFEST_NAME).stat().st_mtime
        if isinstance(it, bool) or not isinstance(it, int):
            it = None
        found.append((it, created, p.name, p))
    if all(f[0] is not None for f in found):
        found.sort(key=lambda f: (f[0], f[1], f[2]))
    else:
        found.sort(key=lambda f: (f[1], f[2]))
    return [f[3] for f in found]


def find_latest_checkpoint(directory: str | os.PathLike[str], verify: bool = True) -> Path | None:
    """Newest valid checkpoint in ``directory``, or None.

    Corrupt or partial checkpoints are skipped with a :class:`CheckpointWarning`
    (also logged on the ``treadle`` logger) naming the offending file. With
    ``verify=False`` only the manifest is checked, not the payload hashes.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for p in directory.iterdir():  # non-hidden dirs with payloads but no manifest
        if (not p.name.startswith(".") and p.is_dir() and not (p / MANIFEST_NAME).exists()
                and any(p.glob("*.pt"))):
            _warn(f"ignoring incomplete checkpoint {p}: {p / MANIFEST_NAME} is missing")
    for ckpt in reversed(list_checkpoints(directory)):
        try:
            verify_checkpoint(ckpt) if verify else read_manifest(ckpt)
        except CheckpointError as e:
            _warn(f"skipping checkpoint {ckpt}: {e}")
            continue
        return ckpt
    return None


# ----------------------------------------------------------------------------- removal


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete a checkpoint dir (or legacy file / symlink).

    The dir is first renamed to a hidden ``.name.del-*`` name so that a crash
    mid-delete never leaves a half-deleted dir that looks like a checkpoint.
    """
    path = Path(path)
    if path.is_symlink() or (path.is_file() and path.suffix in LEGACY_SUFFIXES + (".safetensors",)):
        path.unlink()
        return
    if not path.is_dir():
        raise CheckpointError(f"cannot remove {path}: not a checkpoint")
    if not _is_flat_dir(path):
        raise CheckpointError(f"refusing to remove {path}: it contains sub-directories, not a checkpoint")
    doomed = path.parent / _scratch_name(path.name, "del")
    os.rename(path, doomed)
    _fsync_dir(path.parent)
    shutil.rmtree(doomed)


def prune_checkpoints(
    directory: str | os.PathLike[str], keep_last: int, protect: Iterable[str | os.PathLike[str]] = ()
) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints, never touching ``protect``.

    Protected checkpoints (e.g. the best-K) do not count towards ``keep_last``.
    Returns the removed paths, oldest first.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, got {keep_last}")
    ckpts = list_checkpoints(directory)
    keep = set(ckpts[max(len(ckpts) - keep_last, 0):]) if keep_last else set()
    protected = {Path(p).resolve() for p in protect}
    removed = []
    for ckpt in ckpts:
        if ckpt in keep or ckpt.resolve() in protected:
            continue
        remove_checkpoint(ckpt)
        removed.append(ckpt)
    return removed


def _process_start_time(pid: int) -> float | None:
    """Wall-clock start time of ``pid`` (Linux /proc), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22: starttime
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                     if ln.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _owner_may_be_alive(pid: int, mtime: float) -> bool:
    if os.name != "posix":
        return True  # no cheap, safe liveness probe: assume alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    start = _process_start_time(pid)
    # A live pid that started after the dir was last touched is a reused pid
    # (common in containers after a restart), not the writer.
    return start is None or mtime >= start - _START_TIME_SLACK_S


def cleanup_stale_tmp(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove scratch dirs/files left by saves whose process died; returns what was removed.

    Conservative: only entries created on this host whose owning pid is gone, or
    whose pid now belongs to a process started after the entry was last modified.
    A stale ``old`` dir (crash between the two renames of a non-atomic replace)
    is renamed back to its checkpoint name when that name is free instead of deleted.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed: list[Path] = []
    host = _host_tag()
    for p in sorted(directory.iterdir(), key=lambda q: q.name):
        m = _SCRATCH_RE.match(p.name)
        if m is None or m["host"] != host or p.is_symlink():
            continue
        try:
            if _owner_may_be_alive(int(m["pid"]), p.stat().st_mtime):
                continue
        except FileNotFoundError:
            continue
        target = directory / m["name"]
        if m["kind"] == "old" and p.is_dir() and not os.path.lexists(target) and not m["name"].startswith("."):
            os.rename(p, target)
            _fsync_dir(directory)
            logger.warning("restored checkpoint %s from interrupted replace (%s)", target, p.name)
            continue
        logger.info("removing stale checkpoint scratch %s", p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
