"""Sharded (DCP) checkpoints: 2 processes <-> 1 process, async, integrity, consolidation."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from torch.utils._pytree import tree_map_only

from dist_support import run_ranks
from support import assert_state_equal
from treadle.checkpoint import io
from treadle.compat import reshard_problem
from treadle.checkpoint.dcp_safe import _SafeReader
from treadle.checkpoint.io import CheckpointWriteError
from treadle.checkpoint.sharded import (
    CheckpointError,
    consolidate,
    is_sharded_checkpoint,
    load_sharded,
    save_sharded,
    wait_pending,
)
from treadle.strategies.fsdp import FSDPStrategy


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3))


def batch(step: int, rank: int = 0, world: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    n = 8 // world
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def step(model: nn.Module, opt: torch.optim.Optimizer, i: int, rank: int = 0, world: int = 1) -> None:
    x, y = batch(i, rank, world)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def build(strategy: FSDPStrategy, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = strategy.setup_model(make_model(seed))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def sharded_state(strategy: FSDPStrategy, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"model": strategy.get_model_state(model), "optim": strategy.get_optim_state(model, opt)}


def full_state(strategy: FSDPStrategy, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """A copy of the full model + optimizer state (rank 0; {} elsewhere with several ranks)."""
    optim = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # Plain tensors (e.g. Adam's step) may be the live ones: copy before training on.
    return tree_map_only(torch.Tensor, torch.clone, {"model": strategy.get_full_model_state(model), "optim": optim})


def load_into(strategy: FSDPStrategy, model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> dict:
    state, payloads = load_sharded(path, sharded_state(strategy, model, opt))
    strategy.set_model_state(model, state["model"])
    strategy.set_optim_state(model, opt, state["optim"])
    return payloads


def two_rank_worker(rank: int, world: int, root: str) -> dict:
    root_path = Path(root)
    strategy = FSDPStrategy()
    strategy.setup()
    out: dict = {}
    # Load the checkpoint one process wrote (a different init: the load must overwrite it).
    model, opt = build(strategy, seed=1)
    payloads = load_into(strategy, model, opt, root_path / "one")
    out["from_one"], out["payloads"] = full_state(strategy, model, opt), payloads
    step(model, opt, 10, rank, world)  # continue training on 2 ranks after the 1-process save
    out["from_one_continued"] = full_state(strategy, model, opt)
    # Save the same state sync and async; keep training while the async save runs.
    step(model, opt, 11, rank, world)
    out["saved"] = full_state(strategy, model, opt)
    rng = {f"rng_rank{rank}.pt": {"torch": torch.tensor([rank])}}
    strategy.save_sharded_checkpoint(root_path / "sync", sharded_state(strategy, model, opt),
                                     {"state.pt": {"iter": 2}, **rng}, {"iter": 2}).wait()
    pending = strategy.save_sharded_checkpoint(root_path / "async", sharded_state(strategy, model, opt),
                                               {"state.pt": {"iter": 2}, **rng}, {"iter": 2}, async_=True)
    step(model, opt, 12, rank, world)  # mutates parameters and optimizer state in place meanwhile
    assert not (root_path / "async").exists()  # committed by wait() only
    assert pending.wait() == root_path / "async"
    out["continued"] = full_state(strategy, model, opt)
    # A failing save (rank 0 cannot pickle a payload) leaves the previous checkpoint alone.
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (root_path / "sync").iterdir())
    try:
        save_sharded(root_path / "sync", sharded_state(strategy, model, opt), {"state.pt": lambda: 0})
    except Exception as e:  # the type differs by rank; the message is checked
        out["failed_save"] = f"{type(e).__name__}: {e}"
    out["sync_untouched"] = before == sorted((p.name, p.stat().st_mtime_ns) for p in (root_path / "sync").iterdir())
    # Rank 1's disk is full when it writes its shards: every rank raises the same CheckpointWriteError.
    real_open = Path.open

    def disk_full(p: Path, mode: str = "r", *args, **kwargs):
        if rank == 1 and "w" in mode and p.name.endswith(".distcp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(p, mode, *args, **kwargs)
    Path.open = disk_full  # type: ignore[method-assign, assignment]  # a full disk on rank 1, restored below
    try:
        save_sharded(root_path / "sync", sharded_state(strategy, model, opt), {"state.pt": {"iter": 3}}).wait()
    except CheckpointWriteError as e:
        out["disk_full"] = {"message": str(e), "needed": e.needed, "free": e.free}
    finally:
        Path.open = real_open  # type: ignore[method-assign]  # restored
    out["sync_untouched_by_full_disk"] = before == sorted(
        (p.name, p.stat().st_mtime_ns) for p in (root_path / "sync").iterdir())
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One 1-process save, then one 2-process job (load, train, save sync + async)."""
    if reshard_problem(1, 2) is not None:  # the job loads the 1-process save onto 2 (and FSDP on gloo)
        pytest.skip(reshard_problem(1, 2))
    root = tmp_path_factory.mktemp("sharded")
    strategy = FSDPStrategy()
    model, opt = build(strategy)
    step(model, opt, 0)
    expected_one = full_state(strategy, model, opt)
    save_sharded(root / "one", sharded_state(strategy, model, opt), {"state.pt": {"iter": 1}}, {"iter": 1})
    ranks = run_ranks(two_rank_worker, world_size=2, args=(str(root),), timeout_s=120)
    return {"root": root, "expected_one": expected_one, "ranks": ranks}


