"""Sharded checkpoints: torch.distributed.checkpoint (DCP) inside treadle's checkpoint dirs.

    pending = save_sharded(path, {"model": msd, "optim": osd}, {"state.pt": counters}, meta)
    pending.wait()                                    # collective; at once unless async_=True
    state, payloads = load_sharded(path, {"model": msd_template, "optim": osd_template})
    full = consolidate(path)                          # one process: {fqn: Tensor}

Every rank writes its own shards (``__<rank>_<n>.distcp``, DCP's ``.metadata``) and
rank 0 writes the small payloads (``torch.save``) into one hidden temporary sibling
dir. Once all ranks' data is on disk, each rank hashes a share of the files, rank 0
writes ``manifest.json`` (io.py's format, plus a ``"dcp"`` entry) last and renames the
dir onto ``path`` (io.py's ``_install``: an old checkpoint at ``path`` is replaced
atomically). So a sharded checkpoint has io.py's guarantees: a crash or an error leaves
the previous checkpoint intact, and ``list_checkpoints``/``find_latest_checkpoint``/
``verify_checkpoint``/``prune_checkpoints`` handle it like any other.

Loading verifies every file against the manifest first (the work split over ranks),
then reads through DCP, which reshards: the world size may differ from the save's.
Nothing is unpickled freely: DCP's ``.metadata`` (a pickle) goes through an
allow-list unpickler, and DCP's non-tensor values (``torch.save`` bytes) and the
payloads are read with ``torch.load(weights_only=True)`` (dcp_safe.py); plain DCP uses
full pickle.

All ranks must see the same file system (as DCP requires).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from treadle.distributed import comm
from treadle.fsutil import fsync_dir

from treadle.compat import dcp_kwargs, reshard_problem, saved_storage_data, staged_for_async_save

from .dcp_safe import _SafeEmptyPlanner, _SafeLoadPlanner, _SafeReader, read_metadata_safely
from .durable import _sha256_file
from .io import (
    MANIFEST_NAME,
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
    _SaveStep,
    _check_payload_name,
    _first_os_error,
    _install,
    _make_scratch,
    _verify_file,
    _write_durably,
    _write_error,
    check_save_args,
    load_checkpoint,
    new_manifest,
    read_manifest,
    verify_checkpoint,
)

__all__ = ["PendingSave", "save_sharded", "wait_pending", "load_sharded", "consolidate", "is_sharded_checkpoint"]

DCP_METADATA = ".metadata"


# ----------------------------------------------------------------------------- helpers


def _group() -> Any:
    """Process group for DCP's planning collectives (gloo: no device sync); None alone."""
    return comm.control_group() if comm.is_distributed() else None


_async_pg: tuple[Any, Any] | None = None  # (the default group it belongs to, the group)


def _async_group() -> Any:
    """A gloo group used only by background saves: DCP's collectives then never interleave
    with training's on the same group (which would hang or mix up messages). Collective
    on first use; every rank reaches it in the same save_sharded call."""
    global _async_pg
    default = dist.distributed_c10d._get_default_group()
    if _async_pg is None or _async_pg[0] is not default:  # a new process group: a new one
        _async_pg = (default, dist.new_group(backend="gloo"))
    return _async_pg[1]


def _quiet_single_process() -> None:
    """DCP warns on every call without a process group, one process being a normal case
    here. A filter for that message alone, added globally (filterwarnings drops the
    duplicate): async saves warn from DCP's thread, where ``catch_warnings`` cannot reach."""
    warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized",
                            category=UserWarning)


