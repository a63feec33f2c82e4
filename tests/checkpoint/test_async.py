"""Asynchronous checkpoint saves: the same directory as a synchronous save, the state
as it was at the call, one save at a time, and no error ever lost."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
import treadle.checkpoint.async_save as async_save
from treadle.checkpoint.async_save import AsyncCheckpointer
from treadle.checkpoint.io import (CheckpointError, list_checkpoints, load_checkpoint, read_manifest,
                                   save_checkpoint, verify_checkpoint)

from support import DEVICE, TinyNet, make_data


def _payloads() -> dict:
    """A trained model's and optimizer's state, with the awkward cases: a view of a
    shared storage, tied weights, empty tensors of two dtypes, a Parameter, tuples."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(5, 6)).sum().backward()
        opt.step()
        opt.zero_grad()
    base = torch.arange(12.0)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "base": base, "view": base[3:7],
             "tied": [model[0].weight.detach(), model[0].weight.detach()], "empty_f": torch.empty(0),
             "empty_i": torch.empty(0, dtype=torch.long), "param": nn.Parameter(torch.ones(2)),
             "meta": (1, 2.5, "x", None), "od": OrderedDict(a=torch.ones(1))}
    return {"state.pt": state, "rng_rank0.pt": {"torch": torch.get_rng_state(), "python": (3, (1, 2), None)}}


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_async_save_is_byte_for_byte_a_sync_save(tmp_path):
    payloads = _payloads()
    sync = save_checkpoint(tmp_path / "sync", payloads, meta={"iter": 7})
    with AsyncCheckpointer() as saver:
        path = saver.save(tmp_path / "async", payloads, meta={"iter": 7})
        assert saver.wait() == path
    verify_checkpoint(path)
    for name in payloads:
        assert _sha(path / name) == _sha(sync / name), name
    assert read_manifest(path)["files"] == read_manifest(sync)["files"]
    assert read_manifest(path)["meta"] == {"iter": 7}
    loaded = load_checkpoint(path)["state.pt"]
    assert torch.equal(loaded["view"], torch.arange(3.0, 7.0))
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["tied"][0] is loaded["tied"][1] or torch.equal(loaded["tied"][0], loaded["tied"][1])
    assert isinstance(loaded["param"], nn.Parameter) and loaded["od"]["a"].item() == 1.0


def test_the_snapshot_is_taken_at_the_call(tmp_path, monkeypatch):
    gate = threading.Event()
    real = async_save.save_checkpoint

    def slow(*args, **kwargs):
        assert gate.wait(10)
        return real(*args, **kwargs)
    monkeypatch.setattr(async_save, "save_checkpoint", slow)
    model = TinyNet()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "ckpt", {"state.pt": {"model": model.state_dict()}})
    assert saver.in_flight
    with torch.no_grad():  # training goes on while the write has not even started
        for p in model.parameters():
            p.add_(1.0)
    gate.set()
    saver.wait()
    got = load_checkpoint(tmp_path / "ckpt")["state.pt"]["model"]
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not torch.equal(got["fc1.weight"], model.fc1.weight.detach())


def test_a_failing_write_is_raised_at_the_next_wait_and_leaves_nothing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(async_save, "save_checkpoint", broken)
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "ckpt", {"state.pt": {"x": torch.ones(2)}})
    with pytest.raises(CheckpointError, match="asynchronous save of .*ckpt failed: OSError: disk full") as info:
        saver.wait()
    assert isinstance(info.value.__cause__, OSError)
    assert saver.wait() == tmp_path / "ckpt"  # raised once, then cleared
    saver.save(tmp_path / "ckpt2", {"state.pt": {"x": torch.ones(2)}})
    with pytest.raises(CheckpointError, match="disk full"):  # the next save raises it too
        saver.save(tmp_path / "ckpt3", {"state.pt": {"x": torch.ones(2)}})
    assert list(tmp_path.iterdir()) == []


def test_an_on_done_error_counts_as_the_saves(tmp_path):
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "ckpt", {"state.pt": {"x": torch.ones(2)}}, on_done=lambda p: 1 / 0)
    with pytest.raises(CheckpointError, match="ZeroDivisionError"):
        saver.close()
    verify_checkpoint(tmp_path / "ckpt")  # the checkpoint itself is complete


