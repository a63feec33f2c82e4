"""The run directory: one run at a time (an OS lock released when its holder dies), and
files of an earlier run moved aside, never overwritten."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.engine.run_dir import LOCK_NAME, WorkDirBusyError, WorkDirLock, read_holder, write_run_file

from support import TinyNet, make_data


def make(work_dir, **kw):
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(16), batch_size=4),
                val_dataloader=DataLoader(make_data(4), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=1, seed=0, progress=False)
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def test_a_second_lock_on_the_same_work_dir_is_refused_naming_the_holder(tmp_path):
    with WorkDirLock(tmp_path, run="run-a"):
        with pytest.raises(WorkDirBusyError, match=rf"work_dir {tmp_path} is in use by pid {os.getpid()} on host "
                                                   rf"{socket.gethostname()} \(run run-a, since .*\)"):
            WorkDirLock(tmp_path, run="run-b").acquire()
        assert read_holder(tmp_path)["run"] == "run-a"
    with WorkDirLock(tmp_path, run="run-b") as lock:  # released: free again
        assert lock.held


@pytest.mark.slow
def test_the_lock_of_a_killed_process_is_free_with_no_cleanup(tmp_path):
    code = ("import sys, time; from treadle.engine.run_dir import WorkDirLock; "
            "lock = WorkDirLock(sys.argv[1], 'dead'); lock.acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(WorkDirBusyError, match=f"pid {proc.pid}"):
            WorkDirLock(tmp_path).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / LOCK_NAME).exists()  # the file stays; the kernel dropped the lock
    with WorkDirLock(tmp_path, run="next"):
        pass


@pytest.mark.slow
def test_a_child_forked_while_the_lock_is_held_does_not_keep_it_after_its_parent_is_killed(tmp_path):
    # A loader worker outlives a SIGKILLed run by up to 5 s: the resume started right after must find the lock free.
    code = ("import os, sys, time; from treadle.engine.run_dir import WorkDirLock; "
            "lock = WorkDirLock(sys.argv[1], 'dead'); lock.acquire(); "
            "pid = os.fork()\nif pid == 0:\n    time.sleep(60); os._exit(0)\n"
            "print(pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    try:
        with pytest.raises(WorkDirBusyError, match=f"pid {proc.pid}"):
            WorkDirLock(tmp_path).acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.kill(child, 0)  # the child still runs
        with WorkDirLock(tmp_path, run="next") as lock:
            assert lock.held
    finally:
        os.kill(child, signal.SIGKILL)


def test_fit_validate_and_test_in_a_locked_work_dir_refuse_before_writing_anything(tmp_path):
    t = make(tmp_path / "run", test_dataloader=DataLoader(make_data(4), batch_size=4))
    with WorkDirLock(tmp_path / "run", run="other"):
        before = sorted(os.listdir(tmp_path / "run"))
        for call in (t.fit, t.validate, t.test):
            with pytest.raises(WorkDirBusyError, match=r"is in use by pid .* \(run other"):
                call()
        assert sorted(os.listdir(tmp_path / "run")) == before == [LOCK_NAME]
    t.fit()  # free again
    assert t.validate()["val/loss"] > 0


def test_the_lock_is_held_while_fit_runs_and_released_after(tmp_path):
    seen = []

    class Probe(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            if not seen:
                with pytest.raises(WorkDirBusyError):
                    WorkDirLock(trainer.work_dir).acquire()
                seen.append(read_holder(trainer.work_dir))

    t = make(tmp_path, hooks=[Probe()])
    t.fit()
    assert seen[0]["pid"] == os.getpid() and seen[0]["run"] == t.run_id
    with WorkDirLock(tmp_path):
        pass


def test_write_run_file_moves_an_earlier_different_file_aside(tmp_path):
    assert write_run_file(tmp_path, "config.yaml", "a: 1\n") is None
    assert write_run_file(tmp_path, "config.yaml", "a: 1\n") is None  # the same: nothing moved
    old = tmp_path / "config.yaml"
    os.utime(old, (time.time() - 3600,) * 2)
    moved = write_run_file(tmp_path, "config.yaml", "a: 2\n")
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(time.time() - 3600))
    assert moved == tmp_path / f"config.{stamp}.yaml" and moved.read_text() == "a: 1\n"
    assert old.read_text() == "a: 2\n"


def test_fit_returns_with_env_txt_in_place_and_a_failed_fsync_of_it_raised(tmp_path, monkeypatch):
    """env.txt's fsync and rename run while the model trains (treadle.fsutil.sync_later);
    fit() returns once they are done, and raises their error after the run's end."""
    import errno

    make(tmp_path).fit()
    assert "torch" in (tmp_path / "env.txt").read_text() and not list(tmp_path.glob(".env.txt*"))
    real_fsync = os.fsync
    tmp_name = f".env.txt.{os.getpid()}.tmp"

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == tmp_name:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("no /proc to tell the file an fsync is for")
    monkeypatch.setattr(os, "fsync", fsync)
    trainer = make(tmp_path / "b")
    with pytest.raises(OSError) as info:
        trainer.fit()
    assert info.value.errno == errno.EIO and info.value.filename.endswith(tmp_name)
    assert trainer.state.epoch == 1 and not (tmp_path / "b" / "env.txt").exists()
    assert (tmp_path / "b" / "checkpoints" / "epoch_0001" / "manifest.json").is_file()  # env.txt's error is not its
    assert not list((tmp_path / "b").glob(".env.txt*"))
