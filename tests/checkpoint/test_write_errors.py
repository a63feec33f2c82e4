"""A full disk and other OS errors at a checkpoint save: one error type
(CheckpointWriteError) with a one-line message, for synchronous, asynchronous, best-weights
and sharded saves, through the Trainer and the command line; the previous checkpoint
stays intact and no scratch dir is left behind.

The disk is simulated (no root needed): files that the checkpoint code opens for writing
are wrapped so that their writes fail with ENOSPC once a byte budget is spent, and
``shutil.disk_usage`` reports a known free size.
"""

from __future__ import annotations

import builtins
import errno
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data
from treadle.checkpoint import diskspace, io
from treadle.checkpoint.async_save import AsyncCheckpointer
from treadle.checkpoint.io import CheckpointError, CheckpointWriteError, save_checkpoint, verify_checkpoint
from treadle.cli import main

FREE = 1_100_000  # what the simulated disk reports free: "1.1 MB"
INTACT = "the unfinished save was removed, earlier checkpoints are intact"


class _FailingFile:
    """A file whose writes fail with ENOSPC once the disk's budget is spent."""

    def __init__(self, f, disk: "FullDisk") -> None:
        self._f, self._disk = f, disk

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self._disk.left:
            self._f.write(data[: self._disk.left])
            self._disk.left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


class FullDisk:
    """Files created for writing whose path matches ``match`` (by default: anything in a
    scratch dir of the checkpoint code) fail with ENOSPC after ``after`` bytes in all;
    ``shutil.disk_usage`` says FREE bytes are free and records whether a scratch dir
    still existed when it was asked."""

    def __init__(self, monkeypatch, after: int = 0, match=None) -> None:
        self.left = after
        self.match = match or (lambda p: p.parent.name.startswith("."))
        self.scratch_seen_at_measure: list[bool] = []
        real_open, real_path_open, real_usage = builtins.open, Path.open, shutil.disk_usage

        def fake_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            return _FailingFile(f, self) if ("x" in mode or "w" in mode) and self.match(Path(file)) else f

        def fake_path_open(path, mode="r", *args, **kwargs):  # DCP writes its shards through Path.open
            f = real_path_open(path, mode, *args, **kwargs)
            return _FailingFile(f, self) if "w" in mode and self.match(Path(path)) else f

        def fake_usage(path):
            self.scratch_seen_at_measure.append(any(_scratch(Path(path))))
            return real_usage(path)._replace(free=FREE)

        monkeypatch.setattr(io, "open", fake_open, raising=False)  # _write_durably's open
        monkeypatch.setattr(Path, "open", fake_path_open)
        monkeypatch.setattr(diskspace.shutil, "disk_usage", fake_usage)


def _scratch(directory: Path) -> list[Path]:
    return [p for p in directory.rglob(".*") if p.is_dir()] if directory.is_dir() else []


def _bytes(ckpt: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(ckpt.iterdir())}


def _unit(path: Path) -> int:
    return os.statvfs(path).f_frsize


def _mount(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


def payloads(n: int = 300_000) -> dict:
    return {"state.pt": {"w": torch.arange(n, dtype=torch.float32), "iter": 3}}


def expected_message(path: Path, doing: str, needed: int | None = None, asynchronous: bool = False) -> str:
    kind = "asynchronous checkpoint save" if asynchronous else "checkpoint save"
    space = "" if needed is None else (
        f"; it needs about {diskspace.human_bytes(needed)}, 1.1 MB free on {_mount(path.parent)}")
    return (f"{kind} to {path} failed while {doing}: [Errno 28] No space left on device (ENOSPC){space}; {INTACT}")


# -- save_checkpoint -------------------------------------------------------------------------
def test_disk_full_while_writing_a_payload(tmp_path, monkeypatch):
    prev = save_checkpoint(tmp_path / "epoch_0001", payloads())
    before = _bytes(prev)
    disk = FullDisk(monkeypatch, after=500_000)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path / "epoch_0002", payloads())
    e = info.value
    assert isinstance(e, CheckpointError)
    assert (e.path, e.errno, e.filename, e.free, e.mount) == (
        tmp_path / "epoch_0002", errno.ENOSPC, "state.pt", FREE, _mount(tmp_path))
    content = sum(len(b) for b in before.values())  # the same payloads: the same files
    assert content <= e.needed <= content + 4 * _unit(tmp_path)
    assert str(e) == expected_message(tmp_path / "epoch_0002", "writing state.pt", e.needed)
    assert "\n" not in str(e) and "inline_container" not in str(e)
    assert isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ENOSPC
    assert disk.scratch_seen_at_measure == [False]  # free space measured after the scratch dir was removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0001"]
    assert _bytes(prev) == before
    verify_checkpoint(prev)


