"""Atomic, verified checkpoint storage.

A checkpoint is a directory (e.g. ``work_dir/checkpoints/iter_000120/``) holding
payload files written with :func:`torch.save` and a ``manifest.json`` written
last. The manifest records the format version, the creation time, caller
``meta`` and the size and sha256 of every payload, so a reader can tell a
complete checkpoint from a partial or damaged one before unpickling anything.

Payloads are always read back with ``torch.load(..., weights_only=True)``:
tensors and plain containers only, never arbitrary code.

Hidden siblings named ``.<name>.<kind>-<host>-<pid>-<token>`` are scratch space
of treadle's checkpoint code (``tmp``: a save in progress, ``old``: a checkpoint moved aside
while being replaced, ``del``: a checkpoint being deleted). They are never
listed as checkpoints; :func:`cleanup_stale_tmp` tidies the ones left by
processes that died.

The low-level durable writes are in :mod:`treadle.fsutil` (fsync rounds) and
:mod:`treadle.checkpoint.durable` (atomic rename/exchange, scratch names); the format,
the base errors and reading and verifying a manifest in :mod:`treadle.checkpoint.manifest`;
listing, finding, pruning and cleaning up a directory of checkpoints in
:mod:`treadle.checkpoint.directory`. The last two are re-exported here
(``from treadle.checkpoint.io import find_latest_checkpoint``).
"""

from __future__ import annotations

import errno as _errno
import json
import os
import pickle
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from treadle.fsutil import FsyncRound, fsync_dir, new_dirs, settle

from .directory import (
    DIRS_GROUP,
    _process_start_time,  # noqa: F401 (tests/checkpoint/test_io.py reads it from here)
    cleanup_stale_tmp,
    find_latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    remove_checkpoint,
)
from .durable import (  # sharded.py, weights.py and tests import some of these from here
    _HashingWriter,
    _host_tag,  # noqa: F401 (tests/checkpoint/test_io.py reads it from here)
    _rename_exchange,
    _scratch_name,
)
from .manifest import (  # sharded.py, weights.py, dcp_safe.py and tests import these from here
    FOREIGN_FILE_NAMES,
    FORMAT,
    FORMAT_VERSION,
    LEGACY_SUFFIXES,
    MANIFEST_NAME,
    STATE_FILE,
    CheckpointError,
    CheckpointWarning,
    CorruptCheckpointError,
    _check_payload_name,
    _not_a_checkpoint_reason,
    _verify_file,
    _verify_legacy_file,
    link_note,
    new_manifest,
    read_manifest,
    refuse_link,
    verify_checkpoint,
)

__all__ = [
    "FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "STATE_FILE", "LEGACY_SUFFIXES", "FOREIGN_FILE_NAMES",
    "CheckpointError", "CorruptCheckpointError", "UnsafeCheckpointError", "UnreadableCheckpointError",
    "CheckpointWriteError", "CheckpointWarning",
    "save_checkpoint", "check_save_args", "load_checkpoint", "read_manifest", "verify_checkpoint",
    "list_checkpoints", "find_latest_checkpoint",
    "remove_checkpoint", "prune_checkpoints", "cleanup_stale_tmp",
]


class UnreadableCheckpointError(CheckpointError):
    """A payload of a checkpoint (which may have verified) that ``torch.load`` cannot
    read: ``resume=True`` falls back from such a checkpoint to the previous verified one."""


