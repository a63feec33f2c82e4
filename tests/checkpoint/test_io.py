"""Tests for treadle.checkpoint.io: atomic save, verified load, discovery, retention."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from treadle.checkpoint import io as ckio
from treadle.checkpoint.io import (
    MANIFEST_NAME,
    CheckpointError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    cleanup_stale_tmp,
    find_latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_manifest,
    remove_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _state(value: float, n: int = 16) -> dict:
    return {"model": {"w": torch.full((n,), value), "b": torch.arange(3)}, "iter": int(value)}


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def _assert_equal(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


class Boom:
    """Pickling this raises: simulates a failure in the middle of writing a checkpoint."""

    def __reduce__(self):
        raise RuntimeError("boom while writing")


class Evil:
    """Pickles to a call of exec(): must never run on load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


# ----------------------------------------------------------------------------- round trip


def test_round_trip_nested_containers(tmp_path):
    state = {
        "model": {"layer.weight": torch.randn(4, 3), "layer.bias": torch.zeros(4, dtype=torch.float64)},
        "optim": {"state": {0: {"step": torch.tensor(7.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "epoch": 3, "loss": 0.25, "name": "run-a", "flags": [True, None, "x", 1.5, (1, 2)],
        "nested": {"a": {"b": [torch.arange(5, dtype=torch.int32), {"c": "d"}]}},
    }
    rng = {"torch": torch.get_rng_state(), "seed": 123}
    out = save_checkpoint(tmp_path / "iter_000120", {"state.pt": state, "rng_rank1.pt": rng},
                          meta={"epoch": 3, "iter": 120})
    assert out == tmp_path / "iter_000120"
    loaded = load_checkpoint(out)
    assert set(loaded) == {"state.pt", "rng_rank1.pt"}
    _assert_equal(loaded["state.pt"], state)
    _assert_equal(loaded["rng_rank1.pt"], rng)
    only = load_checkpoint(out, files=["rng_rank1.pt"])
    assert set(only) == {"rng_rank1.pt"}
    with pytest.raises(CheckpointError, match="nope.pt"):
        load_checkpoint(out, files=["nope.pt"])
    assert _hidden(tmp_path) == []  # temp dir renamed away, nothing left behind


def test_manifest_content(tmp_path):
    before = time.time()
    ckpt = save_checkpoint(tmp_path / "iter_000005", {"state.pt": _state(5.0), "extra.pt": [1, 2]},
                           meta={"epoch": 1, "iter": 5})
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert manifest == read_manifest(ckpt)
    assert manifest["format"] == "treadle-checkpoint" and manifest["format_version"] == ckio.FORMAT_VERSION
    assert manifest["meta"] == {"epoch": 1, "iter": 5}
    assert before <= manifest["created"] <= time.time()
    assert set(manifest["files"]) == {"state.pt", "extra.pt"}
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert sorted(p.name for p in ckpt.iterdir()) == ["extra.pt", MANIFEST_NAME, "state.pt"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsynced files through /proc/self/fd")
def test_everything_is_durable_before_the_rename_commits_it(tmp_path, monkeypatch):
    events = []
    fsync, rename = os.fsync, os.rename

    def recording_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def recording_rename(src, dst):
        events.append(("rename", str(src), str(dst)))
        return rename(src, dst)

    monkeypatch.setattr(os, "fsync", recording_fsync)  # also seen by the fsync threads
    monkeypatch.setattr(os, "rename", recording_rename)
    ckpt = save_checkpoint(tmp_path / "ckpts" / "iter_1", {"state.pt": _state(1.0), "extra.pt": [1, 2]})
    renames = [i for i, e in enumerate(events) if e[0] == "rename"]
    assert len(renames) == 1 and events[renames[0]][2] == str(ckpt)
    tmp = events[renames[0]][1]
    before = {e[1] for e in events[:renames[0]] if e[0] == "fsync"}
    # every file and the dir's entries, the manifest included, before the commit ...
    assert {f"{tmp}/state.pt", f"{tmp}/extra.pt", f"{tmp}/{MANIFEST_NAME}", tmp} <= before
    assert str(tmp_path) in before  # ... and the new checkpoints/ dir's own entry
    assert events[renames[0] + 1:] == [("fsync", str(ckpt.parent))]  # the rename itself, after


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsynced files through /proc/self/fd")
def test_a_payloads_fsync_starts_before_the_manifest_is_written(tmp_path, monkeypatch):
    started, fsync, write = threading.Event(), os.fsync, ckio._write_durably

    def recording_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/state.pt"):
            started.set()
        return fsync(fd)

    def waiting_write(path, *args, **kwargs):
        if path.name == MANIFEST_NAME:  # waits (in vain, without the early start) for state.pt's fsync
            assert started.wait(5), "state.pt's fsync had not begun when the manifest was written"
        return write(path, *args, **kwargs)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(ckio, "_write_durably", waiting_write)
    ckpt = save_checkpoint(tmp_path / "iter_1", {"state.pt": _state(1.0), "extra.pt": [1, 2]})
    verify_checkpoint(ckpt)


@pytest.mark.parametrize("name", ["../evil.pt", "a/b.pt", "", "..", ".hidden", MANIFEST_NAME, "x\\y.pt"])
def test_payload_names_validated(tmp_path, name):
    with pytest.raises(ValueError, match="payload name"):
        save_checkpoint(tmp_path / "ckpt", {name: 1})
    assert list(tmp_path.iterdir()) == []


def test_meta_must_be_json(tmp_path):
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path / "ckpt", {"state.pt": 1}, meta={"t": torch.zeros(1)})
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- atomicity


@pytest.mark.parametrize("second_name", ["iter_1", "iter_2"])
def test_exception_mid_write_keeps_previous(tmp_path, second_name):
    first = save_checkpoint(tmp_path / "iter_1", {"state.pt": _state(1.0)}, meta={"iter": 1})
    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path / second_name, {"state.pt": _state(2.0), "z.pt": Boom()}, meta={"iter": 2})
    assert _hidden(tmp_path) == []
    assert list_checkpoints(tmp_path) == [first]
    assert find_latest_checkpoint(tmp_path) == first
    assert torch.equal(load_checkpoint(first)["state.pt"]["model"]["w"], torch.full((16,), 1.0))


@pytest.mark.parametrize("exchange", [True, False])
def test_overwrite_replaces(tmp_path, monkeypatch, exchange):
    save_checkpoint(tmp_path / "latest", {"state.pt": _state(1.0), "old_only.pt": 1}, meta={"iter": 1})
    real_exchange, real_rename = ckio._rename_exchange, os.rename
    swapped, renamed = [], []

    def recording_exchange(src, dst):
        swapped.append(real_exchange(src, dst) if exchange else False)
        return swapped[-1]

    def recording_rename(src, dst):
        renamed.append((Path(src).name, Path(dst).name))
        return real_rename(src, dst)

    monkeypatch.setattr(ckio, "_rename_exchange", recording_exchange)
    monkeypatch.setattr(ckio.os, "rename", recording_rename)
    save_checkpoint(tmp_path / "latest", {"state.pt": _state(2.0)}, meta={"iter": 2})
    if exchange and swapped == [False]:
        pytest.skip("this filesystem has no renameat2(RENAME_EXCHANGE); the fallback case covers it")
    # The path each branch takes: one atomic swap, or old aside then new in.
    assert swapped == [exchange]
    if exchange:
        assert renamed == []
    else:
        (old, aside), (new, installed) = renamed
        assert old == "latest" and ".old-" in aside and new.startswith(".") and installed == "latest"
    loaded = load_checkpoint(tmp_path / "latest")
    assert set(loaded) == {"state.pt"} and loaded["state.pt"]["iter"] == 2
    assert read_manifest(tmp_path / "latest")["meta"] == {"iter": 2}
    assert _hidden(tmp_path) == []


def test_failed_install_in_fallback_restores_old(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "latest", {"state.pt": _state(1.0)}, meta={"iter": 1})
    monkeypatch.setattr(ckio, "_rename_exchange", lambda src, dst: False)
    real_rename, calls = os.rename, []

    def flaky_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old already moved aside; moving the new one in fails
            raise OSError("disk on fire")
        return real_rename(src, dst)

    monkeypatch.setattr(ckio.os, "rename", flaky_rename)
    with pytest.raises(OSError, match="disk on fire"):
        save_checkpoint(tmp_path / "latest", {"state.pt": _state(2.0)}, meta={"iter": 2})
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "latest")["state.pt"]["iter"] == 1
    assert _hidden(tmp_path) == []


def _run_child(code: str) -> subprocess.Popen:
    pythonpath = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in pythonpath if p))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env)


