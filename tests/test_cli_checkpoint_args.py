"""Where a checkpoint is expected (validate/test --checkpoint, export, load_from), a run
directory names its latest verified checkpoint, and the message says which; a checkpoint
for another model, and --ema on a run without EMA, are said as such (issue 20)."""

from __future__ import annotations

import os
import stat

import warnings

import pytest
import torch

import treadle
from treadle.checkpoint.io import CheckpointError
from treadle.checkpoint.weights import read_safetensors

from cli_support import run
from support import TinyNet


@pytest.fixture
def two_saves(tiny, tmp_path, capsys):
    """A run with epoch_0001 and epoch_0002; the latest is epoch_0002."""
    work = tmp_path / "run"
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "checkpoint={interval: 1, keep: 3}")[0] == 0
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["epoch_0001", "epoch_0002"]
    return work


@pytest.mark.parametrize("command", ["validate", "test"])
@pytest.mark.parametrize("given", ["run", "checkpoints"])
def test_validate_and_test_accept_a_run_directory(two_saves, tiny, capsys, command, given):
    work = two_saves
    tiny_test = ["--set", "test_dataloader={dataset: {type: support.make_data, n: 8, seed: 2}, batch_size: 8}"]
    path = work if given == "run" else work / "checkpoints"
    rc, out, err = run(capsys, command, work / "config.yaml", "--checkpoint", path, *tiny_test)
    latest = work / "checkpoints" / "epoch_0002"
    assert rc == 0, err
    assert f"using its latest verified checkpoint {latest}" in out
    rc2, out2, _ = run(capsys, command, work / "config.yaml", "--checkpoint", latest, *tiny_test)
    mode = "val" if command == "validate" else "test"
    value = lambda text: next(ln for ln in text.splitlines() if f"{mode}/loss" in ln)  # noqa: E731
    assert rc2 == 0 and value(out) == value(out2)


def test_the_latest_that_verifies_is_used(two_saves, capsys, caplog):
    work = two_saves
    (work / "checkpoints" / "epoch_0002" / "state.pt").write_bytes(b"garbage")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, out, err = run(capsys, "validate", work / "config.yaml", "--checkpoint", work)
    assert rc == 0, err
    # The skipped checkpoint is said once: a log line or a warning, not both.
    skips = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    skips += [str(w.message) for w in caught if "skipping checkpoint" in str(w.message)]
    assert len(skips) == 1 and "epoch_0002" in skips[0], (out + err, caught)
    assert f"latest verified checkpoint {work / 'checkpoints' / 'epoch_0001'}" in out


def test_a_directory_without_checkpoints_is_one_clear_error(tiny, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run(capsys, "validate", tiny, "--checkpoint", empty)
    assert rc == 2 and "a directory with no checkpoint in it" in err and "Traceback" not in err
    assert "manifest.json: missing" not in err and "config error" not in err
    rc, _, err = run(capsys, "export", empty, "--out", tmp_path / "m.safetensors")
    assert rc == 2 and err.startswith(f"treadle export: error: {empty}: a directory with no checkpoint in it")


def test_export_accepts_a_run_directory_and_writes_the_checkpoints_mode(two_saves, tmp_path, capsys):
    work = two_saves
    latest = work / "checkpoints" / "epoch_0002"
    rc, out, err = run(capsys, "export", work, "--out", tmp_path / "m.safetensors")
    assert rc == 0, err
    assert f"using its latest verified checkpoint {latest}" in out
    exported = read_safetensors(tmp_path / "m.safetensors")
    weights = torch.load(latest / "state.pt", weights_only=True, map_location="cpu")["model"]  # as exported
    assert all(torch.equal(exported[k], v) for k, v in weights.items())
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(tmp_path / "m.safetensors") == mode(latest / "state.pt")


def test_export_ema_of_a_run_without_ema_says_so(two_saves, tmp_path, capsys):
    rc, _, err = run(capsys, "export", two_saves, "--ema", "--out", tmp_path / "m.safetensors")
    assert rc == 2 and "the run had no EMA" in err and "export without --ema" in err
    assert "'hooks'" not in err and not (tmp_path / "m.safetensors").exists()
    rc, _, err = run(capsys, "validate", two_saves / "config.yaml", "--checkpoint", two_saves, "--ema")
    assert rc == 2 and "the run had no EMA" in err and "--no-ema" in err


def test_a_checkpoint_of_another_model_is_labelled_as_such(two_saves, capsys):
    rc, _, err = run(capsys, "validate", two_saves / "config.yaml", "--checkpoint", two_saves,
                     "--set", "model.classes=5")
    assert rc == 2 and "config error" not in err and "Traceback" not in err
    assert err.startswith(f"treadle validate: error: --checkpoint {two_saves / 'checkpoints' / 'epoch_0002'} does "
                          "not match the model")
    assert "shape mismatch" in err


def test_load_from_a_run_directory(two_saves, caplog):
    latest = two_saves / "checkpoints" / "epoch_0002"
    with caplog.at_level("INFO", logger="treadle"):
        trainer = treadle.Trainer(TinyNet(), load_from=two_saves)
    assert f"load_from {two_saves} is a run directory: using its latest verified checkpoint {latest}" in caplog.text
    assert f"load_from: loaded 4 entries from {latest}" in caplog.text
    weights = torch.load(latest / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(trainer.module.state_dict()[k], v) for k, v in weights.items())
    empty = two_saves / "logs_only"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="a directory with no checkpoint in it"):
        treadle.Trainer(TinyNet(), load_from=empty)


def test_load_from_a_checkpoint_of_another_model_is_no_config_error(two_saves, tiny, tmp_path, capsys):
    rc, _, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "other", "--set", "model.classes=5",
                     f"load_from={two_saves}")
    latest = two_saves / "checkpoints" / "epoch_0002"
    assert rc == 2 and "config error" not in err and "Traceback" not in err
    assert err.startswith(f"treadle train: error: the weights in {latest} do not match the model; nothing was loaded:")
    assert "loaded 0 entries" not in err and not (tmp_path / "other").exists()
