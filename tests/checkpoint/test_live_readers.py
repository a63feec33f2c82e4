"""Readers of a live run never fail because its pruning removed what they chose: they
take the next newest checkpoint (find_latest_checkpoint, load_from=, treadle export)."""

from __future__ import annotations

import shutil

import pytest
import torch

import treadle
from treadle.checkpoint import directory
from treadle.checkpoint.io import save_checkpoint
from treadle.engine.resume import use_latest
from support import TinyNet


def _run_dir(tmp_path, iters=(2, 4, 6)):
    """A run directory with checkpoints of TinyNet weights at ``iters``."""
    ckpts = tmp_path / "run" / "checkpoints"
    for i in iters:
        torch.manual_seed(i)
        save_checkpoint(ckpts / f"iter_{i:08d}", {"state.pt": {"model": TinyNet().state_dict()}}, meta={"iter": i})
    return tmp_path / "run", ckpts


def _prune_first(calls, real):
    """``real``, except that its first call finds the checkpoint pruned under it."""
    def fn(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            shutil.rmtree(path)
            raise FileNotFoundError(2, "No such file or directory", str(path / "state.pt"))
        return real(path, *args, **kwargs)
    return fn


def test_find_latest_passes_over_a_checkpoint_pruned_while_it_is_verified(tmp_path, monkeypatch, recwarn):
    _, ckpts = _run_dir(tmp_path)
    calls = []
    monkeypatch.setattr(directory, "verify_checkpoint", _prune_first(calls, directory.verify_checkpoint))
    assert directory.find_latest_checkpoint(ckpts) == ckpts / "iter_00000004"
    assert calls[0] == ckpts / "iter_00000006"
    assert not [w for w in recwarn if "skipping" in str(w.message)]  # pruned, not corrupt: nothing to say


def test_use_latest_takes_the_next_newest_when_the_chosen_one_is_pruned_while_read(tmp_path):
    run, ckpts = _run_dir(tmp_path)
    calls = []

    def use(path, note):
        calls.append(path)
        if len(calls) == 1:
            shutil.rmtree(path)
            raise FileNotFoundError(2, "No such file or directory", str(path / "state.pt"))
        return path
    assert use_latest(run, "load_from", use) == ckpts / "iter_00000004"
    # A checkpoint named itself is not searched for: its failure is the caller's.
    with pytest.raises(FileNotFoundError):
        use_latest(ckpts / "iter_00000004", "load_from",
                   lambda path, note: (_ for _ in ()).throw(FileNotFoundError(str(path))))


def test_load_from_a_live_run_directory_loads_the_next_newest(tmp_path, monkeypatch):
    from treadle.engine import resume as resume_module

    run, ckpts = _run_dir(tmp_path)
    calls = []
    monkeypatch.setattr(resume_module, "load_weights", lambda module, path, **kw: _pruning(calls, path, module, kw))
    t = treadle.Trainer(TinyNet(), load_from=run, strategy="single", progress=False)
    torch.manual_seed(4)
    expected = TinyNet().state_dict()
    assert [p.name for p in calls] == ["iter_00000006", "iter_00000004"]
    for k, v in expected.items():
        assert torch.equal(t.module.state_dict()[k].cpu(), v)  # the model is on the run's device


def _pruning(calls, path, module, kw):
    from treadle.checkpoint.weights import load_weights

    calls.append(path)
    if len(calls) == 1:
        shutil.rmtree(path)
        raise FileNotFoundError(2, "No such file or directory", str(path / "state.pt"))
    return load_weights(module, path, **kw)


def test_export_of_a_live_run_directory_exports_the_next_newest(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from treadle.checkpoint import weights
    from treadle.cli import main

    run, ckpts = _run_dir(tmp_path)
    real = weights.export_safetensors
    calls = []

    def export(source, out, **kw):
        calls.append(source)
        if len(calls) == 1:
            shutil.rmtree(source)
            raise FileNotFoundError(2, "No such file or directory", str(source / "state.pt"))
        return real(source, out, **kw)
    monkeypatch.setattr(weights, "export_safetensors", export)
    assert main(["export", str(run), "--out", str(tmp_path / "w.safetensors")]) == 0
    torch.manual_seed(4)
    expected = TinyNet().state_dict()
    got = load_file(str(tmp_path / "w.safetensors"))
    assert all(torch.equal(got[k], v) for k, v in expected.items())
