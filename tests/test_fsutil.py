"""treadle.fsutil: the one fsync helper; strict for checkpoints, best effort for logs."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from treadle.fsutil import FsyncRound, fsync_all, fsync_dir, fsync_file, new_dirs, settle, sync_later
from treadle.logging.writers import move_whole_aside, replace_atomically

needs_dir_fsync = pytest.mark.skipif(not hasattr(os, "O_DIRECTORY"), reason="directories cannot be fsynced here")


def failing_fsync(monkeypatch, code):
    def fsync(fd):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "fsync", fsync)


def test_fsyncs_succeed(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    fsync_file(tmp_path / "a")
    fsync_dir(tmp_path)
    fsync_all([tmp_path / "a", tmp_path / "b"], dirs=[tmp_path])
    fsync_all([tmp_path / "a"])
    fsync_all([])


@needs_dir_fsync
def test_strict_dir_fsync_raises_naming_the_dir(tmp_path, monkeypatch):
    failing_fsync(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as info:
        fsync_dir(tmp_path)
    assert (info.value.errno, info.value.filename) == (errno.EIO, str(tmp_path))
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")


@needs_dir_fsync
@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP])
def test_strict_dir_fsync_ignores_file_systems_without_dir_fsync(tmp_path, monkeypatch, code):
    failing_fsync(monkeypatch, code)
    fsync_dir(tmp_path)


def test_best_effort_dir_fsync_raises_nothing(tmp_path, monkeypatch):
    fsync_dir(tmp_path / "missing", best_effort=True)
    failing_fsync(monkeypatch, errno.EIO)
    fsync_dir(tmp_path, best_effort=True)


def test_file_fsync_error_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    failing_fsync(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as info:
        fsync_file(tmp_path / "a")
    assert info.value.filename == str(tmp_path / "a")
    with pytest.raises(OSError) as info:  # concurrently: the first error, after all finished
        fsync_all([tmp_path / "a", tmp_path / "b"])
    assert info.value.errno == errno.EIO and info.value.filename in (str(tmp_path / "a"), str(tmp_path / "b"))


@needs_dir_fsync
def test_log_writes_survive_a_failing_dir_fsync(tmp_path, monkeypatch):
    real_fsync = os.fsync
    dir_fd = os.open(tmp_path, os.O_RDONLY)
    dir_stat = os.fstat(dir_fd)
    os.close(dir_fd)

    def fsync(fd):  # files sync, the directory does not
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (dir_stat.st_dev, dir_stat.st_ino):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "log.jsonl"
    replace_atomically(path, lambda f: f.write("x\n"))
    assert path.read_text() == "x\n"
    moved = move_whole_aside(path, "stamp")
    assert moved is not None and moved.read_text() == "x\n" and not path.exists()


def test_sync_later_runs_on_another_thread_and_settle_waits_for_it_and_raises_its_error():
    gate, seen = threading.Event(), []

    def job():
        gate.wait(5)
        seen.append(threading.current_thread().name)
    sync_later(job)
    assert seen == []  # the caller went on
    gate.set()
    settle()
    assert len(seen) == 1 and seen[0].startswith("treadle-fsync")

    def fails():
        raise OSError(errno.EIO, "disk")
    sync_later(fails)
    with pytest.raises(OSError, match="disk"):
        settle()
    settle()  # raised once: nothing is pending now
    sync_later(fails)
    settle(raise_errors=False)  # the caller raises its own error
    settle()


def _fsyncs_by_path(monkeypatch, gate=None, fail=()):
    """os.fsync recording (file name, thread name); ``gate`` holds back file ``a``'s,
    the names in ``fail`` fail with EIO."""
    real_fsync, done = os.fsync, []

    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name == "a" and gate is not None:
            gate.wait(5)
        if name in fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)
        done.append((name, threading.current_thread().name))
    monkeypatch.setattr(os, "fsync", fsync)
    return done


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsynced files through /proc/self/fd")
def test_fsync_round_starts_a_file_at_once_on_another_thread_and_finish_waits_for_all(tmp_path, monkeypatch):
    for name in "abc":
        (tmp_path / name).write_text(name)
    gate = threading.Event()
    done = _fsyncs_by_path(monkeypatch, gate)
    syncs = FsyncRound()
    syncs.start(tmp_path / "a")
    assert done == []  # the caller went on while a's fsync waits
    gate.set()
    syncs.finish([tmp_path / "b", tmp_path / "c"], dirs=[tmp_path])
    assert sorted(n for n, _ in done) == sorted([tmp_path.name, "a", "b", "c"])
    assert next(t for n, t in done if n == "a").startswith("treadle-fsync")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsynced files through /proc/self/fd")
def test_fsync_round_raises_a_started_fsyncs_error_at_finish_and_abandon_forgets_it(tmp_path, monkeypatch):
    for name in "ab":
        (tmp_path / name).write_text(name)
    done = _fsyncs_by_path(monkeypatch, fail={"a"})
    syncs = FsyncRound()
    syncs.start(tmp_path / "a")
    with pytest.raises(OSError) as info:
        syncs.finish([tmp_path / "b"])
    assert (info.value.errno, info.value.filename) == (errno.EIO, str(tmp_path / "a"))
    assert [n for n, _ in done] == ["b"]  # the others still ran
    syncs.start(tmp_path / "a")
    syncs.abandon()  # waits, raises nothing
    syncs.finish()  # nothing left of the abandoned one


def test_fsync_threads_are_reused_when_idle_and_no_more_than_eight_run():
    def fsync_threads():
        return {t.name for t in threading.enumerate() if t.name.startswith("treadle-fsync_")}
    names: list[str] = []
    sync_later(lambda: names.append(threading.current_thread().name))
    settle()
    before = fsync_threads()
    for _ in range(5):  # one after another: an idle thread takes each, none is started
        sync_later(lambda: names.append(threading.current_thread().name))
        settle()
    assert fsync_threads() == before and set(names) <= before
    gate, running, most = threading.Event(), [], []
    lock = threading.Lock()

    def blocked():
        with lock:
            running.append(1)
            most.append(len(running))
        gate.wait(5)
        with lock:
            running.pop()
    for _ in range(12):
        sync_later(blocked)
    deadline = time.monotonic() + 5  # a bounded wait: fewer than 8 running fails below instead of hanging
    while len(most) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert max(most) == 8  # the other four wait in the queue ...
    gate.set()
    settle()
    assert len(most) == 12 and running == []  # ... and ran once a thread was free


def _sync_later_in_a_forked_child(path):
    sync_later(lambda: path.write_text("child"))
    settle()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_starts_its_own_fsync_threads(tmp_path):
    import multiprocessing

    sync_later(lambda: None)  # the parent has threads ...
    settle()
    child = multiprocessing.get_context("fork").Process(target=_sync_later_in_a_forked_child,
                                                        args=(tmp_path / "f",))
    child.start()
    child.join(20)  # ... the child has none of them: its job must not wait for them forever
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and (tmp_path / "f").read_text() == "child"


@pytest.mark.slow
def test_an_exit_waits_for_what_sync_later_left(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "written"
    code = ("import time\nfrom treadle.fsutil import sync_later\n"
            f"sync_later(lambda: (time.sleep(0.5), open({str(path)!r}, 'w').write('done')))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # exits at once, without settle()
    assert path.read_text() == "done"


def test_replace_atomically_later_puts_the_file_in_place_at_settle(tmp_path, monkeypatch):
    path = tmp_path / "env.txt"
    path.write_text("old\n")
    gate = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        gate.wait(5)
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    replace_atomically(path, lambda f: f.write("new\n"), later=True)
    assert path.read_text() == "old\n"  # not yet: the fsync (then the rename) waits on the other thread
    gate.set()
    settle()
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["env.txt"]


def test_replace_atomically_later_with_a_failing_fsync_keeps_the_old_file_and_raises_at_settle(tmp_path, monkeypatch):
    path = tmp_path / "env.txt"
    path.write_text("old\n")
    failing_fsync(monkeypatch, errno.EIO)
    replace_atomically(path, lambda f: f.write("new\n"), later=True)
    with pytest.raises(OSError) as info:
        settle()
    assert info.value.errno == errno.EIO and info.value.filename.endswith(".tmp")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["env.txt"]


def test_new_dirs_returns_the_directories_it_made_deepest_first(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert new_dirs(deep) == [deep, tmp_path / "a" / "b", tmp_path / "a"] and deep.is_dir()
    assert new_dirs(deep) == []  # all there: nothing new, nothing to sync
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        new_dirs(tmp_path / "f")
