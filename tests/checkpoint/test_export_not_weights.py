"""``treadle export`` of something that is not a model's weights is a one-line error
naming the path and what was expected, and writes nothing: a state.pt holding ``{}``
(or a checkpoint whose ``model`` entry is empty), an RNG file (``rng_rank0.pt``, or one
copied over a state.pt). A real checkpoint still exports (the control)."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.utils.data import DataLoader

import treadle
from cli_support import run
from support import ON_CPU, TinyNet, make_data
from treadle.checkpoint.io import CheckpointError, find_latest_checkpoint, save_checkpoint
from treadle.checkpoint.weights import export_safetensors, load_weights, read_safetensors


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    work = tmp_path_factory.mktemp("run")
    treadle.Trainer(TinyNet(), work_dir=work, train_dataloader=DataLoader(make_data(16), batch_size=8),
                    loss_fn=torch.nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                    strategy=ON_CPU, log_writers=()).fit()
    return find_latest_checkpoint(work / "checkpoints")


def _export_fails(capsys, src, out, *expected):
    rc, _, err = run(capsys, "export", src, "--out", out)
    assert rc == 2, err
    line = err.strip()
    assert "\n" not in line and str(src) in line, line
    for text in expected:
        assert text in line, line
    assert not out.exists()


def test_empty_state_file(tmp_path, capsys):
    torch.save({}, tmp_path / "state.pt")
    _export_fails(capsys, tmp_path / "state.pt", tmp_path / "x.safetensors",
                  "holds no weights (an empty mapping); expected a model's state dict of tensors")


def test_checkpoint_with_an_empty_model_entry(tmp_path, capsys):
    save_checkpoint(tmp_path / "c", {"state.pt": {"model": {}}})
    _export_fails(capsys, tmp_path / "c", tmp_path / "x.safetensors", "holds no weights")
    with pytest.raises(CheckpointError, match="holds no weights"):  # loading it says the same
        load_weights(TinyNet(), tmp_path / "c", strict=False)


def test_rng_file(ckpt, tmp_path, capsys):
    # The RNG file's entries that are not tensors: 'python', 'numpy', 'rank_state', and 'cuda' on a GPU machine.
    entries = torch.load(ckpt / "rng_rank0.pt", weights_only=True)
    foreign = [k for k, v in entries.items() if not isinstance(v, torch.Tensor)]
    assert {"python", "numpy", "rank_state"} <= set(foreign), foreign
    named = ", ".join(map(repr, foreign))
    _export_fails(capsys, ckpt / "rng_rank0.pt", tmp_path / "x.safetensors",
                  f"not a model's weights ({named} not tensors); expected a state dict of tensors")
    shutil.copy(ckpt / "rng_rank0.pt", tmp_path / "state.pt")
    _export_fails(capsys, tmp_path / "state.pt", tmp_path / "x.safetensors", "not a model's weights")


def test_a_real_checkpoint_still_exports(ckpt, tmp_path, capsys):
    rc, _, _ = run(capsys, "export", ckpt, "--out", tmp_path / "m.safetensors")
    assert rc == 0 and set(read_safetensors(tmp_path / "m.safetensors")) == set(TinyNet().state_dict())


def test_extra_state_is_skipped_not_refused(tmp_path):
    """A module's ``_extra_state`` (any object) is not a weight and not a reason to refuse."""
    sd = {"w": torch.ones(2), "block._extra_state": {"version": 2}}
    out = export_safetensors(sd, tmp_path / "m.safetensors")
    assert set(read_safetensors(out)) == {"w"}
