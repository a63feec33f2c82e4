"""The figures of a disk-full error: a checkpoint file's size, the free space, human units."""

from __future__ import annotations

import io
import os
import shutil

import pytest
import torch
from torch import nn

from treadle.checkpoint import diskspace


def _state() -> dict:
    model = nn.Sequential(nn.Linear(30, 40), nn.Linear(40, 5))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 30)).sum().backward()
    opt.step()
    w = model[0].weight
    return {"model": model.state_dict(), "optim": opt.state_dict(), "view": w[3:7, ::2], "again": w,
            "empty": torch.empty(0), "meta": {"iter": 7, "name": "x", "rng": torch.get_rng_state()}}


def _real_size(obj) -> int:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return len(buf.getvalue())


def test_saved_size_is_what_torch_save_writes():
    state = _state()
    assert diskspace.saved_size(state) == _real_size(state)  # shared storages and views counted once


def test_the_fallback_for_older_torch_is_close(monkeypatch):
    state = _state()
    monkeypatch.delattr(torch.serialization, "skip_data", raising=False)
    estimate, real = diskspace.saved_size(state), _real_size(state)
    assert abs(estimate - real) <= 0.02 * real + 1024


def test_saved_size_is_none_for_what_cannot_be_saved():
    assert diskspace.saved_size({"f": lambda: 0}) is None


def test_files_on_disk_rounds_each_file_up(tmp_path):
    unit = os.statvfs(tmp_path).f_frsize
    assert diskspace.files_on_disk([1, unit, unit + 1], tmp_path) == unit * (1 + 1 + 2) + unit  # + the directory


def test_free_space_of_a_path_not_made_yet(tmp_path):
    free, mount = diskspace.free_space(tmp_path / "not" / "yet")
    assert abs(free - shutil.disk_usage(tmp_path).free) < 100_000_000 and os.path.ismount(mount)
    assert str(tmp_path).startswith(str(mount))


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_100_000, "1.1 MB"),
                                     (12_345_678, "12.3 MB"), (999_960_000, "1.0 GB"), (3 * 10**15, "3.0 PB")])
def test_human_bytes(n, text):
    assert diskspace.human_bytes(n) == text