def test_needed_counts_the_payloads_already_written(tmp_path, monkeypatch):
    first = {"a.pt": {"w": torch.ones(200_000)}}
    FullDisk(monkeypatch, after=900_000)  # a.pt (800 kB) fits, b.pt does not
    with pytest.raises(CheckpointWriteError, match="while writing b.pt") as info:
        save_checkpoint(tmp_path / "c", {**first, "b.pt": {"w": torch.ones(200_000)}})
    monkeypatch.undo()
    whole = save_checkpoint(tmp_path / "whole", {**first, "b.pt": {"w": torch.ones(200_000)}})
    content = sum(p.stat().st_size for p in whole.iterdir())
    assert content <= info.value.needed <= content + 5 * _unit(tmp_path)
    assert info.value.filename == "b.pt" and not _scratch(tmp_path)


def test_replacing_a_checkpoint_on_a_full_disk_keeps_the_old_one(tmp_path, monkeypatch):
    ckpt = save_checkpoint(tmp_path / "last", payloads(1000))
    before = _bytes(ckpt)
    FullDisk(monkeypatch, after=100)
    with pytest.raises(CheckpointWriteError, match=r"failed while writing state\.pt: \[Errno 28\]"):
        save_checkpoint(ckpt, payloads())
    assert _bytes(ckpt) == before and sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_disk_full_writing_the_manifest(tmp_path, monkeypatch):
    FullDisk(monkeypatch, match=lambda p: p.name == "manifest.json")
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path / "c", payloads(10))
    assert info.value.filename == "manifest.json"
    assert str(info.value) == expected_message(tmp_path / "c", "writing manifest.json", info.value.needed)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_real_enospc_from_dev_full(tmp_path, monkeypatch):
    """The kernel's own ENOSPC (/dev/full), which Python's buffered file may report at
    a write, a flush or the close: each is caught with the file's name."""
    real_open = builtins.open
    monkeypatch.setattr(io, "open", lambda file, mode="r", *a, **k: real_open(
        "/dev/full" if Path(file).name == "state.pt" else file, "wb" if Path(file).name == "state.pt" else mode,
        *a, **k), raising=False)
    for n in (10, 300_000):  # small: buffered until flush; large: written at once
        with pytest.raises(CheckpointWriteError, match="while writing state.pt: .*No space left on device") as info:
            save_checkpoint(tmp_path / "c", payloads(n))
        assert info.value.errno == errno.ENOSPC and info.value.needed > n * 4 and info.value.free is not None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell files apart")