class UnsafeCheckpointError(UnreadableCheckpointError):
    """A payload holds objects that the weights-only unpickler refuses to build."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written: the disk is full, or another OS error (EIO,
    EROFS, EDQUOT, EACCES, ...) in a write, fsync, mkdir or rename of the save.

    The save's scratch dir is removed before this is raised; whatever was at ``path``
    before and every other checkpoint are untouched. The message is one line.

    Attributes:
        path: the checkpoint directory that was being saved.
        errno, strerror: the OS error's number and text (``errno.ENOSPC``, "No space left on device").
        filename: the checkpoint file being written or synced (``"state.pt"``,
            ``"manifest.json"``, a DCP shard), or None when the step was on a directory.
        operation: the failing step, e.g. ``"writing state.pt"``, ``"creating the directory /x"``.
        needed, free: for ENOSPC, the bytes the whole checkpoint takes (estimated:
            the payloads as ``torch.save`` lays them out, each file rounded up to the file
            system's allocation unit) and the bytes free, measured after the scratch dir
            was removed, on the file system mounted at ``mount``; else None.
        asynchronous: raised for a background save (by the next save, ``wait`` or ``close``).
    """

    def __init__(self, path: str | os.PathLike[str], errno: int | None, strerror: str | None,
                 filename: str | None = None, operation: str = "writing", needed: int | None = None,
                 free: int | None = None, mount: str | os.PathLike[str] | None = None,
                 asynchronous: bool = False) -> None:
        self.path, self.errno, self.strerror = Path(path), errno, strerror or (os.strerror(errno) if errno else "")
        self.filename, self.operation, self.needed, self.free = filename, operation, needed, free
        self.mount, self.asynchronous = (None if mount is None else Path(mount)), asynchronous
        super().__init__(self._message())

    def _message(self) -> str:
        from .diskspace import human_bytes

        name = _errno.errorcode.get(self.errno) if self.errno is not None else None
        reason = f"[Errno {self.errno}] {self.strerror}" + (f" ({name})" if name else "")
        space = ""
        if self.errno == _errno.ENOSPC and self.free is not None:
            needs = f"it needs about {human_bytes(self.needed)}, " if self.needed is not None else ""
            space = f"; {needs}{human_bytes(self.free)} free on {self.mount}"
        kind = "asynchronous checkpoint save" if self.asynchronous else "checkpoint save"
        return (f"{kind} to {self.path} failed while {self.operation}: {reason}{space}; "
                "the unfinished save was removed, earlier checkpoints are intact")

    def __reduce__(self) -> Any:  # pickled across ranks (sharded saves): rebuilt from the fields
        return (type(self), (self.path, self.errno, self.strerror, self.filename, self.operation, self.needed,
                             self.free, self.mount, self.asynchronous))

    def as_asynchronous(self) -> "CheckpointWriteError":
        """The same error, saying it happened in a background save."""
        return CheckpointWriteError(self.path, self.errno, self.strerror, self.filename, self.operation,
                                    self.needed, self.free, self.mount, asynchronous=True)


def _write_error(path: Path, error: OSError | CheckpointWriteError, operation: str, filename: str | None,
                 sizes: Iterable[int | None] = (), needed: int | None = None) -> CheckpointWriteError:
    """A :class:`CheckpointWriteError` for ``error`` (an OSError, or one rebuilt after the
    fact), raised while saving ``path``; call it once the scratch dir is removed, as it
    measures the free space. For ENOSPC, ``needed`` is what the checkpoint takes:
    given, or from ``sizes`` (its files' sizes; read only for ENOSPC)."""
    free = mount = None
    if error.errno == _errno.ENOSPC:
        from .diskspace import files_on_disk, free_space

        free, mount = free_space(path.parent)
        if needed is None:
            sizes = list(sizes)
            if sizes and None not in sizes:
                needed = files_on_disk(sizes, path.parent)  # type: ignore[arg-type]  # no None: checked above
    else:
        needed = None
    return CheckpointWriteError(path, error.errno, error.strerror, filename, operation, needed, free, mount)