def test_bad_arguments_fail_at_the_call_before_any_copy(tmp_path):
    saver = AsyncCheckpointer()
    with pytest.raises(ValueError, match="invalid checkpoint payload name"):
        saver.save(tmp_path / "c", {"../x.pt": {}})
    with pytest.raises(TypeError, match="JSON-serialisable"):
        saver.save(tmp_path / "c", {"state.pt": {}}, meta={"x": object()})
    assert not saver.in_flight and list(tmp_path.iterdir()) == []


def test_one_save_at_a_time_in_call_order(tmp_path, monkeypatch):
    gate = threading.Event()
    real = async_save.save_checkpoint
    order: list[str] = []

    def slow(path, *args, **kwargs):
        if path.name == "a":
            assert gate.wait(10)
        order.append(path.name)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(async_save, "save_checkpoint", slow)
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "a", {"state.pt": {"x": torch.ones(1)}})
    second = threading.Thread(target=saver.save, args=(tmp_path / "b", {"state.pt": {"x": torch.zeros(1)}}))
    second.start()
    second.join(0.3)
    assert second.is_alive() and order == []  # b waits for a
    gate.set()
    second.join(10)
    saver.wait()
    assert order == ["a", "b"] and [p.name for p in list_checkpoints(tmp_path)] == ["a", "b"]


def test_buffers_are_reused_when_the_layout_is_the_same(tmp_path):
    model = TinyNet()
    saver = AsyncCheckpointer()
    saver.save(tmp_path / "a", {"state.pt": model.state_dict()})
    saver.wait()
    first = [b.data_ptr() for b, _ in saver._buffers]
    with torch.no_grad():
        model.fc1.weight.fill_(3.0)
    saver.save(tmp_path / "b", {"state.pt": model.state_dict()})
    saver.wait()
    assert [b.data_ptr() for b, _ in saver._buffers] == first  # no new allocation
    assert torch.equal(load_checkpoint(tmp_path / "b")["state.pt"]["fc1.weight"], torch.full((16, 6), 3.0))
    assert not torch.equal(load_checkpoint(tmp_path / "a")["state.pt"]["fc1.weight"], torch.full((16, 6), 3.0))


def test_reserve_allocates_the_first_saves_buffers_in_the_background(tmp_path):
    payloads = _payloads()
    sync = save_checkpoint(tmp_path / "sync", payloads)
    saver = AsyncCheckpointer()
    saver.reserve(payloads)
    assert saver._reserving is not None  # the allocation runs in its own thread
    saver._wait_reserved()
    reserved = [b.data_ptr() for b, _ in saver._buffers]
    # one buffer per distinct storage: the view shares base's, the tied weights one
    storages = {t.untyped_storage().data_ptr() for t in _tensors(payloads) if t.untyped_storage().nbytes()}
    assert len(reserved) == len(storages) + sum(1 for t in _tensors(payloads) if not t.untyped_storage().nbytes())
    saver.save(tmp_path / "async", payloads)
    saver.wait()
    assert [b.data_ptr() for b, _ in saver._buffers] == reserved  # the first save allocated nothing
    for name in payloads:
        assert _sha(tmp_path / "async" / name) == _sha(sync / name), name
    saver.reserve(payloads)  # buffers exist already: nothing to do
    assert saver._reserving is None


def test_a_reservation_for_another_layout_is_not_used_wrongly(tmp_path):
    small, big = TinyNet().state_dict(), nn.Linear(40, 30).state_dict()
    saver = AsyncCheckpointer()
    saver.reserve({"state.pt": small})
    saver.save(tmp_path / "a", {"state.pt": big})  # waits for the reservation, then allocates
    saver.wait()
    assert torch.equal(load_checkpoint(tmp_path / "a")["state.pt"]["weight"], big["weight"])


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


# -- through the Trainer ----------------------------------------------------------------------
def _assert_equal(a, b, where):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_equal(a[k], b[k], (*where, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, (*where, i))
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


def _run(tmp_path, name, **checkpoint):
    torch.manual_seed(0)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path / name, train_dataloader=DataLoader(make_data(32), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=1e-2), max_iters=20, seed=0,
                        log_writers=("jsonl",), checkpoint=dict(interval=4, by_epoch=False, keep=2, **checkpoint))
    t.strategy.run_id = "same-run"  # recorded in every checkpoint: the same for both, so that their bytes compare
    t.fit()
    return t


