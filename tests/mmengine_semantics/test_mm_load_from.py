"""``load_from`` an MMEngine checkpoint: its ``state_dict`` is taken, read with
``weights_only=True``; the classes of its other entries (``message_hub``'s
``HistoryBuffer``, numpy scalars) are read as inert placeholders, never imported nor run.

``files/mmengine_tiny.pth`` was written by MMEngine 0.10.7 (``runner.save_checkpoint``
after 4 iterations of a tiny model, ``files/make_mmengine_tiny.py``); ``mmengine_tiny.json``
holds that model's ``state_dict()`` as lists, written by the same script."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import treadle
from treadle.checkpoint.io import UnsafeCheckpointError
from treadle.checkpoint.weights import load_weights
from support import ON_CPU

FILES = Path(__file__).parent / "files"
CKPT = FILES / "mmengine_tiny.pth"


class Tiny(nn.Module):
    """The MMEngine model's layers, as a plain module."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)
        self.fc2 = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.bn(self.fc1(x)))


def _expected() -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v) for k, v in json.loads((FILES / "mmengine_tiny.json").read_text()).items()}


def _assert_weights(model: nn.Module) -> None:
    got = model.state_dict()
    expected = _expected()
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        torch.testing.assert_close(got[k].cpu(), v.to(got[k].dtype), rtol=0, atol=0, msg=k)


def test_plain_weights_only_load_refuses_the_file():
    """What made load_from fail before: the file is not weights-only loadable as it is."""
    with pytest.raises(Exception, match="HistoryBuffer"):
        torch.load(CKPT, weights_only=True)


def test_load_weights_takes_the_state_dict_and_says_what_it_skipped(caplog):
    model = Tiny()
    with caplog.at_level(logging.INFO, logger="treadle"):
        report = load_weights(model, CKPT)
    assert report.ok and report.loaded == 9
    _assert_weights(model)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "skipped message_hub" in said and "mmengine.logging.history_buffer.HistoryBuffer" in said


def test_trainer_load_from_an_mmengine_checkpoint(tmp_path):
    trainer = treadle.Trainer(Tiny(), load_from=CKPT, strategy=ON_CPU)
    _assert_weights(trainer.module)


class _Marker:
    """Pickles as ``exec(<write the marker file>)``: run only if something executes it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('x')",))


def test_code_beside_the_weights_is_never_run(tmp_path):
    marker = tmp_path / "PWNED"
    sd = Tiny().state_dict()
    path = tmp_path / "foreign.pth"
    torch.save({"state_dict": sd, "message_hub": {"log_scalars": _Marker(marker)}}, path)
    model = Tiny()
    assert load_weights(model, path).ok
    for k, v in sd.items():
        assert torch.equal(model.state_dict()[k], v)
    assert not marker.exists()


def test_code_inside_the_weights_is_still_refused(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {**Tiny().state_dict(), "fc1.weight": _Marker(marker)}}, path)
    with pytest.raises(UnsafeCheckpointError):
        load_weights(Tiny(), path)
    assert not marker.exists()
