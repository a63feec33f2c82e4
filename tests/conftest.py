"""Shared fixtures: tiny models and in-memory data, so the suite stays fast."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cli_support import TINY
from support import make_data

torch.set_num_threads(1)


@pytest.fixture
def data() -> TensorDataset:
    return make_data()


@pytest.fixture
def loader(data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=8)


@pytest.fixture
def as_device(monkeypatch):
    """Make the metric store treat CPU tensors as device tensors: the path that reads
    them all with one transfer, which tests check by counting reads (the machine may
    have no accelerator; on the host the store reads each value with ``item()``)."""
    from treadle.logging import store

    monkeypatch.setattr(store, "_on_host", lambda values: False)


@pytest.fixture
def tiny(tmp_path):
    """tests/cli_support.py's TINY config, written to a file."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path
