"""treadle.checkpoint.io refusing what it must not touch or trust: saves onto things that
are not checkpoints, malicious pickles (and the message about them), bad format versions."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from support import TinyNet, make_data
from treadle.checkpoint import io as ckio
from treadle.checkpoint.async_save import AsyncCheckpointer
from treadle.checkpoint.io import (
    MANIFEST_NAME,
    CheckpointError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    find_latest_checkpoint,
    load_checkpoint,
    read_manifest,
    save_checkpoint,
    verify_checkpoint,
)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# ----------------------------------------------------------------------------- only a checkpoint is replaced


def _notes_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("my precious notes")
    (path / "analysis.csv").write_text("a,b\n1,2\n")
    return path


def _foreign(kind: str, path: Path) -> Path:
    """Things at a checkpoint's name that are not a treadle checkpoint."""
    if kind == "flat dir, no manifest":
        return _notes_dir(path)
    if kind == "payloads, no manifest":
        path.mkdir()
        torch.save({"a": 1}, path / "state.pt")
        return path
    if kind == "another tool's manifest.json":
        path.mkdir()
        (path / MANIFEST_NAME).write_text(json.dumps({"format": "other-tool", "files": {}}))
        (path / "data.bin").write_bytes(b"\0" * 8)
        return path
    if kind == "manifest.json is a dir":
        (path / MANIFEST_NAME).mkdir(parents=True)
        return path
    if kind == "a file":
        path.write_text("not a dir")
        return path
    raise AssertionError(kind)


FOREIGN = ["flat dir, no manifest", "payloads, no manifest", "another tool's manifest.json",
           "manifest.json is a dir", "a file"]


@pytest.mark.parametrize("kind", FOREIGN)
def test_save_refuses_to_replace_what_is_not_a_checkpoint(tmp_path, kind):
    target = _foreign(kind, tmp_path / "epoch_0001")
    before = _snapshot(target) if target.is_dir() else target.read_bytes()
    with pytest.raises(CheckpointError, match=rf"refusing to replace {re.escape(str(target))}: .*not a treadle "
                                              "checkpoint"):
        save_checkpoint(target, {"state.pt": {"a": torch.zeros(1)}})
    assert (_snapshot(target) if target.is_dir() else target.read_bytes()) == before
    assert _hidden(tmp_path) == []  # checked before anything was written


def test_save_refusal_says_what_is_missing(tmp_path):
    target = _notes_dir(tmp_path / "mydata")
    with pytest.raises(CheckpointError, match=f"it has no {MANIFEST_NAME}"):
        save_checkpoint(target, {"state.pt": 1})
    link = tmp_path / "link"
    link.symlink_to(save_checkpoint(tmp_path / "real", {"state.pt": 1}))
    with pytest.raises(CheckpointError, match="symbolic link"):
        save_checkpoint(link, {"state.pt": 2})
    assert load_checkpoint(tmp_path / "real")["state.pt"] == 1


def test_async_save_refuses_before_copying(tmp_path):
    target = _notes_dir(tmp_path / "epoch_0001")
    saver = AsyncCheckpointer()
    with pytest.raises(CheckpointError, match="refusing to replace"):
        saver.save(target, {"state.pt": {"w": torch.ones(2)}})
    assert saver.wait() is None
    assert (target / "notes.txt").read_text() == "my precious notes" and _hidden(tmp_path) == []


def test_foreign_dir_appearing_during_a_save_is_not_replaced(tmp_path, monkeypatch):
    """The check is repeated at the rename: a dir made meanwhile at the name is left alone."""
    target = tmp_path / "iter_1"
    real_write = ckio._write_durably

    def write_then_occupy(path, *args, **kwargs):
        out = real_write(path, *args, **kwargs)
        if path.name == MANIFEST_NAME:
            _notes_dir(target)
        return out

    monkeypatch.setattr(ckio, "_write_durably", write_then_occupy)
    with pytest.raises(CheckpointError, match="refusing to replace .*iter_1: it has no manifest.json"):
        save_checkpoint(target, {"state.pt": 1})
    assert sorted(os.listdir(target)) == ["analysis.csv", "notes.txt"]
    assert _hidden(tmp_path) == []


