"""Shared fixtures: tiny models and in-memory data, so the suite stays fast."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from support import make_data

torch.set_num_threads(1)


@pytest.fixture
def data() -> TensorDataset:
    return make_data()


@pytest.fixture
def loader(data: TensorDataset) -> DataLoader:
    return DataLoader(data, batch_size=8)
