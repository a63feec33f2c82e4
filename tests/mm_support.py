"""A one-weight model and a recorder for comparing runs with MMEngine's numbers (the
numbers come from MMEngine 0.10.7 runs of the same model and data, see each test)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from treadle import Hook


class OneWeight(nn.Module):
    """``loss = (w * x).mean()``, w starting at 1: its value shows every optimizer step."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).mean()


class ValueLoss(nn.Module):
    """``loss`` = the batch's value (the weight gets a zero gradient): logs show the smoothing."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * 0).sum() + x.mean()


def loader(values: list[float]) -> DataLoader:
    """Batches of one value each, in order."""
    return DataLoader([torch.tensor([v]) for v in values], batch_size=1)


class Record(Hook):
    """After every iteration (after the EMA hook): the weight, and the average's if any."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.w: list[float] = []
        self.ema: list[float] = []

    def after_train_iter(self, trainer: Any, batch: Any, outputs: Any) -> None:
        self.w.append(trainer.module.w.item())
        if trainer.ema is not None:
            self.ema.append(trainer.ema.w.item())