def _wait_for(pred, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"child exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("child did not reach the expected point")
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_mid_write_keeps_previous(tmp_path):
    """A saver killed while writing (one overwrite, one new name) never hides the old checkpoint."""
    ckdir = tmp_path / "checkpoints"
    first = save_checkpoint(ckdir / "iter_1", {"state.pt": _state(1.0)}, meta={"iter": 1})
    ready = tmp_path / "ready"
    proc = _run_child(f"""
        import threading, time, torch
        from pathlib import Path
        from treadle.checkpoint.io import save_checkpoint

        class Slow:  # blocks forever half-way through the checkpoint
            def __init__(self, tag): self.tag = tag
            def __reduce__(self):
                Path({str(ready)!r} + self.tag).touch()
                time.sleep(600)

        big = {{"w": torch.randn(1 << 20)}}
        for name in ("iter_1", "iter_2"):
            threading.Thread(target=save_checkpoint, daemon=True, args=(
                Path({str(ckdir)!r}) / name, {{"state.pt": big, "zz.pt": Slow(name)}}, {{"iter": 2}})).start()
        time.sleep(600)
    """)
    try:
        _wait_for(lambda: all(Path(f"{ready}{n}").exists() for n in ("iter_1", "iter_2")), proc)
        tmps = [p for p in ckdir.iterdir() if ".tmp-" in p.name]
        assert len(tmps) == 2 and all((p / "state.pt").stat().st_size > 4 << 20 for p in tmps)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list_checkpoints(ckdir) == [first]
    assert find_latest_checkpoint(ckdir) == first
    assert load_checkpoint(first)["state.pt"]["iter"] == 1
    assert sorted(cleanup_stale_tmp(ckdir)) == sorted(tmps)  # owner is dead: scratch removed
    assert _hidden(ckdir) == []


@pytest.mark.slow
def test_sigkill_between_fallback_renames_is_recovered(tmp_path):
    """Without atomic exchange, a crash between the two renames is repaired by cleanup_stale_tmp."""
    ckdir = tmp_path / "checkpoints"
    save_checkpoint(ckdir / "latest", {"state.pt": _state(1.0)}, meta={"iter": 1})
    proc = _run_child(f"""
        import os, signal
        from pathlib import Path
        from treadle.checkpoint import io as ckio
        ckio._rename_exchange = lambda src, dst: False
        real_rename, calls = os.rename, []
        def rename(src, dst):
            calls.append(src)
            if len(calls) == 2:  # old checkpoint is aside, new one not yet in place
                os.kill(os.getpid(), signal.SIGKILL)
            real_rename(src, dst)
        ckio.os.rename = rename
        ckio.save_checkpoint(Path({str(ckdir)!r}) / "latest", {{"state.pt": {{"iter": 2}}}}, {{"iter": 2}})
    """)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert find_latest_checkpoint(ckdir) is None  # the gap the fallback leaves...
    removed = cleanup_stale_tmp(ckdir)  # ...is closed by restoring the aside checkpoint
    assert [p.name for p in removed] and all(".tmp-" in p.name for p in removed)
    assert find_latest_checkpoint(ckdir) == ckdir / "latest"
    assert load_checkpoint(ckdir / "latest")["state.pt"]["iter"] == 1
    assert _hidden(ckdir) == []


@pytest.mark.slow
def test_cleanup_stale_tmp_is_conservative(tmp_path):
    host, me = ckio._host_tag(), os.getpid()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live_fresh = tmp_path / f".iter_3.tmp-{host}-{me}-deadbeef"
    other_host = tmp_path / f".iter_3.tmp-otherhost-{dead.pid}-deadbeef"
    dead_owner = tmp_path / f".iter_3.tmp-{host}-{dead.pid}-deadbeef"
    reused_pid = tmp_path / f".iter_4.tmp-{host}-{me}-cafebabe"  # our pid, but older than us
    stale_file = tmp_path / f".model.safetensors.tmp-{host}-{dead.pid}-0badf00d"
    for d in (live_fresh, other_host, dead_owner, reused_pid):
        d.mkdir()
        (d / "state.pt").write_bytes(b"x")
    stale_file.write_bytes(b"x")
    os.utime(reused_pid, (0, 0))  # last touched long before this process started
    knows_start = ckio._process_start_time(me) is not None  # Linux /proc
    removed = cleanup_stale_tmp(tmp_path)
    expected = {dead_owner, stale_file} | ({reused_pid} if knows_start else set())
    assert set(removed) == expected
    assert live_fresh.exists() and other_host.exists()


# ----------------------------------------------------------------------------- corruption


def _two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    a = save_checkpoint(tmp_path / "iter_1", {"state.pt": _state(1.0)}, meta={"iter": 1})
    b = save_checkpoint(tmp_path / "iter_2", {"state.pt": _state(2.0)}, meta={"iter": 2})
    return a, b


def test_truncated_file_detected_and_skipped(tmp_path):
    a, b = _two_checkpoints(tmp_path)
    bad = b / "state.pt"
    bad.write_bytes(bad.read_bytes()[:-100])
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(bad)) + ".*size"):
        load_checkpoint(b)
    with pytest.raises(CorruptCheckpointError, match="truncated or unreadable"):
        load_checkpoint(b, verify=False)  # even unverified, a torn file is reported as corrupt
    verify_checkpoint(a)
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(bad))):
        verify_checkpoint(b)
    with pytest.warns(ckio.CheckpointWarning, match=re.escape(str(bad))):
        assert find_latest_checkpoint(tmp_path) == a


