"""resume=True over a latest checkpoint whose files verify but cannot be loaded: one line,
then the previous verified checkpoint; resume=<that path> still stops with its error."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import CheckpointError

from support import TinyNet, make_data


def _trainer(work_dir, max_iters, **kw):
    torch.manual_seed(0)
    return treadle.Trainer(TinyNet(), work_dir=work_dir, train_dataloader=DataLoader(make_data(64), batch_size=8),
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=max_iters,
                           seed=0, progress=False, log_writers=[], checkpoint=dict(interval=2, by_epoch=False), **kw)


def _unloadable(ckpt) -> None:
    """state.pt replaced by bytes torch.load cannot read, the manifest rewritten to vouch for them."""
    data = b"these bytes are no pickle"
    (ckpt / "state.pt").write_bytes(data)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["state.pt"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def test_resume_latest_falls_back_over_an_unloadable_checkpoint_and_a_named_one_stops(tmp_path, caplog):
    whole = _trainer(tmp_path / "whole", 6)
    whole.fit()
    work = tmp_path / "run"
    _trainer(work, 4).fit()
    latest, previous = work / "checkpoints" / "iter_00000004", work / "checkpoints" / "iter_00000002"
    assert latest.is_dir() and previous.is_dir()
    _unloadable(latest)
    with pytest.raises(CheckpointError, match="torch.load failed"):  # named explicitly: its error
        _trainer(tmp_path / "other", 6, resume=str(latest)).fit()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="treadle"):
        resumed = _trainer(work, 6, resume=True)
        resumed.fit()
    falls = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert len(falls) == 1 and len(falls[0].splitlines()) == 1, falls
    assert str(latest) in falls[0] and "previous verified checkpoint" in falls[0]
    assert any(f"resumed from {previous}" in r.getMessage() for r in caplog.records)
    assert resumed.state.iter == 6
    for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # iterations 3 to 6 trained again, exactly


def test_resume_latest_with_no_earlier_loadable_checkpoint_stops(tmp_path):
    work = tmp_path / "run"
    _trainer(work, 4).fit()
    for ckpt in (work / "checkpoints").iterdir():
        _unloadable(ckpt)
    with pytest.raises(CheckpointError, match="no earlier checkpoint .* verifies and loads"):
        _trainer(work, 6, resume=True).fit()


def test_resume_latest_steps_back_over_a_checkpoint_whose_manifest_lists_no_state(tmp_path, caplog):
    """The newest checkpoint's manifest no longer lists state.pt (edited by hand, or written
    by another tool): it verifies, it cannot be resumed; resume=True says so in one line and
    resumes from the previous one, exactly."""
    whole = _trainer(tmp_path / "whole", 6)
    whole.fit()
    work = tmp_path / "run"
    _trainer(work, 4).fit()
    latest, previous = work / "checkpoints" / "iter_00000004", work / "checkpoints" / "iter_00000002"
    manifest = json.loads((latest / "manifest.json").read_text())
    del manifest["files"]["state.pt"]
    (latest / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.INFO, logger="treadle"):
        resumed = _trainer(work, 6, resume=True)
        resumed.fit()
    falls = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert len(falls) == 1 and "it has no state.pt" in falls[0] and "iter_00000002" in falls[0], falls
    assert any(f"resumed from {previous}" in r.getMessage() for r in caplog.records)
    assert resumed.state.iter == 6
    for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_checkpoint_of_an_earlier_format_is_refused_in_one_line(tmp_path, caplog):
    """Format versions 1 and 2 (layouts before the first release): resume=<path> stops with
    one line saying what it is; resume=True passes over them and stops, saying why."""
    work = tmp_path / "run"
    _trainer(work, 4).fit()
    for ckpt in (work / "checkpoints").glob("iter_*"):
        manifest = json.loads((ckpt / "manifest.json").read_text())
        (ckpt / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))
    latest = work / "checkpoints" / "iter_00000004"
    with pytest.raises(CheckpointError, match=r"format_version 2 is not supported: this treadle reads format "
                                              r"version 3 \(the checkpoint was written by an earlier treadle") as err:
        _trainer(tmp_path / "other", 6, resume=str(latest)).fit()
    assert len(str(err.value).splitlines()) == 1
    with pytest.raises(CheckpointError, match="none of the 2 checkpoint"):
        _trainer(work, 6, resume=True).fit()
    assert sum("format_version 2 is not supported" in r.getMessage() for r in caplog.records) == 2
    s = treadle.build_strategy("single", seed=0)
    s.prepare(TinyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    with pytest.raises(CheckpointError, match="format_version 2 is not supported"):
        s.resume(latest)
