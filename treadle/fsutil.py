"""fsync: making what was written, and the directory entries that name it, durable.

A file's data is on disk once the file is fsynced; a new or renamed entry in a
directory survives a power loss only once that directory is fsynced too.

* :func:`fsync_file`: one file, by path (an error names the file).
* :func:`fsync_dir`: one directory. Strict by default, for writes that must not be
  reported done unless they are durable (checkpoints): a failure is raised, except
  the errors of file systems that cannot fsync a directory at all. With
  ``best_effort=True`` (log files, run files) nothing is raised: the write itself
  has succeeded, and a run should not stop because its directory could not be synced.
* :func:`fsync_all`: many files and directories at once, in one round;
  :class:`FsyncRound`: the same, each file's fsync started as soon as it is written.
* :func:`new_dirs`: make a directory and its missing parents; says which are new (each
  is durable once its parent is fsynced).
* :func:`sync_later` and :func:`settle`: a job that only waits on the disk (fsyncs,
  a rename) runs on the same threads while the caller goes on (the GIL is free while
  it waits); ``settle(group)`` waits for the jobs of a group (or all) and raises the
  first one's error. A run's small files (env.txt, config.yaml) and its checkpoints/
  directory are made durable this way while it trains; ``fit()`` settles all before it
  returns, a checkpoint's commit settles the directories first.

Platforms whose directories cannot be opened for fsync (no ``os.O_DIRECTORY``, e.g.
Windows) skip directory fsyncs. Imports nothing from treadle.
"""

from __future__ import annotations

import _thread
import atexit
import errno
import functools
import os
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from pathlib import Path

__all__ = ["FsyncRound", "fsync_all", "fsync_dir", "fsync_file", "new_dirs", "settle", "sync_later"]

# fsync of a directory is not supported by some file systems: not an error of the write.
_UNSUPPORTED = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)


def fsync_dir(path: str | os.PathLike[str], *, best_effort: bool = False) -> None:
    """fsync a directory so that renames/creations inside it survive a power loss.

    Strict (default): an OSError of opening or syncing it is raised, with the
    directory as its ``filename``, except EINVAL/ENOTSUP/EOPNOTSUPP from the fsync (the
    file system cannot fsync directories). ``best_effort=True``: every OSError is
    ignored."""
    if not hasattr(os, "O_DIRECTORY"):  # e.g. Windows: directories cannot be fsynced
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if not best_effort and e.errno not in _UNSUPPORTED:
            if e.filename is None:
                e.filename = str(path)
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a file by path; an OSError (e.g. EIO) names the file."""
    fd = os.open(path, os.O_RDONLY)  # fsync flushes the file, whatever the descriptor's mode
    try:
        os.fsync(fd)
    except OSError as e:  # os.fsync's error names no file
        if e.filename is None:
            e.filename = str(path)
        raise
    finally:
        os.close(fd)


def new_dirs(directory: str | os.PathLike[str]) -> list[Path]:
    """Create ``directory`` and its missing parents; return the ones created, deepest
    first. Each one's entry survives a power loss once its parent is fsynced."""
    directory = Path(directory)
    missing = []
    for d in (directory, *directory.parents):
        if os.path.lexists(d):  # so do all its parents: no lstat up to the root
            break
        missing.append(d)
    directory.mkdir(parents=True, exist_ok=True)
    return missing


class _Threads:
    """The fsync threads: up to ``limit``, one more started whenever a job finds none idle.

    Not a ``ThreadPoolExecutor``: its threads start through ``threading.Thread.start``,
    which waits until the new thread runs, 0.15 to 0.5 ms each in a first ``fit()``
    (three of them, measured); ``_thread.start_new_thread`` returns at once (about 0.06
    ms). Nothing joins these threads at exit: a run's jobs are settled before ``fit()``
    returns, and an exit settles whatever :func:`sync_later` left (see :func:`_pool_for_submit`).
    """

    def __init__(self, limit: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[None], Callable[[], None]]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by a thread each time it is done with a job
        self._count, self._limit = 0, limit

    def submit(self, job: Callable[[], None]) -> Future[None]:
        """Run ``job`` on one of the threads (the caller holds ``_pool_lock``)."""
        future: Future[None] = Future()
        if not self._idle.acquire(blocking=False) and self._count < self._limit:
            _thread.start_new_thread(self._work, (f"treadle-fsync_{self._count}",))  # raises before the job is queued
            self._count += 1
        self._jobs.put((future, job))
        return future

    def _work(self, name: str) -> None:
        threading.current_thread().name = name  # a dummy Thread object: the name is for debuggers and tests
        while True:
            future, job = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    job()
                except BaseException as e:
                    future.set_exception(e)
                else:
                    future.set_result(None)
            del future, job  # hold no reference while idle
            self._idle.release()