@pytest.mark.slow
def test_save_on_one_load_on_two(run: dict) -> None:
    r0 = run["ranks"][0]
    assert_state_equal(r0["from_one"]["model"], run["expected_one"]["model"])
    assert_state_equal(r0["from_one"]["optim"], run["expected_one"]["optim"])
    assert r0["payloads"] == {"state.pt": {"iter": 1}}
    # Training continues on 2 ranks exactly as on one process with the whole batch.
    strategy = FSDPStrategy()
    model, opt = build(strategy, seed=1)
    load_into(strategy, model, opt, run["root"] / "one")
    step(model, opt, 10)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(r0["from_one_continued"]["model"][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_save_on_two_load_on_one_and_continue(run: dict) -> None:
    r0 = run["ranks"][0]
    strategy = FSDPStrategy()
    model, opt = build(strategy, seed=2)
    payloads = load_into(strategy, model, opt, run["root"] / "sync")
    assert_state_equal(model.state_dict(), r0["saved"]["model"])
    assert_state_equal(get_optimizer_state_dict(model, opt), r0["saved"]["optim"])
    assert payloads["state.pt"] == {"iter": 2}
    assert [payloads[f"rng_rank{r}.pt"]["torch"].item() for r in (0, 1)] == [0, 1]
    step(model, opt, 12)  # the step the 2 ranks took after saving
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, r0["continued"]["model"][k], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_async_save_equals_sync_save(run: dict) -> None:
    sync, async_ = run["root"] / "sync", run["root"] / "async"
    assert io.read_manifest(async_)["dcp"]["world_size"] == 2
    assert_state_equal(consolidate(async_, key=None), consolidate(sync, key=None))
    assert_state_equal(consolidate(async_), run["ranks"][0]["saved"]["model"])  # not the later step's


@pytest.mark.slow
def test_consolidate_gives_the_full_state_dict(run: dict) -> None:
    full = consolidate(run["root"] / "sync")
    assert_state_equal(full, run["ranks"][0]["saved"]["model"])
    assert list(full) == list(make_model().state_dict())
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in full.values())


@pytest.mark.slow
def test_failed_save_keeps_the_previous_checkpoint(run: dict) -> None:
    r0, r1 = run["ranks"]
    assert "Can't pickle" in r0["failed_save"] or "pickle" in r0["failed_save"].lower()
    assert r1["failed_save"].startswith("CheckpointError: sharded save to") and "rank 0" in r1["failed_save"]
    assert r0["sync_untouched"] and r1["sync_untouched"]
    assert not [p for p in run["root"].iterdir() if p.name.startswith(".")]  # no scratch dir left
    io.verify_checkpoint(run["root"] / "sync")


@pytest.mark.slow
def test_a_full_disk_on_one_rank_raises_the_same_write_error_on_every_rank(run: dict) -> None:
    r0, r1 = run["ranks"]
    assert r0["disk_full"] == r1["disk_full"]
    assert r0["disk_full"]["message"].startswith(
        f"checkpoint save to {run['root'] / 'sync'} failed while writing the DCP shards on rank 1: [Errno 28] No space "
        "left on device (ENOSPC); it needs about ")
    assert r0["disk_full"]["message"].endswith("; the unfinished save was removed, earlier checkpoints are intact")
    assert r0["disk_full"]["needed"] > 0 and r0["disk_full"]["free"] > 0
    assert r0["sync_untouched_by_full_disk"] and r1["sync_untouched_by_full_disk"]
    assert not [p for p in run["root"].iterdir() if p.name.startswith(".")]  # no scratch dir left
    io.verify_checkpoint(run["root"] / "sync")


@pytest.mark.slow
def test_sharded_checkpoints_fit_io_discovery(run: dict, tmp_path: Path) -> None:
    root = run["root"]
    assert is_sharded_checkpoint(root / "sync") and is_sharded_checkpoint(root / "one")
    io.save_checkpoint(tmp_path / "plain", {"state.pt": {"a": 1}})
    assert not is_sharded_checkpoint(tmp_path / "plain") and not is_sharded_checkpoint(tmp_path / "nothing")
    manifest = io.read_manifest(root / "sync")
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt", "rng_rank0.pt", "rng_rank1.pt"} <= set(
        manifest["files"])
    assert manifest["meta"] == {"iter": 2}
    assert io.find_latest_checkpoint(root) in (root / "sync", root / "async")
    with pytest.raises(CheckpointError, match="not a sharded checkpoint"):
        load_sharded(tmp_path / "plain", {})


