"""Listing and pruning a directory of checkpoints: the order they were saved in, and
pruning that keeps to one run's checkpoints."""

from __future__ import annotations

import pytest

from treadle.checkpoint.directory import find_latest_checkpoint, list_checkpoints, prune_checkpoints
from treadle.checkpoint.io import save_checkpoint


def _save(directory, name, it, run=None):
    meta = {"iter": it} if run is None else {"iter": it, "run": run}
    return save_checkpoint(directory / name, {"state.pt": it}, meta=meta)


def test_created_order_is_the_order_of_saving_whatever_the_iterations(tmp_path):
    for name, it in (("late", 400), ("early", 10), ("middle", 200)):
        _save(tmp_path, name, it)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["early", "middle", "late"]
    assert [p.name for p in list_checkpoints(tmp_path, order="created")] == ["late", "early", "middle"]
    assert find_latest_checkpoint(tmp_path).name == "late"
    assert find_latest_checkpoint(tmp_path, order="created").name == "middle"
    with pytest.raises(ValueError, match="order='newest'; expected 'iter' or 'created'"):
        list_checkpoints(tmp_path, order="newest")


def test_prune_with_a_run_removes_only_that_runs_checkpoints(tmp_path):
    old = [_save(tmp_path, f"old_{i}", i, run="a") for i in (100, 200)]
    legacy = _save(tmp_path, "legacy", 300)  # saved before runs were recorded
    mine = [_save(tmp_path, f"mine_{i}", i, run="b") for i in (1, 2, 3)]
    removed = prune_checkpoints(tmp_path, keep_last=1, run="b", order="created")
    assert removed == mine[:2]
    assert sorted(p.name for p in list_checkpoints(tmp_path)) == sorted(p.name for p in [*old, legacy, mine[2]])
    # Without a run, every checkpoint counts (by iteration here): the old behaviour.
    assert prune_checkpoints(tmp_path, keep_last=1) == [mine[2], *old]
    assert list_checkpoints(tmp_path) == [legacy]


def test_another_tools_directories_are_neither_listed_nor_removed(tmp_path):
    import json

    from treadle.checkpoint.directory import remove_checkpoint
    from treadle.checkpoint.io import CheckpointError

    mine = _save(tmp_path, "mine", 1, run="r")
    foreign = tmp_path / "exported"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({"format": "some-other-tool", "files": []}))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    assert list_checkpoints(tmp_path) == [mine]
    assert prune_checkpoints(tmp_path, keep_last=0) == [mine]
    for path, reason in ((foreign, "is not a treadle checkpoint manifest"), (notes, "has no manifest.json")):
        with pytest.raises(CheckpointError, match=f"refusing to remove .*{path.name}: .*{reason}"):
            remove_checkpoint(path)
    assert (foreign / "manifest.json").exists() and (notes / "todo.txt").read_text() == "keep me"
    partial = tmp_path / "iter_9"  # payloads of a save that never wrote its manifest: removable
    partial.mkdir()
    (partial / "state.pt").write_bytes(b"x")
    remove_checkpoint(partial)
    assert not partial.exists()


# -- the checkpoint directory made before a run trains ---------------------------------
def test_make_checkpoint_dir_creates_it_and_syncs_each_new_entry_before_the_first_commit(tmp_path, monkeypatch):
    import errno
    import os
    import threading

    from treadle import fsutil
    from treadle.checkpoint.directory import make_checkpoint_dir
    from treadle.checkpoint.io import CheckpointWriteError

    synced, gate = [], threading.Event()
    real = fsutil.fsync_dir

    def slow_fsync_dir(path, **kw):
        gate.wait(5)
        synced.append(os.fspath(path))
        return real(path, **kw)
    real_rename = os.rename

    def recording_rename(src, dst):
        synced.append(("rename", os.fspath(dst)))
        return real_rename(src, dst)
    monkeypatch.setattr(fsutil, "fsync_dir", slow_fsync_dir)
    monkeypatch.setattr("treadle.checkpoint.directory.fsync_dir", slow_fsync_dir)
    monkeypatch.setattr(os, "rename", recording_rename)
    ckpts = tmp_path / "run" / "checkpoints"
    make_checkpoint_dir(ckpts / "best")
    assert (ckpts / "best").is_dir() and synced == []  # the fsyncs wait on the other threads
    gate.set()
    _save(ckpts / "best", "a", 1)  # its commit waits for them
    commit = synced.index(("rename", str(ckpts / "best" / "a")))
    assert {str(ckpts), str(tmp_path / "run"), str(tmp_path)} <= set(synced[:commit])
    make_checkpoint_dir(ckpts)  # exists: probed, nothing to sync
    assert fsutil._pending == []

    def failing(path, **kw):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
    monkeypatch.setattr("treadle.checkpoint.directory.fsync_dir", failing)
    make_checkpoint_dir(tmp_path / "other" / "checkpoints")
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        _save(tmp_path / "other" / "checkpoints", "b", 2)  # never committed on an entry that may be lost
    assert list((tmp_path / "other" / "checkpoints").iterdir()) == []


def test_make_checkpoint_dir_refuses_a_file_in_the_way(tmp_path):
    from treadle.checkpoint.directory import make_checkpoint_dir
    from treadle.checkpoint.io import CheckpointError

    (tmp_path / "checkpoints").write_text("x")
    with pytest.raises(CheckpointError, match="checkpoints is not a directory"):
        make_checkpoint_dir(tmp_path / "checkpoints" / "best")


def test_prune_with_no_more_entries_than_it_keeps_reads_no_manifest(tmp_path, monkeypatch):
    import treadle.checkpoint.directory as directory

    saved = [_save(tmp_path, f"c{i}", i, run="a") for i in range(3)]
    (tmp_path / ".c3.tmp-host-1-x").mkdir()  # a scratch dir does not count

    def no_reading(path):
        raise AssertionError(f"read {path}")
    monkeypatch.setattr(directory, "read_manifest", no_reading)
    assert prune_checkpoints(tmp_path, keep_last=3, run="a", order="created") == []
    monkeypatch.undo()
    assert prune_checkpoints(tmp_path, keep_last=2, run="a", order="created") == [saved[0]]
