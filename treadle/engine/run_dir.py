"""The run directory (``work_dir``): one run at a time, and the files a run writes there.

* :class:`WorkDirLock`: an OS file lock on ``work_dir/.treadle.lock`` (``flock``), held by
  rank 0 while ``fit()``, ``validate()`` or ``test()`` runs. The kernel releases it when
  the process dies, however it dies, so there is never a stale lock to clean up. A second
  run in the same ``work_dir`` is refused in one line naming the holder (pid, host, run).
* :func:`write_run_file`: ``config.yaml``, ``env.txt``; an earlier run's file of that
  name with other content is moved aside (``config.<time>.yaml``), never overwritten.
* :class:`RunDir`: the two above, plus where a checkpoint name lands, as every rank of
  a run sees them: rank 0 acts on the file system, every rank gets its answer or its
  error, so all ranks go on or stop together.

Nothing here knows the Trainer; it writes the files once the resume checks have passed,
so a refused resume leaves the directory as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no lock, said once in the log
    fcntl = None  # type: ignore[assignment]  # the lock checks for None

from treadle.checkpoint.directory import (CHECKPOINTS, check_writable_dir, claim_checkpoint_path, make_checkpoint_dir,
                                         saved_note)
from treadle.checkpoint.io import CheckpointError
from treadle.distributed import comm
from treadle.logging.writers import get_logger, move_whole_aside, replace_atomically

LOCK_NAME = ".treadle.lock"

__all__ = ["LOCK_NAME", "RunDir", "WorkDirBusyError", "WorkDirError", "WorkDirLock", "read_holder",
           "write_run_file"]

T = TypeVar("T")


class WorkDirError(RuntimeError):
    """The ``work_dir`` cannot be used: it cannot be created, or another run holds it."""


class WorkDirBusyError(WorkDirError):
    """Another process holds the ``work_dir``'s lock: its run is still going on."""