def test_flipped_byte_detected_and_skipped(tmp_path):
    a, b = _two_checkpoints(tmp_path)
    bad = b / "state.pt"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(bad)) + ".*sha256"):
        verify_checkpoint(b)
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        load_checkpoint(b)
    with pytest.warns(ckio.CheckpointWarning, match=re.escape(str(bad))):
        assert find_latest_checkpoint(tmp_path) == a


def test_missing_or_bad_manifest(tmp_path):
    a, b = _two_checkpoints(tmp_path)
    (b / MANIFEST_NAME).unlink()  # partial: payloads but no commit record
    with pytest.raises(CorruptCheckpointError, match="manifest.json: missing"):
        load_checkpoint(b)
    assert list_checkpoints(tmp_path) == [a]
    with pytest.warns(ckio.CheckpointWarning, match=re.escape(str(b))):
        assert find_latest_checkpoint(tmp_path) == a
    remove_checkpoint(b)
    c = save_checkpoint(tmp_path / "iter_3", {"state.pt": 3}, meta={"iter": 3})
    (c / MANIFEST_NAME).write_text("{not json")
    with pytest.warns(ckio.CheckpointWarning, match=re.escape(str(c / MANIFEST_NAME))):
        assert find_latest_checkpoint(tmp_path) == a
    (a / "state.pt").unlink()
    with pytest.warns(ckio.CheckpointWarning, match="missing"):
        assert find_latest_checkpoint(tmp_path) is None
    assert find_latest_checkpoint(tmp_path / "does-not-exist") is None