_pool: _Threads | None = None
_pool_lock = threading.Lock()
_pending: list[tuple[str, Future[None]]] = []  # sync_later's jobs by group, until settled


def _pool_for_submit() -> _Threads:
    """The threads (made at the first job; the caller holds ``_pool_lock``)."""
    global _pool
    if _pool is None:
        _pool = _Threads(limit=8)
        atexit.register(settle, raise_errors=False)  # nothing left half-done by an exit
    return _pool


def _forget_threads() -> None:
    # A forked child has none of its parent's threads: it starts its own when it needs them.
    global _pool, _pool_lock, _pending
    _pool, _pool_lock, _pending = None, threading.Lock(), []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads)


def _submit(jobs: list[Callable[[], None]], pending_group: str | None = None) -> list[Future[None]]:
    """Start ``jobs`` on the fsync threads; with ``pending_group``, also recorded for
    :func:`settle` (under the same lock: a settle never misses a job already started)."""
    with _pool_lock:
        pool = _pool_for_submit()
        futures = [pool.submit(job) for job in jobs]
        if pending_group is not None:
            _pending.extend((pending_group, f) for f in futures)
        return futures


def _raise_first(futures: Iterable[Future[None]]) -> None:
    errors = [f.exception() for f in futures]  # waits for each
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


class FsyncRound:
    """The fsyncs of one commit, each file's started as soon as the file is complete.

    ``start(path)`` begins fsyncing ``path`` on the fsync threads and returns at once
    (the GIL is free while it waits), so a checkpoint's first payload goes to disk while
    the next ones and the manifest are written; :meth:`finish` fsyncs the rest (all at
    once) and waits for every one. Measured in a first ``fit()``: the round after the
    manifest took 0.55 to 0.65 ms instead of 1.4 to 1.8 ms. :meth:`abandon` waits for
    the started ones without raising (the commit failed before its round).
    """

    def __init__(self) -> None:
        self._started: list[Future[None]] = []

    def start(self, path: str | os.PathLike[str]) -> None:
        """Begin fsyncing the file ``path``: nothing may be written to it after this."""
        self._started += _submit([functools.partial(fsync_file, path)])

    def finish(self, files: Iterable[Path] = (), dirs: Iterable[Path] = ()) -> None:
        """fsync ``files`` and ``dirs`` too, all at once, and return when every file of
        the round is durable; the first error (in the order started) is raised after all
        finished."""
        jobs = [functools.partial(fsync_file, p) for p in files] + [functools.partial(fsync_dir, d) for d in dirs]
        futures, self._started = self._started, []
        if len(jobs) > 1:
            futures += _submit(jobs[1:])  # the first on this thread, which would only wait: one thread fewer to start
        try:
            if jobs:
                jobs[0]()
        finally:
            _raise_first(futures)

    def abandon(self) -> None:
        """Wait for the fsyncs started so far and forget their errors."""
        futures, self._started = self._started, []
        wait(futures)


def fsync_all(files: Iterable[Path], dirs: Iterable[Path] = ()) -> None:
    """fsync files and directories (strictly), all at once; returns when every one is durable.

    Why concurrently: each fsync waits for a journal commit (ext4, xfs), and fsyncs
    issued together share one (a checkpoint's three files and its dir: 0.6 to 0.75 ms
    here, 0.87 to 1.1 ms one after another, with the threads already started). The first
    error is raised after all finished. (:class:`FsyncRound` starts each file's as soon
    as it is written.)
    """
    FsyncRound().finish(files, dirs)


def sync_later(job: Callable[[], None], group: str = "") -> None:
    """Run ``job`` on the fsync threads and return at once. For work that waits on the
    disk with the GIL released (fsync, rename), so it overlaps the caller's; whoever
    needs it done calls :func:`settle` (for its ``group``, or for all)."""
    _submit([job], pending_group=group)


def settle(group: str | None = None, *, raise_errors: bool = True) -> None:
    """Wait for the :func:`sync_later` jobs started so far (of ``group``; None: all);
    raise the first one's error (``raise_errors=False``: the caller is already raising
    an error of its own)."""
    with _pool_lock:
        futures = [f for g, f in _pending if group is None or g == group]
        _pending[:] = [(g, f) for g, f in _pending if not (group is None or g == group)]
    try:
        _raise_first(futures)
    except BaseException:
        if raise_errors:
            raise