def _as_checkpoint_error(e: BaseException, path: Path, action: str,
                         needed: Callable[[], int | None] | None = None) -> CheckpointError:
    """DCP's CheckpointException (a BaseException carrying each rank's error) as a
    CheckpointError; treadle's own errors raised inside DCP keep their type and text.
    An OSError behind a rank's failure (a full disk while writing shards: DCP's torch.save
    reports it as a RuntimeError of its own) is a :class:`CheckpointWriteError`, whose
    free space rank 0 measures once the scratch dir is gone; ``needed()`` estimates the
    checkpoint's size for ENOSPC."""
    if isinstance(e, CheckpointException):
        failures = {r: exc for r, (exc, _) in e.failures.items()}
        for exc in failures.values():
            if isinstance(exc, CheckpointError):
                return exc if isinstance(exc, CheckpointWriteError) else type(exc)(f"{path}: {exc}")
        for rank, exc in failures.items():
            os_error = _first_os_error(exc)
            if os_error is not None:
                size = needed() if needed is not None and os_error.errno == errno.ENOSPC else None
                return CheckpointWriteError(path, os_error.errno, os_error.strerror, None,
                                            f"{action} the DCP shards on rank {rank}", size)
        rank, exc = next(iter(failures.items()))
        return CheckpointError(f"{path}: {action} failed on rank(s) {sorted(failures)}: "
                               f"rank {rank}: {type(exc).__name__}: {exc}")
    if isinstance(e, CheckpointError):
        return e
    return CheckpointError(f"{path}: {action} failed: {type(e).__name__}: {e}")


def _dcp_bytes(state: Any) -> int:
    """The tensor bytes DCP writes for ``state`` over all ranks: a DTensor's global size
    (each rank writes its shards), a plain tensor once (DCP dedups replicated ones)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        return sum(_dcp_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_dcp_bytes(v) for v in state)
    return 0


def _dcp_files(metadata: Any, path: Path) -> list[str]:
    """DCP's files in the checkpoint dir ``path`` that ``metadata`` (a save's) describes."""
    storage = saved_storage_data(metadata, lambda: read_metadata_safely(path / DCP_METADATA))
    return sorted({DCP_METADATA} | {info.relative_path for info in storage.values()})


# ----------------------------------------------------------------------------- saving


class PendingSave:
    """A sharded save in flight; :meth:`wait` commits it (manifest, then rename).

    ``wait`` is a collective: every rank calls it (the next save, or the end of
    training, must). Until it returns, the checkpoint does not exist at ``path``.
    """

    def __init__(self, path: Path, tmp: Path, payload_files: dict[str, Any], meta: dict[str, Any],
                 task: Future, asynchronous: bool = False, dcp: bool = True) -> None:
        self.path, self._tmp, self._payload_files, self._meta, self._task = path, tmp, payload_files, meta, task
        self._asynchronous, self._dcp = asynchronous, dcp
        self._result: Path | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True when this rank's data is written and hashed (waiting would not block on I/O)."""
        return self._task.done()

    def wait(self) -> Path:
        """Commit the checkpoint once every rank's data is written; returns ``path``.

        Raises :class:`CheckpointError` on every rank if any rank failed; the temporary
        dir is then removed and whatever was at ``path`` before is untouched.
        """
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        error: str | CheckpointWriteError | None = None
        try:
            entries = self._task.result()
        except (Exception, CheckpointException) as e:  # reported to rank 0: every rank raises the same
            failure = _as_checkpoint_error(e, self.path, "writing")
            entries, error = {}, failure if isinstance(failure, CheckpointWriteError) else str(failure)
        gathered = comm.gather_object((entries, error))
        outcome: str | CheckpointWriteError | None = None
        if comm.get_rank() == 0:
            outcome = self._commit(gathered)  # type: ignore[arg-type]  # gather_object's list, on rank 0
        outcome = comm.broadcast_object(outcome)
        if isinstance(outcome, CheckpointWriteError):
            self._error = outcome.as_asynchronous() if self._asynchronous else outcome
            raise self._error
        if outcome:
            self._error = CheckpointError(f"sharded save to {self.path} failed: {outcome}")
            raise self._error
        self._result = self.path
        return self.path

    def _commit(self, gathered: list[tuple[dict[str, Any], str | CheckpointWriteError | None]]
                ) -> str | CheckpointWriteError | None:
        """Rank 0: write the manifest last and install the dir; on failure the error text,
        or the CheckpointWriteError of a full disk or another OS error."""
        dcp_files: dict[str, Any] = {}
        doing, file = f"writing {MANIFEST_NAME}", MANIFEST_NAME
        try:
            for _, e in gathered:
                if isinstance(e, CheckpointWriteError):
                    raise e
            errors = [f"rank {r}: {e}" for r, (_, e) in enumerate(gathered) if e]
            if errors:
                raise CheckpointError("; ".join(errors))
            for entries, _ in gathered:
                dcp_files.update(entries)
            manifest = new_manifest(self._meta, {**self._payload_files, **dcp_files})
            if self._dcp:
                manifest["dcp"] = {"files": sorted(dcp_files), "world_size": len(gathered)}
            # The manifest is the commit record: written once every file is durable.
            _write_durably(self._tmp / MANIFEST_NAME, data=json.dumps(manifest, indent=2).encode())
            doing, file = "syncing its directory to disk (fsync)", None
            fsync_dir(self._tmp)
            doing = "renaming it into place"
            _install(self._tmp, self.path)
            return None
        except BaseException as e:
            shutil.rmtree(self._tmp, ignore_errors=True)
            if isinstance(e, CheckpointWriteError):  # a rank's: measure the free space now the scratch is gone
                return _write_error(self.path, e, e.operation, e.filename, needed=e.needed)
            if isinstance(e, OSError) and e.errno is not None:
                sizes = [f["size"] for f in (*self._payload_files.values(), *dcp_files.values())]
                return _write_error(self.path, e, doing, file, [*sizes, 400 + 200 * len(sizes)])
            return str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"