# ----------------------------------------------------------------------------- safety


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"
    ckpt = save_checkpoint(tmp_path / "iter_1", {"state.pt": {"model": {}, "x": Evil(marker)}})
    verify_checkpoint(ckpt)  # hashes are fine: the danger is in the content
    with pytest.raises(UnsafeCheckpointError) as err:
        load_checkpoint(ckpt)
    msg = str(err.value)
    assert str(ckpt / "state.pt") in msg and "only tensors and plain containers" in msg
    assert "nothing in the file was executed" in msg and "exec" in msg  # torch's reason
    legacy = tmp_path / "evil.pth"
    torch.save(Evil(marker), legacy)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(str(legacy))):
        load_checkpoint(legacy)
    assert not marker.exists()


def test_legacy_single_file(tmp_path):
    f = tmp_path / "model.pt"
    torch.save({"w": torch.arange(4.0)}, f)
    loaded = load_checkpoint(f)
    assert list(loaded) == ["state.pt"] and torch.equal(loaded["state.pt"]["w"], torch.arange(4.0))
    f.write_bytes(f.read_bytes()[:-40])
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(f))):
        load_checkpoint(f)


# ----------------------------------------------------------------------------- discovery & retention


def test_list_orders_by_meta_iter_and_ignores_scratch(tmp_path):
    for it in (10, 9, 100):  # names and creation order disagree with iteration order
        save_checkpoint(tmp_path / f"ckpt_{it}", {"state.pt": it}, meta={"iter": it})
    (tmp_path / ".ckpt_200.tmp-h-1-deadbeef").mkdir()
    (tmp_path / "tensorboard").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_9", "ckpt_10", "ckpt_100"]
    assert find_latest_checkpoint(tmp_path) == tmp_path / "ckpt_100"
    other = tmp_path / "no_iter"
    for name in ("b", "a"):  # fallback: creation time
        save_checkpoint(other / name, {"state.pt": 0}, meta={"epoch": 1})
    assert [p.name for p in list_checkpoints(other)] == ["b", "a"]