def read_holder(work_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What the lock file says about the process that holds (or last held) it."""
    try:
        data = json.loads((Path(work_dir) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_HELD: "weakref.WeakSet[WorkDirLock]" = weakref.WeakSet()


def _drop_in_child() -> None:
    """In a forked child: close this process's copy of every held lock's file, so that the
    lock stays with the process that took it (and goes when it dies), not with its children."""
    for lock in list(_HELD):
        f, lock._file = lock._file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


class WorkDirLock:
    """An exclusive, non-blocking lock on a run directory.

    ``flock`` locks belong to the open file: a second ``WorkDirLock`` on the same
    directory fails even in the same process, and the lock goes away with the process.
    A process forked while it is held (a loader worker) closes its copy of the file at
    once (:func:`_drop_in_child`): otherwise the lock would last until the last worker
    exits, up to 5 s after a SIGKILLed run, and refuse the resume started right after it.
    On file systems without ``flock`` the run goes on unlocked, with a warning.
    """

    def __init__(self, work_dir: str | os.PathLike[str], run: str = "") -> None:
        self.work_dir = Path(work_dir)
        self.run = run
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`WorkDirBusyError` naming its holder."""
        if self._file is not None:
            return
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # read-only, not permitted, a file in the way: nothing was written
            raise WorkDirError(f"work_dir {self.work_dir}: cannot create it ({e.strerror or e}); expected a "
                               "directory this process may write (--work-dir DIR, or work_dir= in the config)"
                               ) from None
        if fcntl is None:
            get_logger().warning(f"{self.work_dir}: no file locks on this platform; make sure no other run uses "
                                 "this work_dir at the same time")
            return
        f = open(self.work_dir / LOCK_NAME, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise WorkDirBusyError(self._busy_message()) from None
            get_logger().warning(f"{self.work_dir}: cannot lock it ({e.strerror}); make sure no other run uses "
                                 "this work_dir at the same time")
            return
        f.seek(0)
        f.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "run": self.run,
                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
        f.flush()
        self._file = f
        _HELD.add(self)

    def _busy_message(self) -> str:
        holder = None
        for _ in range(20):  # the holder writes its details right after locking
            holder = read_holder(self.work_dir)
            if holder:
                break
            time.sleep(0.01)
        who = "another process"
        if holder:
            who = f"pid {holder.get('pid')} on host {holder.get('host')}"
            if holder.get("run"):
                who += f" (run {holder['run']}, since {holder.get('since')})"
        return (f"work_dir {self.work_dir} is in use by {who}; two runs in one work_dir would replace each "
                "other's checkpoints and mix their logs: wait for it to finish, or choose another work_dir")

    def release(self) -> None:
        f, self._file = self._file, None
        _HELD.discard(self)
        if f is not None:
            f.close()  # closing the file releases the lock

    def __enter__(self) -> "WorkDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def write_run_file(work_dir: str | os.PathLike[str], name: str, text: str, later: bool = False) -> Path | None:
    """Write ``work_dir/name`` (atomically). An existing file with other content is
    first moved to ``<stem>.<time it was last written><suffix>``; returns where it went,
    or None when nothing was moved. ``later``: made durable and renamed into place on
    the fsync threads (see ``replace_atomically``); done once ``treadle.fsutil.settle()``
    returns."""
    path = Path(work_dir) / name
    moved = None
    try:
        if path.read_text(encoding="utf-8") == text:
            return None
    except (OSError, UnicodeDecodeError):
        pass  # missing, or unreadable: then kept aside all the same
    if path.exists():
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(path.stat().st_mtime))
        moved = move_whole_aside(path, stamp)
        if moved is not None:
            get_logger().info(f"{name}: the earlier one moved to {moved.name}")
    replace_atomically(path, lambda f: f.write(text), later=later)
    return moved


class RunDir:
    """One run's ``work_dir`` as every rank of the run uses it.

    Rank 0 does the file-system work (``is_main``); the others receive its result, or
    its error as an exception of the same type, so that no rank goes on alone.
    """

    def __init__(self, path: Path, is_main: bool) -> None:
        self.path = path
        self.is_main = is_main
        self._lock: WorkDirLock | None = None
        self._depth = 0

    def _by_rank0(self, fn: Callable[[], T]) -> T:
        result: Any = None
        error: Exception | None = None
        if self.is_main:
            try:
                result = fn()
            except Exception as e:
                error = e
        result, failed = comm.broadcast_object((result, None if error is None else (type(error), str(error))))
        if error is not None:
            raise error
        if failed is not None:
            kind, message = failed
            raise kind(message)
        return result

    @contextlib.contextmanager
    def locked(self, run: str) -> Iterator[None]:
        """Hold the work_dir's lock (re-entrant: a validate() inside fit() keeps it)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        lock = WorkDirLock(self.path, run)
        self._by_rank0(lock.acquire)
        self._lock, self._depth = lock, 1
        try:
            yield
        finally:
            self._lock, self._depth = None, 0
            lock.release()

    def write_files(self, files: Mapping[str, str]) -> None:
        """:func:`write_run_file` for each ``{name: text}`` (rank 0 only). Their fsyncs
        and renames run while the caller goes on (a millisecond at the start of a run):
        the caller calls ``treadle.fsutil.settle()`` before it returns."""
        if self.is_main:
            for name, text in files.items():
                write_run_file(self.path, name, text, later=True)

    def check_checkpoint_dirs(self, names: Iterable[str], create: bool = False) -> None:
        """Before training: each ``work_dir/checkpoints/<name>`` ("" for checkpoints/
        itself) can take a checkpoint, so a run does not find out at its first save.
        ``create``: made now (``make_checkpoint_dir``), else probed without creating it."""
        dirs = [self.path / CHECKPOINTS / name for name in names]
        check_dir = make_checkpoint_dir if create else check_writable_dir

        def check() -> None:
            for d in dirs:
                try:
                    check_dir(d)
                except CheckpointError as e:
                    raise CheckpointError(f"{e}; nothing was trained") from None

        self._by_rank0(check)

    def saved_note(self) -> str:
        """What a failure leaves saved (:func:`saved_note`)."""
        return saved_note(self.path)

    def checkpoint_path(self, name: str, run: str) -> Path:
        """``work_dir/checkpoints/<name>``, or the ``-v1``, ``-v2``... beside it when the
        name holds something run ``run`` did not save (see ``claim_checkpoint_path``)."""
        return self._by_rank0(lambda: claim_checkpoint_path(self.path / CHECKPOINTS / name, run))