_last_pending: PendingSave | None = None  # at most one save in flight per process


def wait_pending() -> Path | None:
    """Commit the save still in flight, if any (a collective; e.g. at the end of training).
    Returns its path, or None when there was none. Raises its error, once."""
    global _last_pending
    pending, _last_pending = _last_pending, None
    if pending is None or pending._error is not None:  # none, or its error was raised already
        return None
    return pending.wait()


def _hash_share(tmp: Path, metadata: Any) -> dict[str, Any]:
    """Size and sha256 of this rank's share of DCP's files (all ranks hash in parallel)."""
    files = _dcp_files(metadata, tmp)[comm.get_rank()::comm.get_world_size()]
    out = {}
    for name in files:
        path = tmp / name
        out[name] = {"size": path.stat().st_size, "sha256": _sha256_file(path)}
    return out


def save_sharded(path: str | os.PathLike[str], sharded_state: dict[str, Any],
                 small_payloads: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
                 *, async_: bool = False, rank_files: Mapping[str, Any] | None = None) -> PendingSave:
    """Write a sharded checkpoint dir at ``path``; a collective: every rank calls it.

    ``rank_files`` instead of ``sharded_state`` (which must then be empty): each rank
    writes its own ``{file name: object}`` with ``torch.save`` (DeepSpeed's ZeRO
    partitions in each ``rng_rank<r>.pt``): a plain checkpoint directory, no DCP, whose
    files no rank had to gather.

    ``sharded_state``: nested dicts of tensors/DTensors (e.g. FSDPStrategy's
    ``model_state_dict``/``optim_state_dict``) and plain values; each rank writes its
    shards. ``small_payloads`` (``{file name: object}``, used on rank 0 only) are
    ``torch.save``-d beside them, e.g. ``state.pt`` and the gathered ``rng_rank<r>.pt``.
    ``meta`` goes into the manifest (JSON).

    Returns a :class:`PendingSave`. Sync (default): already committed, ``wait()``
    returns at once. ``async_=True``: DCP's ``async_save`` copies the state to CPU
    memory (the only blocking part besides planning) and writes it in a background
    thread; the checkpoint appears at ``path`` only when every rank has called
    ``wait()``, or :func:`wait_pending`. A new save first commits the one in flight
    (raising its error, if it failed).
    """
    global _last_pending
    wait_pending()
    path = Path(path)
    rank = comm.get_rank()
    names: list[str] = []
    payloads = dict(small_payloads or {}) if rank == 0 else {}
    tmp: Path | None = None
    error: str | CheckpointWriteError | None = None
    failure: Exception | None = None
    payload_files: dict[str, Any] = {}
    meta_json: dict[str, Any] = {}
    step = _SaveStep(path)

    def needed() -> int | None:  # for ENOSPC: the whole checkpoint (rank 0's payloads, every rank's shards)
        from .diskspace import files_on_disk, saved_size

        try:
            sizes = [payload_files[n]["size"] if n in payload_files else saved_size(payloads[n]) for n in names]
            if None in sizes:
                return None
            return files_on_disk([*sizes, _dcp_bytes(sharded_state), 400 + 200 * len(names)],  # type: ignore[list-item]  # no None: checked above
                                 path.parent)
        except Exception:  # only an estimate for the error message
            return None

    if rank == 0:  # checks and small files before any collective: a failure here stops every rank
        try:
            _, names, meta_json = check_save_args(path, payloads, meta, sharded=True)
            tmp = _make_scratch(path, step)
            for n in names:
                step.now(f"writing {n}", n)
                payload_files[n] = _write_durably(tmp / n, obj=payloads[n])
        except Exception as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            failure, error = e, f"{type(e).__name__}: {e}"
            if isinstance(e, OSError) and e.errno is not None:  # disk full, EIO...: every rank raises it
                failure = error = _write_error(path, e, step.doing, step.file,
                                               needed=needed() if e.errno == errno.ENOSPC else None)
                failure.__cause__ = e
    tmp, error = comm.broadcast_object((tmp, error))
    if failure is not None:
        raise failure  # rank 0 keeps the original type (ValueError for a bad name, ...)
    if isinstance(error, CheckpointWriteError):
        raise error
    if error:
        raise CheckpointError(f"sharded save to {path} failed on rank 0: {error}")
    assert tmp is not None
    if rank_files is not None:
        if sharded_state or async_:
            raise ValueError("save_sharded(rank_files=...) takes no sharded_state and is synchronous")
        task: Future = Future()
        try:  # this rank's files, durable before rank 0 commits the manifest
            task.set_result({_check_payload_name(n): _write_durably(tmp / n, obj=obj) for n, obj in rank_files.items()})
        except Exception as e:  # committed below as a failure on every rank
            task.set_exception(_as_checkpoint_error(e, path, "writing", needed))
        pending = PendingSave(path, tmp, payload_files, meta_json, task, dcp=False)
        pending.wait()
        return pending
    no_dist = not comm.is_distributed()
    writer = dcp.FileSystemWriter(tmp, sync_files=True)
    executor: ThreadPoolExecutor | None = None
    try:
        if async_:
            group = None if no_dist else _async_group()
            _quiet_single_process()
            dcp_future = dcp.async_save(staged_for_async_save(sharded_state), storage_writer=writer,
                                        process_group=group, **dcp_kwargs(dcp.async_save, no_dist))
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="treadle-ckpt-hash")

            def hash_share() -> dict[str, Any]:
                try:
                    metadata = dcp_future.result()
                except (Exception, CheckpointException) as e:
                    raise _as_checkpoint_error(e, path, "writing", needed) from e
                return _hash_share(tmp, metadata)
            task = executor.submit(hash_share)
            executor.shutdown(wait=False)  # the thread ends after the task
        else:
            task = Future()
            try:
                _quiet_single_process()
                metadata = dcp.save(sharded_state, storage_writer=writer, process_group=_group(),
                                    **dcp_kwargs(dcp.save, no_dist))
                task.set_result(_hash_share(tmp, metadata))
            except (Exception, CheckpointException) as e:  # committed below as a failure on every rank
                task.set_exception(_as_checkpoint_error(e, path, "writing", needed))
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    pending = PendingSave(path, tmp, payload_files, meta_json, task, asynchronous=async_)
    if async_:
        _last_pending = pending
    else:
        pending.wait()
    return pending