def test_eio_at_fsync_names_the_file(tmp_path, monkeypatch):
    prev = save_checkpoint(tmp_path / "a", payloads(10))
    before = _bytes(prev)
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/state.pt") and ".b.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(tmp_path / "b", payloads(10))
    e = info.value
    assert (e.errno, e.filename, e.needed, e.free) == (errno.EIO, "state.pt", None, None)
    assert str(e) == (f"checkpoint save to {tmp_path / 'b'} failed while syncing state.pt to disk (fsync): "
                      f"[Errno 5] Input/output error (EIO); {INTACT}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and _bytes(prev) == before


def test_no_room_for_the_scratch_dir(tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name.startswith("."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(CheckpointWriteError, match=r"while creating its scratch directory: \[Errno 28\]") as info:
        save_checkpoint(tmp_path / "ckpts" / "c", payloads(10))
    assert info.value.filename is None and info.value.needed > 40
    assert list((tmp_path / "ckpts").iterdir()) == []


def test_other_errors_keep_their_type(tmp_path):
    with pytest.raises((pickle.PicklingError, AttributeError), match="pickle"):  # not an OSError: as it was
        save_checkpoint(tmp_path / "c", {"state.pt": {"f": lambda: 0}})
    assert list(tmp_path.iterdir()) == []


def test_the_error_survives_pickling():  # sharded saves send it to every rank
    e = CheckpointWriteError("/x/c", errno.ENOSPC, "No space left on device", "state.pt", "writing state.pt",
                             12_345_678, 1_100_000, "/x", asynchronous=True)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is CheckpointWriteError and str(back) == str(e) and vars(back) == vars(e)
    assert str(e) == ("asynchronous checkpoint save to /x/c failed while writing state.pt: [Errno 28] No space left "
                      f"on device (ENOSPC); it needs about 12.3 MB, 1.1 MB free on /x; {INTACT}")


# -- asynchronous saves ----------------------------------------------------------------------
def test_async_save_raises_the_same_error(tmp_path, monkeypatch):
    with pytest.raises(CheckpointWriteError) as sync:
        FullDisk(monkeypatch, after=1000)
        save_checkpoint(tmp_path / "c", payloads())
    FullDisk(monkeypatch, after=1000)
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "c", payloads())
    with pytest.raises(CheckpointWriteError) as info:
        saver.wait()
    e = info.value
    assert e.asynchronous and (e.path, e.errno, e.filename, e.needed, e.free) == (
        sync.value.path, sync.value.errno, sync.value.filename, sync.value.needed, sync.value.free)
    assert str(e) == "asynchronous " + str(sync.value)
    assert isinstance(e.__cause__, CheckpointWriteError) and not e.__cause__.asynchronous
    assert saver.wait() == tmp_path / "c"  # raised once
    FullDisk(monkeypatch, after=1000)
    saver.save(tmp_path / "d", payloads())
    with pytest.raises(CheckpointWriteError, match="^asynchronous checkpoint save to .*d failed"):
        saver.save(tmp_path / "e", payloads())  # the next save raises it (and does not start)
    saver.save(tmp_path / "e", payloads())
    with pytest.raises(CheckpointWriteError, match="e failed while writing state.pt"):
        saver.close()  # and close() the last one's
    assert list(tmp_path.iterdir()) == []


# -- the Trainer -----------------------------------------------------------------------------
def _trainer(work: Path, **checkpoint) -> treadle.Trainer:
    return treadle.Trainer(TinyNet(), work_dir=work, train_dataloader=DataLoader(make_data(16), batch_size=8),
                           val_dataloader=DataLoader(make_data(8, seed=1), batch_size=8), metrics={},
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0,
                           log_writers=(), checkpoint=checkpoint)


class _FailSecond:
    """Disk full for epoch_0002's files; epoch_0001's bytes are kept when that save starts."""

    def __init__(self, monkeypatch, name: str = "epoch_0002") -> None:
        self.before: dict[str, bytes] | None = None

        def match(p: Path) -> bool:
            if p.parent.name.startswith(f".{name}.tmp-"):
                if self.before is None:
                    self.before = _bytes(p.parent.parent / "epoch_0001")
                return True
            return False
        FullDisk(monkeypatch, after=0, match=match)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_trainer_save_on_a_full_disk(tmp_path, monkeypatch, async_save):
    fail = _FailSecond(monkeypatch)
    work = tmp_path / "run"
    with pytest.raises(CheckpointWriteError) as info:
        _trainer(work, interval=1, async_save=async_save).fit()
    ckpt = work / "checkpoints" / "epoch_0002"
    assert str(info.value) == expected_message(ckpt, "writing state.pt", info.value.needed, asynchronous=async_save)
    assert _bytes(work / "checkpoints" / "epoch_0001") == fail.before
    verify_checkpoint(work / "checkpoints" / "epoch_0001")
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["epoch_0001"]


def test_best_weights_save_on_a_full_disk(tmp_path, monkeypatch):
    FullDisk(monkeypatch, match=lambda p: p.parent.name.startswith(".best_"))
    with pytest.raises(CheckpointWriteError, match=r"checkpoint save to .*best_val_loss_00000002 failed while "
                                                   r"writing state\.pt: \[Errno 28\]"):
        _trainer(tmp_path, interval=1, best="val/loss").fit()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best", "epoch_0001"]
    assert list((tmp_path / "checkpoints" / "best").iterdir()) == []


# -- the command line ------------------------------------------------------------------------
TINY = """\
model: {type: support.TinyNet}
train_dataloader:
  dataset: {type: support.make_data, n: 16}
  batch_size: 8
loss_fn: {type: CrossEntropyLoss}
optimizer: {type: SGD, lr: 0.1}
max_epochs: 2
log_writers: []
seed: 0
"""


def test_cli_exit_status_is_the_same_for_sync_and_async_saves(tmp_path, monkeypatch, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    results = []
    for mode in ("sync", "async"):
        with monkeypatch.context() as m:
            fail = _FailSecond(m)
            rc = main(["train", str(config), "--work-dir", str(tmp_path / mode), "--set", "checkpoint.interval=1",
                       f"checkpoint.async_save={'true' if mode == 'async' else 'false'}"])
        err = capsys.readouterr().err
        results.append(rc)
        lines = err.splitlines()
        ckpt = tmp_path / mode / "checkpoints" / "epoch_0002"
        assert len(lines) == 1 and "Traceback" not in err
        assert lines[0].startswith(f"treadle train: error: {'asynchronous ' if mode == 'async' else ''}"
                                   f"checkpoint save to {ckpt} failed while writing state.pt: [Errno 28] No space "
                                   "left on device (ENOSPC); it needs about ")
        assert lines[0].endswith(f", 1.1 MB free on {_mount(tmp_path)}; {INTACT}")
        assert _bytes(tmp_path / mode / "checkpoints" / "epoch_0001") == fail.before
    assert results == [1, 1]


# -- sharded (DCP) saves, one process --------------------------------------------------------
def test_sharded_save_on_a_full_disk(tmp_path, monkeypatch):
    from treadle.checkpoint.sharded import save_sharded, wait_pending

    state = {"model": {"w": torch.arange(100_000, dtype=torch.float32)}}
    prev = tmp_path / "a"
    save_sharded(prev, state, {"state.pt": {"iter": 1}})
    before = _bytes(prev)
    content = sum(len(b) for b in before.values())
    # the DCP shards (written by torch.distributed.checkpoint), then rank 0's own payload file
    for async_, match in ((False, ".distcp"), (True, ".distcp"), (False, "state.pt")):
        with monkeypatch.context() as m:
            # state.pt holds a few hundred bytes (fewer than 1000 on torch 2.6): it fails after 100
            FullDisk(m, after=1000 if match == ".distcp" else 100,
                     match=lambda p, s=match: p.name.endswith(s) and p.parent.name.startswith("."))
            with pytest.raises(CheckpointWriteError) as info:
                save_sharded(tmp_path / "b", state, {"state.pt": {"iter": 2}}, async_=async_).wait()
            wait_pending()
        e = info.value
        doing = "writing the DCP shards on rank 0" if match == ".distcp" else "writing state.pt"
        assert str(e) == expected_message(tmp_path / "b", doing, e.needed, asynchronous=async_)
        assert content - 4096 <= e.needed <= content + 4 * _unit(tmp_path)  # DCP's .metadata not counted
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and _bytes(prev) == before
