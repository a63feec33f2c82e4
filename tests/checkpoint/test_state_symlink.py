"""A ``state.pt`` that is a symbolic link to something that is no checkpoint (or such a file
itself), given to resume=, load_from=, ``treadle validate`` and ``treadle export``: a
one-line error naming the path and what was expected; nothing on disk changes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import CheckpointError

from cli_support import TINY, run
from support import TinyNet, make_data

TARGETS = {
    "text": lambda p: p.write_text("hello\nworld\n"),
    "empty": lambda p: p.write_bytes(b""),
    "list": lambda p: torch.save([1, 2], p),
    "directory": lambda p: p.mkdir(),
    "dangling": lambda p: None,
}
# What each error says besides the path (old messages: "KeyError: 101", "size is 4096 bytes").
SAYS = {
    ("text", "file"): "expected a checkpoint directory (with manifest.json) or a file written by torch.save",
    ("empty", "file"): "an empty file",
    ("list", "file"): "state dict",
    ("directory", "file"): "directory",
    ("dangling", "file"): "no such",
    ("text", "in_checkpoint"): "is a symbolic link to {target}; a checkpoint's files are never links",
    ("empty", "in_checkpoint"): "is a symbolic link to {target}; a checkpoint's files are never links",
    ("list", "in_checkpoint"): "is a symbolic link to {target}; a checkpoint's files are never links",
    ("directory", "in_checkpoint"): "is a symbolic link to {target}; a checkpoint's files are never links",
    ("dangling", "in_checkpoint"): "is a symbolic link to {target}; a checkpoint's files are never links",
}


def _trainer(work_dir, **kw):
    return treadle.Trainer(TinyNet(), work_dir=work_dir, train_dataloader=DataLoader(make_data(32), batch_size=8),
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=4,
                           progress=False, log_writers=["jsonl"], **kw)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("run")
    _trainer(work, checkpoint=dict(interval=2, by_epoch=False)).fit()
    return work / "checkpoints" / "iter_00000004"


def _disk(root: Path) -> dict[str, object]:
    """Every path under ``root``: a link's target, a file's sha256, or "dir"."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        out[key] = (os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file()
                    else "dir")
    return out


def _case(tmp_path: Path, checkpoint: Path, kind: str, layout: str) -> tuple[Path, Path, Path]:
    """(the path given to treadle, its state.pt link, the link's target) under tmp_path/case."""
    case = tmp_path / "case"
    case.mkdir()
    target = case / f"target-{kind}"
    TARGETS[kind](target)
    if layout == "file":
        given = link = case / "state.pt"
    else:  # a checkpoint directory whose state.pt was replaced by the link
        given = case / "iter_00000004"
        shutil.copytree(checkpoint, given)
        link = given / "state.pt"
        link.unlink()
    link.symlink_to(target)
    return case, given, link


@pytest.mark.parametrize("layout", ["file", "in_checkpoint"])
@pytest.mark.parametrize("kind", list(TARGETS))
def test_a_state_pt_linked_to_no_checkpoint_is_one_line_naming_it_and_nothing_changes(
        tmp_path, checkpoint, capsys, kind, layout):
    case, given, link = _case(tmp_path, checkpoint, kind, layout)
    expected = SAYS[kind, layout].format(target=case / f"target-{kind}")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(TINY)
    before = _disk(case)
    messages = []
    for option in ("resume", "load_from"):
        with pytest.raises((CheckpointError, FileNotFoundError)) as e:
            _trainer(tmp_path / f"w-{option}", **{option: str(given)}).fit()
        messages.append(str(e.value))
    for argv in (["validate", cfg, "--checkpoint", given, "--work-dir", tmp_path / "w-cli"],
                 ["export", given, "--out", tmp_path / "out.safetensors"]):
        rc, out, err = run(capsys, *argv)
        assert rc != 0 and not (tmp_path / "out.safetensors").exists(), (argv, out, err)
        messages.append(err.strip().split("error: ", 1)[-1])
    for message in messages:
        assert len(message.splitlines()) == 1, message
        assert str(given) in message or repr(str(given)) in message, message
    assert any(expected in m for m in messages), (expected, messages)
    if layout == "in_checkpoint" or kind in ("text", "empty"):  # the new wording, everywhere
        assert all(expected in m for m in messages), (expected, messages)
    assert _disk(case) == before


def test_a_linked_state_pt_that_the_manifest_vouches_for_is_refused_as_a_link(tmp_path, checkpoint):
    """A manifest rewritten to the size and sha256 of the file a link points to: the
    payload verifies byte for byte, yet it is a link; refused as such (not as a torch.load
    failure), for resume= and load_from= alike."""
    case, given, link = _case(tmp_path, checkpoint, "list", "in_checkpoint")
    target = case / "target-list"
    manifest_path = given / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    data = target.read_bytes()
    manifest["files"]["state.pt"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest))
    for option in ("resume", "load_from"):
        with pytest.raises(CheckpointError) as e:
            _trainer(tmp_path / f"w-{option}", **{option: str(given)}).fit()
        assert str(e.value).splitlines() == [f"{link} is a symbolic link to {target}; a checkpoint's files are never "
                                             "links (treadle does not follow them)"], str(e.value)
