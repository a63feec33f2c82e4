"""Atomic, verified checkpoint storage.

A checkpoint is a directory (e.g. ``work_dir/checkpoints/iter_000120/``) holding
payload files written with :func:`torch.save` and a ``manifest.json`` written
last. The manifest records the format version, the creation time, caller
``meta`` and the size and sha256 of every payload, so a reader can tell a
complete checkpoint from a partial or damaged one before unpickling anything.

Payloads are always read back with ``torch.load(..., weights_only=True)``:
tensors and plain containers only, never arbitrary code.

Hidden siblings named ``.<name>.<kind>-<host>-<pid>-<token>`` are scratch space
of this module (``tmp``: a save in progress, ``old``: a checkpoint moved aside
while being replaced, ``del``: a checkpoint being deleted). They are never
listed as checkpoints; :func:`cleanup_stale_tmp` tidies the ones left by
processes that died.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import logging
import os
import pickle
import re
import secrets
import shutil
import socket
import sys
import threading
import time
import warnings
import zipfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "FORMAT_VERSION", "MANIFEST_NAME", "STATE_FILE",
    "CheckpointError", "CorruptCheckpointError", "UnsafeCheckpointError", "CheckpointWarning",
    "save_checkpoint", "check_save_args", "load_checkpoint", "read_manifest", "verify_checkpoint",
    "is_valid_checkpoint", "list_checkpoints", "find_latest_checkpoint",
    "remove_checkpoint", "prune_checkpoints", "cleanup_stale_tmp",
]

logger = logging.getLogger("treadle")

FORMAT = "treadle-checkpoint"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
STATE_FILE = "state.pt"  # main payload; a legacy single-file checkpoint is returned under this name
LEGACY_SUFFIXES = (".pt", ".pth")
_CHUNK = 1 << 20
_SCRATCH_RE = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old|del)-(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8,})$"
)
# Slack for clock granularity when comparing a scratch dir's mtime to a process start time.
_START_TIME_SLACK_S = 2.0


class CheckpointError(RuntimeError):
    """Base class of every checkpoint error raised by treadle."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is incomplete, truncated or its bytes differ from its manifest."""


class UnsafeCheckpointError(CheckpointError):
    """A payload holds objects that the weights-only unpickler refuses to build."""


class CheckpointWarning(UserWarning):
    """Emitted when a checkpoint is skipped (e.g. a corrupt one while searching the latest)."""


# ----------------------------------------------------------------------------- helpers


def _warn(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, CheckpointWarning, stacklevel=3)


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:32] or "host"


def _scratch_name(name: str, kind: str) -> str:
    # Host and pid let cleanup_stale_tmp decide whether the owner can still be alive.
    return f".{name}.{kind}-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


def _fsync_dir(path: Path) -> None:
    """fsync a directory so that renames/creations inside it survive a power loss."""
    if not hasattr(os, "O_DIRECTORY"):  # e.g. Windows: directories cannot be fsynced
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems do not support fsync on directories
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


class _HashingWriter:
    """File-like wrapper hashing bytes as torch.save writes them (no second read pass)."""

    def __init__(self, f: Any) -> None:
        self._f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        self.size += len(memoryview(data).cast("B"))
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def _write_durably(path: Path, obj: Any = None, data: bytes | None = None, fsync: bool = True) -> dict[str, Any]:
    """Write ``data`` or ``torch.save(obj)`` to ``path``, fsync it, return size and sha256.

    ``fsync=False`` leaves the fsync to the caller (see :func:`_fsync_all`)."""
    with open(path, "xb") as f:
        w = _HashingWriter(f)
        if data is not None:
            w.write(data)
        else:
            torch.save(obj, w)
        f.flush()
        if fsync:
            os.fsync(f.fileno())  # data must be on disk before the manifest claims it is
        if os.fstat(f.fileno()).st_size != w.size:
            raise CheckpointError(f"{path}: wrote {w.size} bytes but file has a different size")
    return {"size": w.size, "sha256": w.sha256.hexdigest()}


_fsync_pool: ThreadPoolExecutor | None = None
_fsync_pool_lock = threading.Lock()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # fsync flushes the file, whatever the descriptor's mode
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(files: Iterable[Path], dirs: Iterable[Path] = ()) -> None:
    """fsync files and directories, all at once; returns when every one is durable.

    Why concurrently: each fsync waits for a journal commit (ext4, xfs), and fsyncs
    issued together share one, so N files cost about one commit instead of N (a
    quarter of the time for three files here). The first error is raised after all finished.
    """
    global _fsync_pool
    jobs = [functools.partial(_fsync_path, p) for p in files] + [functools.partial(_fsync_dir, d) for d in dirs]
    if len(jobs) == 1:
        jobs[0]()
        return
    with _fsync_pool_lock:
        if _fsync_pool is None:
            _fsync_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="treadle-fsync")
        futures = [_fsync_pool.submit(job) for job in jobs]
    errors = [f.exception() for f in futures]  # waits for each
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


