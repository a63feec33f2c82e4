"""treadle.fsutil: the one fsync helper; strict for checkpoints, best effort for logs."""

from __future__ import annotations

import errno
import os

import pytest

from treadle.fsutil import fsync_all, fsync_dir, fsync_file
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