def test_checkpoints_are_still_replaced(tmp_path):
    ckpt = save_checkpoint(tmp_path / "iter_1", {"state.pt": 1}, meta={"iter": 1})
    save_checkpoint(ckpt, {"state.pt": 2}, meta={"iter": 2})
    assert load_checkpoint(ckpt)["state.pt"] == 2
    # A checkpoint of ours whose manifest got damaged is still ours: a new save may replace it.
    (ckpt / MANIFEST_NAME).write_text("{not json")
    save_checkpoint(ckpt, {"state.pt": 3}, meta={"iter": 3})
    assert load_checkpoint(ckpt)["state.pt"] == 3 and _hidden(tmp_path) == []


def test_training_does_not_overwrite_a_foreign_dir_at_a_checkpoint_name_it_saves_beside_it(tmp_path):
    import treadle

    work = tmp_path / "run"
    notes = _notes_dir(work / "checkpoints" / "epoch_0001")
    trainer = treadle.Trainer(
        TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
        optimizer=dict(type="SGD", lr=0.1), work_dir=str(work), max_epochs=1, progress=False,
        log_writers=("jsonl",))
    trainer.fit()  # the name is taken by something this run did not save: it saves beside it
    assert sorted(os.listdir(notes)) == ["analysis.csv", "notes.txt"]
    assert (notes / "notes.txt").read_text() == "my precious notes"
    assert (work / "checkpoints" / "epoch_0001-v1" / "manifest.json").is_file()


# ----------------------------------------------------------------------------- malicious pickles


class _System:
    def __reduce__(self):
        return (os.system, ("echo SHOULD-NEVER-RUN",))


class _Exec:
    def __reduce__(self):
        return (exec, ("raise SystemExit('SHOULD-NEVER-RUN')",))


class _Custom:
    pass


# What each one makes torch 2.13 refuse (a blocked module, a builtin, a class of the test).
MALICIOUS = [(_System, f"{os.system.__module__}.system"), (_Exec, "exec"), (_Custom, f"{__name__}._Custom")]
# torch's advice on how to load such a file anyway: treadle must never pass it on.
ADVICE = re.compile(r"weights_only\W+(set to\W+)?`?False|weights_only=False|Re-running|add_safe_globals|"
                    r"safe_globals|allowlist|trust", re.IGNORECASE)


@pytest.mark.parametrize("cls,name", MALICIOUS, ids=["os.system", "exec", "class"])
@pytest.mark.parametrize("legacy", [False, True], ids=["checkpoint", "legacy-file"])
def test_unsafe_message_names_the_global_and_gives_no_unsafe_advice(tmp_path, capfd, cls, name, legacy):
    if legacy:
        path = tmp_path / "evil.pt"
        torch.save({"model": {"w": torch.ones(1)}, "x": cls()}, path)
        where = path
    else:
        path = save_checkpoint(tmp_path / "iter_1", {"state.pt": {"model": {}, "x": cls()}})
        where = path / "state.pt"
    with pytest.raises(UnsafeCheckpointError) as err:
        load_checkpoint(path)
    msg = str(err.value)
    # It leads with what was refused...
    # (torch 2.6 names a builtin with its module, 'builtins.exec'; 2.7 and newer as 'exec')
    named = rf"'(builtins\.)?{re.escape(name)}'" if name == "exec" else re.escape(repr(name))
    assert re.match(rf"{re.escape(str(where))}: refused to load: it references the Python global {named}", msg), msg
    # ... keeps torch's reason, and none of torch's advice.
    assert re.search(rf"torch's reason: .*GLOBAL (builtins\.)?{re.escape(name)}\b", msg), msg
    assert not ADVICE.search(msg), msg
    assert "nothing in the file was executed" in msg and "\n" not in msg
    assert "SHOULD-NEVER-RUN" not in capfd.readouterr().out