# Hidden names that a checkpoint may still hold: torch.distributed.checkpoint's own
# metadata file, in the sharded checkpoints of treadle.checkpoint.sharded.
FOREIGN_FILE_NAMES = frozenset({".metadata"})


def _check_payload_name(name: Any) -> str:
    if name in FOREIGN_FILE_NAMES:
        return name
    if (
        not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".")
        or "/" in name or "\\" in name or "\0" in name or name == MANIFEST_NAME
    ):
        raise ValueError(
            f"invalid checkpoint payload name {name!r}: use a plain file name such as "
            f"'state.pt' (no '/', '\\', '..', leading '.', or {MANIFEST_NAME!r})"
        )
    return name


def _is_flat_dir(path: Path) -> bool:
    """Checkpoint dirs contain only files; refuse to replace/delete anything else."""
    return path.is_dir() and not path.is_symlink() and all(not p.is_dir() for p in path.iterdir())


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- saving

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


def _install(tmp: Path, path: Path) -> None:
    """Move the finished ``tmp`` dir to ``path``, replacing an existing checkpoint safely.

    Replacement prefers an atomic exchange (``renameat2(RENAME_EXCHANGE)``): ``path``
    names a complete old checkpoint until the instant it names the complete new one.
    Without it we rename the old one aside (``.name.old-*``), rename the new one in,
    then delete the old one; a crash between the two renames leaves the old checkpoint
    in the aside dir, and :func:`cleanup_stale_tmp` renames it back.
    """
    parent = path.parent
    if not os.path.lexists(path):
        os.rename(tmp, path)
        _fsync_dir(parent)
        return
    if not _is_flat_dir(path):
        raise CheckpointError(f"refusing to replace {path}: it is not a checkpoint directory")
    if _rename_exchange(tmp, path):
        _fsync_dir(parent)
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old checkpoint
        return
    aside = parent / _scratch_name(path.name, "old")
    os.rename(path, aside)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)  # put the old checkpoint back before reporting the failure
        raise
    _fsync_dir(parent)
    shutil.rmtree(aside, ignore_errors=True)