def test_prune_keeps_newest_and_protected(tmp_path):
    ckpts = [save_checkpoint(tmp_path / f"iter_{i}", {"state.pt": i}, meta={"iter": i}) for i in range(1, 6)]
    removed = prune_checkpoints(tmp_path, keep_last=2, protect=[ckpts[0]])
    assert removed == ckpts[1:3]
    assert list_checkpoints(tmp_path) == [ckpts[0], ckpts[3], ckpts[4]]
    assert prune_checkpoints(tmp_path, keep_last=2, protect=[ckpts[0]]) == []
    assert prune_checkpoints(tmp_path, keep_last=0) == [ckpts[0], ckpts[3], ckpts[4]]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep_last=-1)


def test_remove_checkpoint_refuses_non_checkpoints(tmp_path):
    (tmp_path / "work" / "sub").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="refusing"):
        remove_checkpoint(tmp_path / "work")
    assert (tmp_path / "work" / "sub").exists()
    ckpt = save_checkpoint(tmp_path / "iter_1", {"state.pt": 1})
    remove_checkpoint(ckpt)
    assert not ckpt.exists() and _hidden(tmp_path) == []


def test_prune_with_fewer_checkpoints_than_keep_removes_nothing(tmp_path):
    """Regression: keep_last larger than the count must not wrap around."""
    for i in (1, 2):
        save_checkpoint(tmp_path / f"iter_{i}", {"state.pt": {"i": i}}, meta={"iter": i})
    assert prune_checkpoints(tmp_path, keep_last=3) == []
    assert len(list_checkpoints(tmp_path)) == 2
