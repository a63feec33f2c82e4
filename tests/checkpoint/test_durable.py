"""treadle.checkpoint.durable: hashing a file as it is written, past a threshold by a
second thread reading it back (and what save_checkpoint records from that)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import threading

import pytest
import torch

from treadle.checkpoint import durable
from treadle.checkpoint.durable import _HashingWriter
from treadle.checkpoint.io import MANIFEST_NAME, CheckpointWriteError, save_checkpoint, verify_checkpoint


def _chunks(seed: int = 0) -> list[bytes]:
    """About 3.5 MB in pieces from 1 byte to 1.5 MB (the reader reads 1 MB at a time)."""
    rng = random.Random(seed)
    sizes = [1, 7, 4096, 1_500_000, 3, 900_000, 65_536, 1_048_576, 10]
    return [rng.randbytes(n) for n in sizes]


def _read_threads(monkeypatch) -> list[str]:
    """The names of the threads that call os.pread from now on."""
    names: list[str] = []
    real = os.pread

    def pread(fd, n, offset):
        names.append(threading.current_thread().name)
        return real(fd, n, offset)
    monkeypatch.setattr(os, "pread", pread)
    return names


@pytest.mark.parametrize("after", [0, 5000, 2_000_000, 10**9])
def test_the_digest_is_of_every_byte_written_wherever_the_reader_takes_over(tmp_path, monkeypatch, after):
    readers = _read_threads(monkeypatch)
    data = _chunks()
    with open(tmp_path / "f", "x+b") as f:
        w = _HashingWriter(f, read_back_after=after)
        for chunk in data:
            w.write(memoryview(chunk))  # torch's zip writer hands views
        digest = w.hexdigest()
        w.stop()
    whole = b"".join(data)
    assert digest == hashlib.sha256(whole).hexdigest() and w.size == len(whole)
    assert (tmp_path / "f").read_bytes() == whole
    if after < len(whole):  # the rest was read back on the hashing thread, never on this one
        assert w.reader is not None and readers and set(readers) == {"treadle-hash"}
    else:
        assert w.reader is None and readers == []


def test_stop_ends_the_reading_thread_without_a_digest(tmp_path):
    with open(tmp_path / "f", "x+b") as f:
        w = _HashingWriter(f, read_back_after=10)
        for chunk in _chunks():
            w.write(chunk)
        thread = w.reader._thread
        w.stop()
    assert not thread.is_alive()


def test_a_read_back_error_is_raised_by_the_digest(tmp_path, monkeypatch):
    def pread(fd, n, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "pread", pread)
    with open(tmp_path / "f", "x+b") as f:
        w = _HashingWriter(f, read_back_after=10)
        for chunk in _chunks():
            w.write(chunk)
        with pytest.raises(OSError) as info:
            w.hexdigest()
        w.stop()
    assert info.value.errno == errno.EIO


def _payloads() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"state.pt": {"w": torch.randn(600_000, generator=g), "step": 3}, "small.pt": {"x": torch.ones(3)}}


def test_a_large_payload_read_back_is_recorded_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "_READ_BACK_AFTER", 100_000)  # state.pt (2.4 MB) is read back, small.pt not
    readers = _read_threads(monkeypatch)
    path = save_checkpoint(tmp_path / "c", _payloads())
    assert readers and set(readers) == {"treadle-hash"}
    files = json.loads((path / MANIFEST_NAME).read_text())["files"]
    for name in ("state.pt", "small.pt"):
        data = (path / name).read_bytes()
        assert files[name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    verify_checkpoint(path)
    assert torch.equal(torch.load(path / "state.pt", weights_only=True)["w"], _payloads()["state.pt"]["w"])


def test_a_read_back_error_fails_the_save_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "_READ_BACK_AFTER", 100_000)
    previous = save_checkpoint(tmp_path / "c", {"state.pt": {"x": torch.zeros(2)}})
    before = {p.name: p.read_bytes() for p in previous.iterdir()}

    def pread(fd, n, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "pread", pread)
    with pytest.raises(CheckpointWriteError, match="while writing state.pt: .*EIO") as info:
        save_checkpoint(tmp_path / "c", _payloads())
    assert info.value.errno == errno.EIO
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no scratch dir left
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before
    assert not [t for t in threading.enumerate() if t.name == "treadle-hash"]


def test_a_save_failing_after_the_reader_started_stops_it(tmp_path, monkeypatch):
    monkeypatch.setattr(durable, "_READ_BACK_AFTER", 1000)

    def save(obj, f):  # torch.save writing 2 MB, then failing (as on a bad tensor)
        for _ in range(2):
            f.write(b"\0" * 1_000_000)
        raise RuntimeError("boom")
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(tmp_path / "c", {"state.pt": {"x": 1}})
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name == "treadle-hash"]