def check_save_args(
    path: str | os.PathLike[str], payloads: Mapping[str, Any], meta: Mapping[str, Any] | None
) -> tuple[Path, list[str], dict[str, Any]]:
    """What :func:`save_checkpoint` checks before writing anything: ``(path, payload
    names, meta as JSON)``, or a ValueError/TypeError/CheckpointError."""
    path = Path(path)
    if not path.name or path.name.startswith("."):
        raise ValueError(f"invalid checkpoint path {path}: its name must not be empty or start with '.'")
    if not payloads:
        raise ValueError("save_checkpoint needs at least one payload")
    names = [_check_payload_name(n) for n in payloads]
    try:  # fail before writing anything if meta cannot go into the manifest
        meta_json = json.loads(json.dumps(dict(meta or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint meta must be JSON-serialisable: {e}") from e
    if os.path.lexists(path) and not _is_flat_dir(path):
        raise CheckpointError(f"refusing to replace {path}: it is not a checkpoint directory")
    return path, names, meta_json


def save_checkpoint(
    path: str | os.PathLike[str], payloads: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> Path:
    """Atomically write a checkpoint directory at ``path``.

    Each payload is ``torch.save``-d into a hidden temp dir next to ``path`` and
    ``manifest.json`` is written last; every file and the dir are fsynced (together, in
    one round), then the dir is renamed onto ``path`` and the parent is fsynced. An existing checkpoint at ``path`` is replaced
    so that a complete old or new one is always findable (see ``_install``). On error
    the temp dir is removed and the exception re-raised; other checkpoints are untouched.

    :class:`treadle.checkpoint.async_save.AsyncCheckpointer` does the same from a
    background thread, after copying the state to CPU memory on the caller's.
    """
    path, names, meta_json = check_save_args(path, payloads, meta)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        _fsync_dir(path.parent.parent)  # make the new checkpoints/ dir itself durable
    tmp = path.parent / _scratch_name(path.name, "tmp")
    tmp.mkdir()
    try:
        files = {name: _write_durably(tmp / name, obj=payloads[name], fsync=False) for name in names}
        now = time.time()
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": now,
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
            "torch_version": torch.__version__,
            "meta": meta_json,
            "files": files,
        }
        _write_durably(tmp / MANIFEST_NAME, data=json.dumps(manifest, indent=2).encode(), fsync=False)
        # The rename in _install is the commit: until it, no reader looks inside the hidden
        # tmp dir (a crash leaves it to cleanup_stale_tmp). So the payloads, the manifest and
        # the dir's entries need only be durable before it, and are fsynced in one round.
        _fsync_all([*(tmp / name for name in names), tmp / MANIFEST_NAME], dirs=[tmp])
        _install(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


# ----------------------------------------------------------------------------- reading


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and sanity-check ``manifest.json`` of a checkpoint dir (no payload hashing)."""
    mpath = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(mpath.read_bytes())
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"{mpath}: missing - incomplete checkpoint (a save that never finished?)"
        ) from None
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{mpath}: unreadable or invalid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptCheckpointError(f"{mpath}: not a treadle checkpoint manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{mpath}: format version {version!r} is not supported (this treadle reads <= {FORMAT_VERSION})"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("meta", {}), dict):
        raise CorruptCheckpointError(f"{mpath}: malformed 'files'/'meta' entries")
    for name, entry in files.items():
        try:
            _check_payload_name(name)  # never follow a path out of the checkpoint dir
        except ValueError as e:
            raise CorruptCheckpointError(f"{mpath}: {e}") from None
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise CorruptCheckpointError(f"{mpath}: malformed entry for {name!r}")
    return manifest


def _verify_file(directory: Path, name: str, entry: Mapping[str, Any]) -> None:
    fpath = directory / name
    try:
        size = fpath.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{fpath}: listed in the manifest but missing") from None
    if size != entry["size"]:
        raise CorruptCheckpointError(
            f"{fpath}: size is {size} bytes but the manifest says {entry['size']} (truncated or overwritten)"
        )
    digest = _sha256_file(fpath)
    if digest != entry["sha256"]:
        raise CorruptCheckpointError(
            f"{fpath}: sha256 mismatch (bytes changed on disk): expected {entry['sha256']}, got {digest}"
        )


def verify_checkpoint(path: str | os.PathLike[str]) -> None:
    """Check a checkpoint's manifest and every payload's size and sha256.

    For a legacy single file this checks the CRCs of its zip records, when it is one.
    Raises :class:`CorruptCheckpointError` (or :class:`CheckpointError`) on failure.
    """
    path = Path(path)
    if path.is_file():
        _verify_legacy_file(path)
        return
    if not path.is_dir():
        raise CorruptCheckpointError(f"{path}: no such checkpoint")
    manifest = read_manifest(path)
    for name, entry in manifest["files"].items():
        _verify_file(path, name, entry)


def is_valid_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True when :func:`verify_checkpoint` passes."""
    try:
        verify_checkpoint(path)
    except (CheckpointError, OSError):
        return False
    return True


def _verify_legacy_file(path: Path) -> None:
    # torch's zip format stores a CRC32 per record: the best integrity check available
    # without a manifest. Old non-zip pickles cannot be checked.
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: damaged zip archive ({e})") from e
    if bad is not None:
        raise CorruptCheckpointError(f"{path}: CRC mismatch in record {bad!r}")


def _torch_reason(message: str) -> str:
    message = re.sub(r"\x1b\[[0-9;]*m", "", message)
    if "WeightsUnpickler error:" in message:
        message = message.rsplit("WeightsUnpickler error:", 1)[1]
    return message.split("Check the documentation of torch.load")[0].strip()


def _load_weights_only(fpath: Path, map_location: Any, verified: bool) -> Any:
    try:
        return torch.load(fpath, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        note = "" if verified else " (the file was not hash-verified, so it may also be corrupt)"
        raise UnsafeCheckpointError(
            f"{fpath}: refused to load. treadle loads only tensors and plain containers "
            f"(torch.load weights_only=True); nothing in the file was executed{note}. "
            f"torch's reason: {_torch_reason(str(e))}"
        ) from None
    except Exception as e:
        if verified:  # bytes match the manifest: not disk corruption (e.g. bad map_location)
            raise CheckpointError(f"{fpath}: torch.load failed: {e}") from e
        raise CorruptCheckpointError(f"{fpath}: truncated or unreadable ({type(e).__name__}: {e})") from e


def load_checkpoint(
    path: str | os.PathLike[str],
    files: Iterable[str] | None = None,
    map_location: Any = "cpu",
    verify: bool = True,
) -> dict[str, Any]:
    """Load payloads of a checkpoint as ``{file name: object}``.

    With ``verify`` each requested file's size and sha256 are checked against the
    manifest before unpickling. ``files`` selects a subset (default: all). Loading
    always uses ``torch.load(weights_only=True)``; there is no unsafe fallback.

    ``path`` may also be a legacy single ``.pt``/``.pth`` file written by
    ``torch.save``: it has no manifest, so only its zip CRCs are checked; the
    object is returned under :data:`STATE_FILE` (``"state.pt"``).
    """
    path = Path(path)
    wanted = None if files is None else [files] if isinstance(files, str) else [str(f) for f in files]
    if path.is_file():
        if wanted is not None and wanted != [STATE_FILE]:
            raise CheckpointError(f"{path}: a single-file checkpoint only has {STATE_FILE!r}, asked for {wanted}")
        if verify:
            _verify_legacy_file(path)
        return {STATE_FILE: _load_weights_only(path, map_location, verified=False)}
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint")
    manifest = read_manifest(path)
    names = list(manifest["files"]) if wanted is None else wanted
    out: dict[str, Any] = {}
    for name in names:
        if name not in manifest["files"]:
            raise CheckpointError(f"{path}: no payload {name!r}; it has {sorted(manifest['files'])}")
        if verify:
            _verify_file(path, name, manifest["files"][name])
        out[name] = _load_weights_only(path / name, map_location, verified=verify)
    return out


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