# ----------------------------------------------------------------------------- loading


def _verify_distributed(path: Path, manifest: dict[str, Any]) -> None:
    """Every file's size and sha256 against the manifest, each rank checking a share."""
    names = sorted(manifest["files"])
    error: str | None = None
    try:
        for name in names[comm.get_rank()::comm.get_world_size()]:
            _verify_file(path, name, manifest["files"][name])
    except CorruptCheckpointError as e:
        error = str(e)
    for e in comm.all_gather_object(error):  # every rank raises the same, first, error
        if e:
            raise CorruptCheckpointError(e)


def _read_sharded_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint")
    manifest = read_manifest(path)
    if not isinstance(manifest.get("dcp"), dict):
        raise CheckpointError(f"{path}: not a sharded checkpoint (no 'dcp' entry in its manifest); "
                              "read it with treadle.checkpoint.io.load_checkpoint")
    return manifest


def load_sharded(path: str | os.PathLike[str],
                 sharded_state_template: dict[str, Any] | Callable[[set[str]], dict[str, Any]],
                 payloads: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a sharded checkpoint into ``sharded_state_template``; a collective.

    The template has the keys, shapes and shardings wanted on this run (e.g. a fresh
    model's and optimizer's sharded state dicts); its tensors are filled in place
    and plain values replaced, whatever the world size of the save. It may be a function
    of the keys the checkpoint holds (DCP's flattened keys, ``"model.layer.weight"``),
    called once the files are verified: for entries that may be left out. Every file is
    verified against the manifest first. Returns ``(state, small_payloads)``, the
    payloads (default: all) read with ``torch.load(weights_only=True)`` on every rank.
    Raises :class:`CorruptCheckpointError` naming the damaged or missing file.
    """
    path = Path(path)
    manifest = _read_sharded_manifest(path)
    problem = reshard_problem(int(manifest["dcp"].get("world_size", 1)), comm.get_world_size())
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}")
    _verify_distributed(path, manifest)
    dcp_files = set(manifest["dcp"]["files"])
    names = [n for n in manifest["files"] if n not in dcp_files] if payloads is None else list(payloads)
    if callable(sharded_state_template):
        saved = set(read_metadata_safely(path / DCP_METADATA).state_dict_metadata)  # verified above
        sharded_state_template = sharded_state_template(saved)
    try:
        _quiet_single_process()
        dcp.load(sharded_state_template, storage_reader=_SafeReader(path), planner=_SafeLoadPlanner(),
                 process_group=_group(), **dcp_kwargs(dcp.load, not comm.is_distributed()))
    except (Exception, CheckpointException) as e:  # DCP's exception is a BaseException
        raise _as_checkpoint_error(e, path, "loading the sharded state") from None
    small = load_checkpoint(path, files=names, verify=False) if names else {}  # verified above
    return sharded_state_template, small


def consolidate(path: str | os.PathLike[str], key: str | None = "model") -> dict[str, Any]:
    """The full state under ``key`` of a sharded checkpoint (all of it for ``key=None``),
    as plain CPU tensors, in this process alone (no process group needed; everything
    is read into memory). Verifies the whole checkpoint first."""
    path = Path(path)
    _read_sharded_manifest(path)
    verify_checkpoint(path)
    state: dict[str, Any] = {}
    planner = _SafeEmptyPlanner(keys=None if key is None else {key})
    try:
        _load_state_dict(state, storage_reader=_SafeReader(path), planner=planner, no_dist=True)
    except (Exception, CheckpointException) as e:
        raise _as_checkpoint_error(e, path, "consolidating") from None
    if key is None:
        return state
    if key not in state:
        raise CheckpointError(f"{path}: no {key!r} in the sharded state")
    return state[key]


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a sharded checkpoint dir (its manifest has a ``dcp`` entry; with no
    manifest, a DCP ``.metadata`` file). Cheap: no hashing."""
    path = Path(path)
    if not path.is_dir():
        return False
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_bytes())
    except FileNotFoundError:
        return (path / DCP_METADATA).is_file()
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("dcp"), dict)

