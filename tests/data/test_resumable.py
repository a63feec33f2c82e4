"""ResumableLoader (treadle/data/resumable.py): epochs count up by themselves, and its
place (taken inside an epoch, or at an epoch's end) comes back exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from treadle.data.resumable import ResumableLoader


def _data(n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))


def test_epochs_and_places():
    loader = ResumableLoader(DataLoader(_data(12), batch_size=4, shuffle=True), seed=1)
    epochs = [[b[0] for b in loader] for _ in range(3)]
    assert loader.epoch == 2 and not all(torch.equal(a, b) for a, b in zip(epochs[0], epochs[1]))
    again = ResumableLoader(DataLoader(_data(12), batch_size=4, shuffle=True), seed=1)
    it = iter(again)
    next(it)
    state = again.state_dict()
    assert state == {"epoch": 0, "batch_idx": 1, "seed": 1}
    fresh = ResumableLoader(DataLoader(_data(12), batch_size=4, shuffle=True), seed=99)
    fresh.load_state_dict(state)
    rest = [b[0] for b in fresh]
    assert all(torch.equal(a, b) for a, b in zip(rest, epochs[0][1:])) and len(rest) == 2
    assert fresh.state_dict() == {"epoch": 1, "batch_idx": 0, "seed": 1}  # an epoch taken to its end is over
    assert torch.equal(next(iter(fresh))[0], epochs[1][0])
    with pytest.raises(ValueError, match="batch_idx"):
        fresh.load_state_dict({"epoch": 0, "batch_idx": -1, "seed": 1})