@pytest.mark.parametrize("damage,file", [("flip", "__1_0.distcp"), ("truncate", "__0_0.distcp"),
                                         ("flip", ".metadata"), ("delete", "state.pt"), ("delete", "manifest.json")])
@pytest.mark.slow
def test_damaged_checkpoint_is_rejected_naming_the_file(run: dict, tmp_path: Path, damage: str, file: str) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run["root"] / "sync", ckpt)
    target = ckpt / file
    if damage == "delete":
        target.unlink()
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-10])
    else:
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    strategy = FSDPStrategy()
    model, opt = build(strategy)
    with pytest.raises(io.CorruptCheckpointError, match=file.replace(".", r"\.")):
        load_sharded(ckpt, sharded_state(strategy, model, opt))
    with pytest.raises(io.CorruptCheckpointError, match=file.replace(".", r"\.")):
        consolidate(ckpt)
    with pytest.raises(io.CorruptCheckpointError, match=file.replace(".", r"\.")):
        io.verify_checkpoint(ckpt)


class Evil:
    def __reduce__(self):
        return (print, ("executed!",))


def test_nothing_is_unpickled_unsafely(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # A non-tensor value DCP stores with torch.save is read back weights_only.
    save_sharded(tmp_path / "evil", {"model": {"w": torch.ones(2)}, "extra": {"obj": Evil()}})
    with pytest.raises(io.UnsafeCheckpointError, match=r"refused to load the value of 'extra.obj'.*GLOBAL (builtins\.)?print"):
        load_sharded(tmp_path / "evil", {"model": {"w": torch.zeros(2)}, "extra": {"obj": None}})
    # DCP's .metadata is a pickle: only DCP's own classes may be in it.
    meta = tmp_path / "evil" / ".metadata"
    meta.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(io.UnsafeCheckpointError, match="refused to load DCP metadata: it references the Python "
                                                       "global 'builtins.print'"):
        _SafeReader(tmp_path / "evil").read_metadata()
    assert "executed!" not in capsys.readouterr().out


class System:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rehash(ckpt: Path) -> None:
    """Make the manifest agree with edited files: only the content is left to catch them."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_malicious_metadata_is_refused_naming_the_global(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "PWNED"
    ckpt = tmp_path / "ck"
    save_sharded(ckpt, {"model": make_model().state_dict()}, {"state.pt": {"iter": 0}}, {"iter": 0})
    (ckpt / ".metadata").write_bytes(pickle.dumps(System(marker)))
    _rehash(ckpt)
    io.verify_checkpoint(ckpt)  # the bytes match the manifest: only the content is wrong
    want = (rf"{re.escape(str(ckpt / '.metadata'))}: refused to load DCP metadata: it references the Python global "
            rf"'{os.system.__module__}.system'.*nothing in the file was executed")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        with pytest.raises(io.UnsafeCheckpointError, match=want):
            consolidate(ckpt)
        with pytest.raises(io.UnsafeCheckpointError, match=want):
            load_sharded(ckpt, {"model": make_model().state_dict()})
    assert not marker.exists()
    # Refused before DCP runs: no fallback to per-rank metadata files, no logged tracebacks.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "Falling back" not in caplog.text and "__0.metadata" not in caplog.text


@pytest.mark.parametrize("content,error", [(b"\x80\x04garbage", "unreadable DCP metadata"),
                                           (pickle.dumps({"a": 1}), "not DCP metadata .holds a dict")],
                         ids=["garbage", "a-dict"])
def test_metadata_that_is_not_dcp_metadata_is_corrupt(tmp_path: Path, content: bytes, error: str) -> None:
    ckpt = tmp_path / "ck"
    save_sharded(ckpt, {"model": make_model().state_dict()})
    (ckpt / ".metadata").write_bytes(content)
    _rehash(ckpt)
    with pytest.raises(io.CorruptCheckpointError, match=rf"\.metadata: {error}"):
        consolidate(ckpt)


def test_sharded_save_replaces_only_a_checkpoint(tmp_path: Path) -> None:
    state = {"model": make_model().state_dict()}
    notes = tmp_path / "epoch_0001"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=rf"refusing to replace {re.escape(str(notes))}: it has no manifest"):
        save_sharded(notes, state, {"state.pt": {"iter": 1}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0001"]  # no scratch dir left
    assert (notes / "notes.txt").read_text() == "keep me"
    ckpt = tmp_path / "ck"
    save_sharded(ckpt, state, {"state.pt": {"iter": 1}}, {"iter": 1})
    save_sharded(ckpt, state, {"state.pt": {"iter": 2}}, {"iter": 2})  # a sharded checkpoint is replaced
    assert io.read_manifest(ckpt)["meta"] == {"iter": 2} and is_sharded_checkpoint(ckpt)


def test_single_process_async_save(tmp_path: Path) -> None:
    strategy = FSDPStrategy()
    model, opt = build(strategy)
    step(model, opt, 0)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    pending = save_sharded(tmp_path / "a", sharded_state(strategy, model, opt), {"state.pt": {}}, async_=True)
    step(model, opt, 1)
    assert pending.wait() == tmp_path / "a" and pending.wait() == tmp_path / "a"
    assert_state_equal(consolidate(tmp_path / "a"), want)
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["dcp"]["world_size"] == 1
    # A save still in flight is committed by the next one, or by wait_pending().
    save_sharded(tmp_path / "b", sharded_state(strategy, model, opt), async_=True)
    save_sharded(tmp_path / "c", sharded_state(strategy, model, opt), async_=True)
    io.verify_checkpoint(tmp_path / "b")
    assert not (tmp_path / "c").exists()
    assert wait_pending() == tmp_path / "c" and wait_pending() is None
    assert [p.name for p in io.list_checkpoints(tmp_path)] == ["a", "b", "c"]


def test_a_release_that_reshards_wrong_is_refused_before_anything_is_loaded(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint of 2 processes loaded by 1: fine on torch >= 2.9, refused with one line
    on 2.7/2.8 (treadle/compat.py), leaving the template as it was."""
    strategy = FSDPStrategy()
    model, opt = build(strategy)
    step(model, opt, 0)
    save_sharded(tmp_path / "ck", sharded_state(strategy, model, opt), {"state.pt": {}})
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    manifest["dcp"]["world_size"] = 2  # as a 2-process save writes it (the manifest is not in its own hashes)
    (tmp_path / "ck" / "manifest.json").write_text(json.dumps(manifest))
    fresh, fresh_opt = build(strategy, seed=1)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    with pytest.raises(CheckpointError) as info:
        load_sharded(tmp_path / "ck", sharded_state(strategy, fresh, fresh_opt))
    assert str(info.value) == (f"{tmp_path / 'ck'}: loading a sharded checkpoint saved by 2 process(es) onto 1 needs "
                               "torch>=2.9, but torch 2.8.0 is installed (older releases train on from it wrong); "
                               "resume it on 2, or consolidate it into full weights (treadle export, or load_from=)")
    assert_state_equal(dict(fresh.state_dict()), before)
    monkeypatch.undo()
    if reshard_problem(2, 1) is None:  # this release reshards right: the same checkpoint loads
        state, _ = load_sharded(tmp_path / "ck", sharded_state(strategy, fresh, fresh_opt))
        assert_state_equal(state["model"], dict(model.state_dict()))
