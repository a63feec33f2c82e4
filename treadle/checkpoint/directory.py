"""Managing a directory of checkpoints (e.g. ``work_dir/checkpoints/``).

Finding them (:func:`list_checkpoints`, :func:`find_latest_checkpoint`), deleting
them (:func:`remove_checkpoint`, :func:`prune_checkpoints`) and tidying the hidden
scratch entries that saves of dead processes left behind (:func:`cleanup_stale_tmp`).
What a single checkpoint is, and how it is written and read, is
:mod:`treadle.checkpoint.io` (which re-exports these functions) and, for the format and
verifying, :mod:`treadle.checkpoint.manifest`: this module imports only the latter.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from treadle.fsutil import fsync_dir, new_dirs, sync_later

from .durable import _SCRATCH_RE, _host_tag, _scratch_name
from .manifest import (LEGACY_SUFFIXES, MANIFEST_NAME, CheckpointError, CheckpointWarning, _not_a_checkpoint_reason,
                       read_manifest, verify_checkpoint)

__all__ = [
    "CHECKPOINTS", "list_checkpoints", "find_latest_checkpoint", "remove_checkpoint", "prune_checkpoints",
    "cleanup_stale_tmp", "checkpoint_run", "claim_checkpoint_path", "remove_own_checkpoint", "check_writable_dir",
    "make_checkpoint_dir", "saved_note", "check_resume_dir",
]

#: A run's checkpoints: ``work_dir/checkpoints/<name>``.
CHECKPOINTS = "checkpoints"

logger = logging.getLogger("treadle")

# Slack for clock granularity when comparing a scratch dir's mtime to a process start time.
_START_TIME_SLACK_S = 2.0


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, CheckpointWarning, stacklevel=3)


# ----------------------------------------------------------------------------- discovery


def list_checkpoints(directory: str | os.PathLike[str], order: str = "iter") -> list[Path]:
    """Checkpoint dirs (with a manifest) in ``directory``, oldest to newest.

    ``order="iter"``: by the manifest's ``meta["iter"]`` when every checkpoint has one,
    otherwise by creation time. ``order="created"``: by creation time (the manifest's
    ``created``), i.e. the order they were saved in, whatever their iterations; the
    Trainer uses it, so that a run started again from an earlier point, or a new run
    in the same directory, counts its own saves as the newest. Hidden scratch dirs and
    symlinks are ignored.
    """
    if order not in ("iter", "created"):
        raise ValueError(f"order={order!r}; expected 'iter' or 'created'")
    return [f.path for f in _scan(Path(directory), order)]


@dataclass(frozen=True)
class _Found:
    iter: int | None
    created: float
    run: str | None
    path: Path


def _scan(directory: Path, order: str) -> list[_Found]:
    if not directory.is_dir():
        return []
    found: list[_Found] = []
    for p in directory.iterdir():
        if p.name.startswith(".") or _not_a_checkpoint_reason(p) is not None:  # e.g. another tool's manifest.json
            continue
        it: Any = None
        run: Any = None
        try:
            m = read_manifest(p)
            created = float(m.get("created", 0.0))
            meta = m.get("meta", {})
            it, run = meta.get("iter"), meta.get("run")
        except CheckpointError:  # still listed: find_latest_checkpoint reports it
            try:
                created = (p / MANIFEST_NAME).stat().st_mtime
            except FileNotFoundError:  # pruned by a live run while we looked: not there
                continue
        if isinstance(it, bool) or not isinstance(it, int):
            it = None
        found.append(_Found(it, created, run if isinstance(run, str) else None, p))
    if order == "iter" and all(f.iter is not None for f in found):
        found.sort(key=lambda f: (f.iter, f.created, f.path.name))
    else:
        found.sort(key=lambda f: (f.created, f.path.name))
    return found


def find_latest_checkpoint(directory: str | os.PathLike[str], verify: bool = True,
                           order: str = "iter", exclude: Iterable[Path] = (),
                           warn: Callable[[str], None] | None = None) -> Path | None:
    """Newest valid checkpoint in ``directory`` (``order`` as in :func:`list_checkpoints`), or None.

    Corrupt or partial checkpoints are skipped with a :class:`CheckpointWarning`
    (also logged on the ``treadle`` logger) naming the offending file. With
    ``verify=False`` only the manifest is checked, not the payload hashes.
    ``exclude``: checkpoints not to consider (ones already found unloadable). ``warn``:
    where each skip is said instead (once: no CheckpointWarning then), e.g. a logger's
    ``warning`` that already prints to the console.
    """
    say = warn or _warn
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for p in directory.iterdir():  # non-hidden dirs with payloads but no manifest
        if (not p.name.startswith(".") and p.is_dir() and not (p / MANIFEST_NAME).exists()
                and any(p.glob("*.pt"))):
            say(f"ignoring incomplete checkpoint {p}: {p / MANIFEST_NAME} is missing")
    excluded = {Path(p) for p in exclude}
    for ckpt in reversed(list_checkpoints(directory, order)):
        if ckpt in excluded:
            continue
        try:
            verify_checkpoint(ckpt) if verify else read_manifest(ckpt)
        except (CheckpointError, OSError) as e:
            if not ckpt.exists():  # pruned by a live run while it was read: the next newest
                continue
            say(f"skipping checkpoint {ckpt}: {e}")
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
    reason = _not_a_checkpoint_reason(path)
    if reason is not None and not _partial_checkpoint(path):
        raise CheckpointError(f"refusing to remove {path}: {reason}, so it is not a treadle checkpoint")
    doomed = path.parent / _scratch_name(path.name, "del")
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed)


def checkpoint_run(path: str | os.PathLike[str]) -> str | None:
    """The run that saved the checkpoint at ``path`` (its manifest's ``meta["run"]``), or
    None: no such checkpoint, not a treadle checkpoint, or saved without a run id."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return None
    try:
        run = read_manifest(path).get("meta", {}).get("run")
    except (CheckpointError, OSError):
        return None
    return run if isinstance(run, str) else None


def claim_checkpoint_path(path: str | os.PathLike[str], run: str, rename: bool = True) -> Path:
    """Where run ``run`` may save the checkpoint it would call ``path``.

    ``path`` itself when nothing is there, or when it holds a checkpoint that ``run``
    saved (a run replaces only its own). Anything else there (another run's checkpoint,
    one saved without a run id, a symlink, a file, a directory of another tool) is never
    replaced: with ``rename``, the first free (or own) name among ``<name>-v1``,
    ``<name>-v2``, ... is returned instead; without, a :class:`CheckpointError` says
    what holds the name.
    """
    path = Path(path)
    candidate, n = path, 0
    while os.path.lexists(candidate) and checkpoint_run(candidate) != run:
        if not rename:
            owner = checkpoint_run(candidate)
            what = (f"a checkpoint of another run ({owner})" if owner else "a symlink" if candidate.is_symlink()
                    else "a checkpoint saved without a run id" if _is_checkpoint(candidate) else "something that "
                    "is not a treadle checkpoint")
            raise CheckpointError(f"refusing to save to {candidate}: it holds {what}, and a run replaces only "
                                  "its own checkpoints; save under another name")
        n += 1
        candidate = path.with_name(f"{path.name}-v{n}")
    return candidate


def _is_checkpoint(path: Path) -> bool:
    return not path.is_symlink() and path.is_dir() and _not_a_checkpoint_reason(path) is None


def remove_own_checkpoint(path: str | os.PathLike[str], run: str, within: str | os.PathLike[str]) -> None:
    """Delete the checkpoint at ``path`` only if run ``run`` saved it and it lies directly
    inside ``within`` (symlinks resolved); otherwise raise :class:`CheckpointError` and
    touch nothing. For paths that come from restored state (best-K records), which are
    input like any other: a record must never make a run delete what it did not write."""
    path, within = Path(path), Path(within)
    if path.is_symlink() or path.resolve().parent != within.resolve():
        raise CheckpointError(f"not removing {path}: it is not a checkpoint directly inside {within}")
    owner = checkpoint_run(path)
    if owner != run:
        what = f"run {owner}" if owner else "no recorded run"
        raise CheckpointError(f"not removing {path}: it was saved by {what}, not by this run ({run})")
    remove_checkpoint(path)


def check_writable_dir(directory: str | os.PathLike[str]) -> None:
    """Prove that a checkpoint can be written in ``directory`` without creating it: a
    hidden scratch dir is made and removed in it or, when it does not exist yet, in its
    nearest existing parent. So a run finds out before training, not at its first save.
    Raises :class:`CheckpointError` naming the obstacle."""
    directory = Path(directory)
    existing = _existing(directory)
    try:
        probe = existing / _scratch_name("probe", "tmp")
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        raise _cannot_write(directory, e, existing) from None


DIRS_GROUP = "checkpoint dirs"  # the fsync jobs of make_checkpoint_dir


def make_checkpoint_dir(directory: str | os.PathLike[str]) -> None:
    """Before a run trains: ``directory`` exists and can take a checkpoint, or a
    :class:`CheckpointError` names the obstacle. An existing one is probed
    (:func:`check_writable_dir`); a missing one is created, which proves it. The fsyncs
    that make the new entries durable run on the fsync threads while the run trains,
    and every checkpoint's commit waits for them (``settle(DIRS_GROUP)`` in
    ``io._install``)."""
    directory = Path(directory)
    if directory.is_dir():
        check_writable_dir(directory)
        return
    existing = _existing(directory)
    try:
        created = new_dirs(directory)
    except OSError as e:
        raise _cannot_write(directory, e, existing) from None
    for d in created:
        sync_later(functools.partial(fsync_dir, d.parent), group=DIRS_GROUP)


def _cannot_write(directory: Path, error: OSError, existing: Path) -> CheckpointError:
    return CheckpointError(f"checkpoints cannot be written to {directory}: {error.strerror or error} (in {existing})")


def _existing(directory: Path) -> Path:
    """The nearest existing one of ``directory`` and its parents: it must be a directory."""
    existing = next((p for p in (directory, *directory.parents) if os.path.lexists(p)), Path("."))
    if not existing.is_dir():
        raise CheckpointError(f"checkpoints cannot be written to {directory}: {existing} is not a directory")
    return existing


def _partial_checkpoint(path: Path) -> bool:
    """Payloads of a save that never wrote its manifest (``find_latest_checkpoint`` warns
    about these): files of the kinds a save writes, and nothing else."""
    files = list(path.iterdir()) if path.is_dir() and not path.is_symlink() else []
    return bool(files) and not (path / MANIFEST_NAME).exists() and all(
        f.is_file() and (f.suffix in (".pt", ".distcp") or f.name == ".metadata") for f in files)


def prune_checkpoints(
    directory: str | os.PathLike[str], keep_last: int, protect: Iterable[str | os.PathLike[str]] = (),
    run: str | None = None, order: str = "iter",
) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints, never touching ``protect``.

    Protected checkpoints (e.g. the best-K) do not count towards ``keep_last``.
    ``run``: only checkpoints whose manifest says ``meta["run"] == run`` count and may
    be removed; any other (an earlier run's, one without a run) is left alone. ``order``
    as in :func:`list_checkpoints`. Returns the removed paths, oldest first.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, got {keep_last}")
    if order not in ("iter", "created"):
        raise ValueError(f"order={order!r}; expected 'iter' or 'created'")
    if keep_last and _entries(Path(directory)) <= keep_last:
        return []  # at most keep_last candidates: all are kept (no manifest read)
    ckpts = [f.path for f in _scan(Path(directory), order) if run is None or f.run == run]
    keep = set(ckpts[max(len(ckpts) - keep_last, 0):]) if keep_last else set()
    protected = {Path(p).resolve() for p in protect}
    removed = []
    for ckpt in ckpts:
        if ckpt in keep or ckpt.resolve() in protected:
            continue
        remove_checkpoint(ckpt)
        removed.append(ckpt)
    return removed


def _entries(directory: Path) -> int:
    """How many entries of ``directory`` are not hidden: at least its checkpoints."""
    try:
        with os.scandir(directory) as entries:
            return sum(1 for e in entries if not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return 0


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
            fsync_dir(directory)
            logger.warning("restored checkpoint %s from interrupted replace (%s)", target, p.name)
            continue
        logger.info("removing stale checkpoint scratch %s", p)
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def saved_note(work_dir: str | os.PathLike[str]) -> str:
    """What a failure leaves saved in ``work_dir``, as a failure's line says it (this
    process reads, nothing collective): ``the last checkpoint, <path>, is intact; nothing
    after it was saved``, or that there is none. A listed checkpoint is complete: each is
    written aside and renamed into place whole."""
    try:
        saved = list_checkpoints(Path(work_dir) / CHECKPOINTS, order="created")
    except OSError:
        saved = []
    if not saved:
        return f"no checkpoint was saved in {work_dir}"
    return f"the last checkpoint, {saved[-1]}, is intact; nothing after it was saved"


def check_resume_dir(path: Path, what: str = "resume") -> None:
    """A directory given as ``resume=`` must be one checkpoint, not a run or a checkpoints
    dir. ``what``: how the caller names it, "resume" (the argument) or "--resume" (the
    command line's option)."""
    if not path.is_dir() or (path / MANIFEST_NAME).is_file():
        return
    inside = [*list_checkpoints(path, order="created"), *list_checkpoints(path / "checkpoints", order="created")]
    named = f"--resume {path}" if what == "--resume" else f"{what}={str(path)!r}"
    latest = "--resume alone, with that run's --work-dir" if what == "--resume" else "resume=True with the run's work_dir"
    hint = f"; it holds checkpoints: pass one (the last saved is {inside[-1]}), or {latest}" if inside else ""
    raise FileNotFoundError(f"{named} is a directory but not a checkpoint (it has no {MANIFEST_NAME}){hint}")