def test_trainer_async_checkpoints_equal_sync_ones_and_prune(tmp_path):
    sync = _run(tmp_path, "sync")
    run = _run(tmp_path, "async", async_save=True)
    assert run.hooks[-1]._saver is not None and not run.hooks[-1]._saver.in_flight  # fit() waited
    names = [p.name for p in list_checkpoints(tmp_path / "async" / "checkpoints")]
    assert names == [p.name for p in list_checkpoints(tmp_path / "sync" / "checkpoints")] == ["iter_00000016", "iter_00000020"]
    for name in names:
        a, s = tmp_path / "async" / "checkpoints" / name, tmp_path / "sync" / "checkpoints" / name
        verify_checkpoint(a)
        assert set(read_manifest(a)["files"]) == set(read_manifest(s)["files"])
        for file in read_manifest(a)["files"]:
            if file.startswith("rng_rank"):  # its log window holds this run's timings: the rest must be equal
                sa, ss = (torch.load(d / file, weights_only=True, map_location="cpu") for d in (a, s))
                windows = [st["rank_state"]["log_windows"] for st in (sa, ss)]
                assert windows[0]["numbers"].keys() == windows[1]["numbers"].keys()
                for w in windows:
                    del w["numbers"]
                _assert_equal(sa, ss, (name, file))
            elif DEVICE.type == "cpu":
                assert _sha(a / file) == _sha(s / file), (name, file)
            else:  # the sync save records each tensor's device, the async one saved host copies
                # (treadle/checkpoint/async_save.py): the same values, bit for bit
                _assert_equal(*(torch.load(d / file, weights_only=True, map_location="cpu") for d in (a, s)),
                              (name, file))
    assert torch.equal(run.module.fc1.weight, sync.module.fc1.weight)


def test_trainer_reserves_the_buffers_after_the_first_iteration(tmp_path, monkeypatch):
    reserved, at_iter = [], []
    wait_reserved, reserve = AsyncCheckpointer._wait_reserved, AsyncCheckpointer.reserve

    def spy_reserve(self, payloads):
        at_iter.append(payloads["state.pt"]["loop"]["iter"])
        reserve(self, payloads)

    def spy_wait(self):
        pending = self._reserving is not None
        wait_reserved(self)
        if pending:
            reserved.append([b.data_ptr() for b, _ in self._buffers])

    monkeypatch.setattr(AsyncCheckpointer, "reserve", spy_reserve)
    monkeypatch.setattr(AsyncCheckpointer, "_wait_reserved", spy_wait)
    run = _run(tmp_path, "async", async_save=True)
    assert at_iter == [1]  # right after the first step
    assert len(reserved) == 1 and [b.data_ptr() for b, _ in run.hooks[-1]._saver._buffers] == reserved[0]


def test_trainer_resumes_from_an_async_checkpoint(tmp_path):
    _run(tmp_path, "async", async_save=True)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path / "async", train_dataloader=DataLoader(make_data(32), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=1e-2), max_iters=24, seed=0,
                        log_writers=("jsonl",), resume=True, checkpoint=dict(interval=4, by_epoch=False, async_save=True))
    t.fit()
    assert t.state.iter == 24 and (tmp_path / "async" / "checkpoints" / "iter_00000024").is_dir()


def test_trainer_async_write_error_is_raised_by_fit(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("read-only file system")
    monkeypatch.setattr(async_save, "save_checkpoint", broken)
    with pytest.raises(CheckpointError, match="read-only file system"):
        _run(tmp_path, "async", async_save=True)


def test_another_save_waits_for_the_one_in_flight(tmp_path, monkeypatch):
    """A save outside the hook (e.g. on preemption) never runs beside an async one."""
    gate = threading.Event()
    real = async_save.save_checkpoint
    done: list[str] = []

    def slow(path, *args, **kwargs):
        assert gate.wait(10)
        out = real(path, *args, **kwargs)
        done.append(path.name)
        return out
    monkeypatch.setattr(async_save, "save_checkpoint", slow)
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(8), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=2,
                        log_writers=(), checkpoint=dict(interval=None, async_save=True))
    hook = t.hooks[-1]
    hook._save_periodic(t, "iter_00000000")
    other = threading.Thread(target=t.save_checkpoint, args=(tmp_path / "checkpoints" / "manual",))
    other.start()
    other.join(0.3)
    assert other.is_alive() and done == []
    gate.set()
    other.join(10)
    assert done == ["iter_00000000"] and (tmp_path / "checkpoints" / "manual").is_dir()


def test_checkpoint_config_rejects_a_non_bool_async_save():
    with pytest.raises(TypeError, match="async_save"):
        treadle.Trainer(TinyNet(), checkpoint=dict(async_save="yes"))