def test_torch_reason_strips_the_advice_of_each_wording():
    """torch's text from 2.13 (blocked module; not allow-listed) and the one from before
    the weights_only default changed."""
    texts = {
        "Trying to load unsupported GLOBAL posix.system whose module posix is blocked.":
            "Weights only load failed. In PyTorch 2.6, we changed the default value of the `weights_only` argument "
            "in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will "
            "likely succeed, but it can result in arbitrary code execution. Do it only if you got the file from a "
            "trusted source.\n\n\nTrying to load unsupported GLOBAL posix.system whose module posix is blocked.\n\n"
            "Check the documentation of torch.load to learn more about types accepted by default with weights_only "
            "https://pytorch.org/docs/stable/generated/torch.load.html.",
        "Unsupported global: GLOBAL builtins.exec was not an allowed global by default.":
            "Weights only load failed. This file can still be loaded, to do so you have two options, \x1b[1mdo "
            "those steps only if you trust the source of the checkpoint\x1b[0m. \n\t(1) Re-running `torch.load` "
            "with `weights_only` set to `False` will likely succeed, but it can result in arbitrary code execution."
            "\n\t(2) Alternatively, to load with `weights_only=True` please check the recommended steps in the "
            "following error message.\n\tWeightsUnpickler error: Unsupported global: GLOBAL builtins.exec was not "
            "an allowed global by default. Please use `torch.serialization.add_safe_globals([exec])` to allowlist "
            "this global if you trust this class/function.\n\nCheck the documentation of torch.load to learn more.",
        "Unsupported operand 149": "Weights only load failed. Re-running `torch.load` with `weights_only` set to "
            "`False` will likely succeed. Please file an issue with the following so that we can make "
            "`weights_only=True` compatible with your use case: WeightsUnpickler error: \n\nUnsupported operand "
            "149\n\nCheck the documentation of torch.load to learn more.",
        "the weights-only unpickler refused the file": "Weights only load failed. Re-running `torch.load` with "
            "`weights_only` set to `False` will likely succeed.",
    }
    for want, text in texts.items():
        assert ckio._torch_reason(text) == want


# ----------------------------------------------------------------------------- format version


def _with_version(tmp_path: Path, version) -> Path:
    ckpt = save_checkpoint(tmp_path / "iter_1", {"state.pt": {"w": torch.ones(2)}}, meta={"iter": 1})
    manifest = json.loads((ckpt / MANIFEST_NAME).read_text())
    manifest["format_version"] = version
    (ckpt / MANIFEST_NAME).write_text(json.dumps(manifest))
    return ckpt


@pytest.mark.parametrize("version", [0, -7, "1", None, True, 1.0, [1]])
def test_invalid_format_version_is_rejected(tmp_path, version):
    ckpt = _with_version(tmp_path, version)
    pattern = rf"manifest.json: invalid format_version {re.escape(repr(version))}: expected a positive integer " \
              r"\(this treadle reads format version"
    for check in (read_manifest, verify_checkpoint, load_checkpoint):
        with pytest.raises(CorruptCheckpointError, match=pattern):
            check(ckpt)
    with pytest.warns(ckio.CheckpointWarning, match="invalid format_version"):
        assert find_latest_checkpoint(tmp_path) is None


@pytest.mark.parametrize("version, why", [(ckio.FORMAT_VERSION + 1, "newer treadle"), (1, "earlier treadle"),
                                          (2, "earlier treadle")])
def test_another_format_version_is_not_supported(tmp_path, version, why):
    ckpt = _with_version(tmp_path, version)
    with pytest.raises(CheckpointError, match=rf"format_version {version} is not supported: "
                                              rf"this treadle reads format version {ckio.FORMAT_VERSION} \(.*{why}") as err:
        load_checkpoint(ckpt)
    assert not isinstance(err.value, CorruptCheckpointError)  # not damaged: of another version
    assert len(str(err.value).splitlines()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_manifest(_with_version(tmp_path / "ok", ckio.FORMAT_VERSION))["format_version"] == ckio.FORMAT_VERSION
