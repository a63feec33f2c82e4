"""Tests for treadle.checkpoint.weights: weights-only loading and safetensors export."""

from __future__ import annotations

import errno
import logging
import os
import re

import pytest
import safetensors
import torch
from torch import nn

from treadle.checkpoint.io import CorruptCheckpointError, UnsafeCheckpointError, save_checkpoint
from treadle.checkpoint.weights import (
    LoadReport,
    WeightsMismatchError,
    export_safetensors,
    load_weights,
    read_safetensors,
)


class Net(nn.Module):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, 2)


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.proj = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight  # weight tying: one Parameter, two state-dict keys


def _trained(model: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn_like(t))
            else:
                t.fill_(seed)
    return model


def _assert_sd_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _prefixed(sd: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in sd.items()}


def test_load_from_checkpoint_dir_model_and_ema(tmp_path):
    src, ema = _trained(Net(), 1), _trained(Net(), 2)
    ckpt = save_checkpoint(tmp_path / "iter_1", {
        "state.pt": {"model": src.state_dict(), "ema": {"model": ema.state_dict(), "decay": 0.999}},
    })
    dst = Net()
    report = load_weights(dst, ckpt)
    assert report.ok and report.loaded == len(src.state_dict())
    _assert_sd_equal(dst.state_dict(), src.state_dict())
    load_weights(dst, ckpt, key="ema")
    _assert_sd_equal(dst.state_dict(), ema.state_dict())


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "module._orig_mod."])
@pytest.mark.parametrize("wrap", ["raw", "state_dict", "model"])
def test_prefixes_and_file_layouts(tmp_path, prefix, wrap):
    src = _trained(Net(), 3)
    sd = _prefixed(src.state_dict(), prefix)
    f = tmp_path / "weights.pth"
    torch.save(sd if wrap == "raw" else {wrap: sd, "epoch": 4}, f)
    dst = Net()
    assert load_weights(dst, f).ok
    _assert_sd_equal(dst.state_dict(), src.state_dict())
    dst2 = Net()
    load_weights(dst2, sd)  # in-memory mapping
    _assert_sd_equal(dst2.state_dict(), src.state_dict())


def test_strict_mismatch_error_lists_everything_and_loads_nothing():
    src = _trained(Net(hidden=8), 4)
    sd = src.state_dict()
    sd.pop("fc2.bias")
    sd["extra.weight"] = torch.zeros(3)
    sd["fc1.weight"] = torch.zeros(5, 4)
    dst = Net(hidden=8)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(WeightsMismatchError) as err:
        load_weights(dst, sd)
    msg = str(err.value)
    assert re.search(r"missing in checkpoint \(1\):\s+fc2\.bias", msg)
    assert re.search(r"unexpected in checkpoint \(1\):\s+extra\.weight", msg)
    assert "fc1.weight: checkpoint (5, 4) vs model (8, 4)" in msg
    assert isinstance(err.value.report, LoadReport) and err.value.report.mismatched == [
        ("fc1.weight", (5, 4), (8, 4))]
    _assert_sd_equal(dst.state_dict(), before)  # strict failure must not half-load


def test_non_strict_partial_load(caplog):
    src = _trained(Net(hidden=8), 5)
    sd = src.state_dict()
    sd.pop("bn.running_var")
    sd["fc2.weight"] = torch.ones(3, 8)  # wrong shape: must not be loaded
    sd["module.unused"] = torch.ones(1)
    dst = Net(hidden=8)
    old_fc2 = dst.fc2.weight.detach().clone()
    with caplog.at_level(logging.WARNING, logger="treadle"):
        report = load_weights(dst, sd, strict=False)
    assert report.missing == ["bn.running_var"] and report.unexpected == ["unused"]
    assert report.mismatched == [("fc2.weight", (3, 8), (2, 8))]
    assert report.loaded == len(src.state_dict()) - 2
    assert torch.equal(dst.fc1.weight, src.fc1.weight) and torch.equal(dst.fc2.weight, old_fc2)
    assert "fc2.weight" in caplog.text and "partial weight load" in caplog.text


def test_custom_revise_keys():
    src = _trained(Net(), 6)
    sd = _prefixed(src.state_dict(), "backbone.")
    dst = Net()
    assert load_weights(dst, sd, revise_keys=[(r"^backbone\.", "")]).ok
    _assert_sd_equal(dst.state_dict(), src.state_dict())
    with pytest.raises(WeightsMismatchError, match="backbone.fc1.weight"):
        load_weights(Net(), sd)


def test_malicious_weights_file_refused(tmp_path):
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    f = tmp_path / "evil.pt"
    torch.save({"state_dict": {"fc1.weight": Evil()}}, f)
    with pytest.raises(UnsafeCheckpointError):
        load_weights(Net(), f)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["model", "ema"])
def test_export_safetensors_round_trip(tmp_path, key):
    model, ema = _trained(Net(), 7), _trained(Net(), 8)
    expected = (model if key == "model" else ema).state_dict()
    ckpt = save_checkpoint(tmp_path / "iter_7", {"state.pt": {
        "model": _prefixed(model.state_dict(), "module._orig_mod."), "ema": ema.state_dict()}})
    out = export_safetensors(ckpt, tmp_path / "export" / f"{key}.safetensors", key=key)
    _assert_sd_equal(read_safetensors(out), expected)
    with safetensors.safe_open(str(out), framework="pt") as f:
        meta = f.metadata()
    assert meta["source"] == str(ckpt) and meta["treadle_format"].startswith("treadle-checkpoint")
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temp file left
    dst = Net()
    assert load_weights(dst, out).ok
    _assert_sd_equal(dst.state_dict(), expected)


def test_export_tied_weights(tmp_path):
    model = _trained(TiedLM(), 9)
    assert model.head.weight is model.embed.weight
    f = tmp_path / "tied.pt"
    torch.save({"model": model.state_dict()}, f)  # torch.save keeps the shared storage
    out = export_safetensors(f, tmp_path / "tied.safetensors")
    got = read_safetensors(out)
    _assert_sd_equal(got, model.state_dict())
    fresh = TiedLM()
    assert load_weights(fresh, out).ok
    assert fresh.head.weight is fresh.embed.weight
    _assert_sd_equal(fresh.state_dict(), model.state_dict())


def test_export_is_atomic(tmp_path, monkeypatch):
    out = export_safetensors(_trained(Net(), 10).state_dict(), tmp_path / "w.safetensors")
    before = out.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)  # the write of the exported file fails as on a full disk
    with pytest.raises(OSError, match="disk full|No space left on device") as info:
        export_safetensors(_trained(Net(), 11).state_dict(), out)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out)  # one line naming the file
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_read_safetensors_corrupt(tmp_path):
    out = export_safetensors(Net().state_dict(), tmp_path / "w.safetensors")
    out.write_bytes(out.read_bytes()[:-10])
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(out))):
        read_safetensors(out)


def test_tied_weight_alias_counts_as_present():
    model = _trained(TiedLM(), 12)
    sd = {k: v for k, v in model.state_dict().items() if k != "head.weight"}  # de-duplicated export
    fresh = TiedLM()
    assert load_weights(fresh, sd).ok
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.head.weight, model.embed.weight)
    untied = Net()
    with pytest.raises(WeightsMismatchError, match="fc2.bias"):
        load_weights(untied, {k: v for k, v in untied.state_dict().items() if k != "fc2.bias"})