def _first_os_error(error: BaseException | None) -> OSError | None:
    """The OSError that ``error`` is or was raised from (its cause/context chain), if any:
    torch and DCP turn a failed write into errors of their own."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno is not None:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


# ----------------------------------------------------------------------------- helpers


def _write_durably(path: Path, obj: Any = None, data: bytes | None = None, fsync: bool = True) -> dict[str, Any]:
    """Write ``data`` or ``torch.save(obj)`` to ``path``, fsync it, return size and sha256.

    ``fsync=False`` leaves the fsync to the caller (see :class:`~treadle.fsutil.FsyncRound`). Opened for
    reading too: a large file is hashed by reading it back on another thread (durable.py)."""
    with open(path, "x+b") as f:
        w = _HashingWriter(f)
        try:
            try:
                if data is not None:
                    w.write(data)
                else:
                    torch.save(obj, w)
            except Exception as e:
                if w.error is None or e is w.error:
                    raise
                # torch.save turned the OSError (ENOSPC, EIO...) into a RuntimeError of its zip
                # writer, which names neither file nor errno: raise the OSError itself.
                raise w.error from None
            sha256 = w.hexdigest()
        finally:
            w.stop()  # no thread reads the file once it is closed (its descriptor may be reused)
        f.flush()
        if fsync:
            os.fsync(f.fileno())  # data must be on disk before the manifest claims it is
        if os.fstat(f.fileno()).st_size != w.size:
            raise CheckpointError(f"{path}: wrote {w.size} bytes but file has a different size")
    return {"size": w.size, "sha256": sha256}


# ----------------------------------------------------------------------------- saving


def _check_replaceable(path: Path) -> None:
    """Raise :class:`CheckpointError` unless the existing ``path`` is a treadle checkpoint
    that a save may replace: whatever else is there is left untouched."""
    reason = _not_a_checkpoint_reason(path)
    if reason is not None:
        raise CheckpointError(
            f"refusing to replace {path}: {reason}, so it is not a treadle checkpoint; "
            "a save only replaces an existing checkpoint - move it away or save under another name"
        )


def _install(tmp: Path, path: Path) -> None:
    """Move the finished ``tmp`` dir to ``path``, replacing an existing checkpoint safely.

    Replacement prefers an atomic exchange (``renameat2(RENAME_EXCHANGE)``): ``path``
    names a complete old checkpoint until the instant it names the complete new one.
    Without it we rename the old one aside (``.name.old-*``), rename the new one in,
    then delete the old one; a crash between the two renames leaves the old checkpoint
    in the aside dir, and :func:`cleanup_stale_tmp` renames it back.
    """
    settle(DIRS_GROUP)  # the directories made durable in the background (make_checkpoint_dir) are, before a commit
    parent = path.parent
    if not os.path.lexists(path):
        os.rename(tmp, path)
        fsync_dir(parent)
        return
    _check_replaceable(path)  # again: something else may have appeared there since check_save_args
    if _rename_exchange(tmp, path):
        fsync_dir(parent)
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old checkpoint
        return
    aside = parent / _scratch_name(path.name, "old")
    os.rename(path, aside)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)  # put the old checkpoint back before reporting the failure
        raise
    fsync_dir(parent)
    shutil.rmtree(aside, ignore_errors=True)


def check_save_args(
    path: str | os.PathLike[str], payloads: Mapping[str, Any], meta: Mapping[str, Any] | None,
    *, sharded: bool = False,
) -> tuple[Path, list[str], dict[str, Any]]:
    """What a save checks before writing anything: ``(path, payload names, meta as
    JSON)``, or a ValueError/TypeError/CheckpointError. ``sharded``: DCP's files are the
    checkpoint's too (:func:`treadle.checkpoint.sharded.save_sharded`), so no payload is
    needed and none may take their names."""
    path = Path(path)
    if not path.name or path.name.startswith("."):
        raise ValueError(f"invalid checkpoint path {path}: its name must not be empty or start with '.'")
    if not payloads and not sharded:
        raise ValueError("save_checkpoint needs at least one payload")
    names = [_check_payload_name(n) for n in payloads]
    for name in names if sharded else ():
        if name in FOREIGN_FILE_NAMES or name.endswith(".distcp"):
            raise ValueError(f"payload name {name!r} collides with DCP's files")
    try:  # fail before writing anything if meta cannot go into the manifest
        meta_json = json.loads(json.dumps(dict(meta or {}), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint meta must be JSON-serialisable: {e}") from e
    if os.path.lexists(path):
        _check_replaceable(path)
    return path, names, meta_json


class _SaveStep:
    """The step of a save in progress (``doing``, on ``file``): what its error names."""

    def __init__(self, path: Path) -> None:
        self.doing = f"creating the directory {path.parent}"
        self.file: str | None = None

    def now(self, doing: str, file: str | None = None) -> None:
        self.doing, self.file = doing, file


def _make_scratch(path: Path, step: _SaveStep) -> Path:
    """The new hidden scratch directory beside ``path`` that a save writes into and renames
    onto ``path`` (:func:`_install`), once each directory it creates above (e.g.
    ``checkpoints/``) is durable in its parent."""
    for new in new_dirs(path.parent):
        fsync_dir(new.parent)
    tmp = path.parent / _scratch_name(path.name, "tmp")
    step.now("creating its scratch directory")
    tmp.mkdir()
    return tmp


def save_checkpoint(
    path: str | os.PathLike[str], payloads: Mapping[str, Any], meta: Mapping[str, Any] | None = None
) -> Path:
    """Atomically write a checkpoint directory at ``path``.

    Each payload is ``torch.save``-d into a hidden temp dir next to ``path`` and
    ``manifest.json`` is written last; every file and the dir are fsynced (each payload's
    fsync starts as soon as it is written, while the next is), then the dir is renamed
    onto ``path`` and the parent is fsynced. An existing checkpoint at ``path`` is replaced
    so that a complete old or new one is always findable (see ``_install``); anything else
    at ``path`` (a file, or a directory without a treadle ``manifest.json``) is refused with
    a :class:`CheckpointError` before anything is written, and left untouched. On error
    the temp dir is removed and the exception re-raised; other checkpoints are untouched.
    An OSError of any step (a full disk, EIO at fsync, ...) is raised as a
    :class:`CheckpointWriteError` naming the step, the file and, for ENOSPC, the space needed and free.

    :class:`treadle.checkpoint.async_save.AsyncCheckpointer` does the same from a
    background thread, after copying the state to CPU memory on the caller's.
    """
    path, names, meta_json = check_save_args(path, payloads, meta)
    tmp: Path | None = None
    files: dict[str, dict[str, Any]] = {}
    # The rename in _install is the commit: until it, no reader looks inside the hidden
    # tmp dir (a crash leaves it to cleanup_stale_tmp). So the payloads, the manifest and
    # the dir's entries need only be durable before it: each payload's fsync starts once
    # it is written, the manifest's and the dir's after the manifest, all waited for then.
    syncs = FsyncRound()
    step = _SaveStep(path)
    try:
        tmp = _make_scratch(path, step)
        for name in names:
            step.now(f"writing {name}", name)
            files[name] = _write_durably(tmp / name, obj=payloads[name], fsync=False)
            syncs.start(tmp / name)
        step.now(f"writing {MANIFEST_NAME}", MANIFEST_NAME)
        manifest = new_manifest(meta_json, files)
        _write_durably(tmp / MANIFEST_NAME, data=json.dumps(manifest, indent=2).encode(), fsync=False)
        step.now("syncing its files to disk (fsync)")
        syncs.finish([tmp / MANIFEST_NAME], dirs=[tmp])
        step.now("renaming it into place")
        _install(tmp, path)
    except BaseException as e:
        syncs.abandon()  # no fsync of ours is still at work in tmp while it is removed
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError) or e.errno is None:
            raise
        if step.doing.startswith("syncing") and e.filename and tmp is not None and Path(e.filename).parent == tmp:
            file = Path(e.filename).name  # the fsync's error names the file that failed
            step.now(f"syncing {file} to disk (fsync)", file)
        raise _write_error(path, e, step.doing, step.file, _checkpoint_sizes(payloads, names, files)) from e
    return path


def _checkpoint_sizes(payloads: Mapping[str, Any], names: list[str],
                      written: Mapping[str, Mapping[str, Any]]) -> Iterator[int | None]:
    """The sizes of a checkpoint's files (lazily: computed for ENOSPC only): those
    written, the others as torch.save would write them, and the manifest."""
    from .diskspace import saved_size

    for name in names:
        yield written[name]["size"] if name in written else saved_size(payloads[name])
    yield 400 + 200 * len(names)  # the manifest: its fixed fields and one entry per file (meta aside)


# ----------------------------------------------------------------------------- reading


# Sentences of torch's weights-only error that are advice, not the reason: how to load
# the file anyway (weights_only=False, add_safe_globals, "if you trust the source"),
# links to the docs and requests to file an issue. treadle never loads unsafely, so
# repeating them would only tell the user how to run what the file carries.
_TORCH_ADVICE = re.compile(
    r"weights.only|safe_globals|allowlist|trust|documentation|pytorch\.org|file an issue|two options|"
    r"^\(?\d\)|alternatively|can still be loaded|load failed",
    re.IGNORECASE,
)
_TORCH_GLOBAL = re.compile(r"\bGLOBAL\s+([A-Za-z_][\w.]*\w)")


def _torch_reason(message: str) -> str:
    """The reason in torch's weights-only unpickling error, without its advice.

    torch's text (2.4 to 2.13 at least) wraps one sentence of reason (e.g. "Trying to
    load unsupported GLOBAL posix.system whose module posix is blocked.") in paragraphs
    telling how to load the file anyway; those are dropped sentence by sentence, so
    that a new wording of the same advice is dropped too.
    """
    message = re.sub(r"\x1b\[[0-9;]*m", "", message)
    if "WeightsUnpickler error:" in message:
        message = message.rsplit("WeightsUnpickler error:", 1)[1]
    sentences = re.split(r"(?<=[.!?:])\s+|\n+", message)
    kept = [s for s in map(str.strip, sentences) if s and not _TORCH_ADVICE.search(s)]
    return " ".join(kept) or "the weights-only unpickler refused the file"


def _refused_global(message: str) -> str | None:
    """The dotted name of the global a weights-only load refused (``posix.system``), if any."""
    m = _TORCH_GLOBAL.search(message)
    return m.group(1) if m else None


def _refusal(message: str) -> str:
    """What a weights-only load refused, from torch's error text: the start of an
    :class:`UnsafeCheckpointError`'s message, after the file's name."""
    name = _refused_global(message)
    if name:
        return (f"it references the Python global {name!r}, which only an unrestricted unpickler would "
                "import and call.")
    return "it holds something other than tensors and plain containers."


def _load_weights_only(fpath: Path, map_location: Any, verified: bool, mmap: bool = False) -> Any:
    try:
        return torch.load(fpath, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        note = " The file was not hash-verified, so it may also be corrupt." if not verified else ""
        raise UnsafeCheckpointError(
            f"{fpath}: refused to load: {_refusal(str(e))} treadle loads only tensors and plain containers "
            f"(torch.load weights_only=True), with no unsafe fallback, and nothing in the file was executed.{note} "
            f"torch's reason: {_torch_reason(str(e))}"
        ) from None
    except Exception as e:
        if verified:  # bytes match the manifest: not disk corruption (e.g. bad map_location)
            raise UnreadableCheckpointError(f"{fpath}: torch.load failed: {type(e).__name__}: {e}") from e
        # No manifest vouches for the file: it may be cut short, or something else altogether
        # (a text file, an empty one, behind a symbolic link named state.pt).
        what = "an empty file" if _size(fpath) == 0 else "truncated or unreadable"
        raise CorruptCheckpointError(
            f"{fpath}{link_note(fpath)}: {what} (torch.load: {type(e).__name__}: {e}); expected a checkpoint "
            f"directory (with {MANIFEST_NAME}) or a file written by torch.save") from e


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def load_checkpoint(
    path: str | os.PathLike[str],
    files: Iterable[str] | None = None,
    map_location: Any = "cpu",
    verify: bool = True,
    mmap: bool = False,
) -> dict[str, Any]:
    """Load payloads of a checkpoint as ``{file name: object}``.

    With ``verify`` each requested file's size and sha256 are checked against the
    manifest before unpickling. ``files`` selects a subset (default: all). Loading
    always uses ``torch.load(weights_only=True)``; there is no unsafe fallback. ``mmap``:
    the tensors are mapped from the files (``torch.load(mmap=True)``), read from disk only
    as they are used.

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
        return {STATE_FILE: _load_weights_only(path, map_location, verified=False, mmap=mmap)}
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
        else:
            refuse_link(path / name)
        out[name] = _load_weights_only(path / name, map_location, verified=verify, mmap=mmap)
    return out
