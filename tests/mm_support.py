"""A one-weight model and a recorder for comparing runs with MMEngine's numbers (the
numbers come from MMEngine 0.10.7 runs of the same model and data, see each test)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from treadle import Hook

#: What translating any MMEngine config adds, as MMEngine's Runner has it when the config says
#: nothing: its DDP wrapper (no buffer broadcast), its default CheckpointHook (each epoch, every
#: checkpoint kept) and LoggerHook (every 10 iterations).
RUNNER_DEFAULTS = {"strategy": {"type": "auto", "sync_buffers": False}, "checkpoint": {"interval": 1, "keep": None},
                   "log_interval": 10}


#: The Runner's default CheckpointHook in an iteration-based loop: its last checkpoint only.
SAVE_LAST = {"interval": None, "keep": None}


def engine_keys(cfg: dict[str, Any]) -> dict[str, Any]:
    """A translated config less the keys that hold the Runner's defaults, for a test that
    compares the rest or runs it with its own strategy, checkpoints and log interval (a key the
    config set to something else stays)."""
    def default(key: str, value: Any) -> bool:
        return (key in RUNNER_DEFAULTS and value == RUNNER_DEFAULTS[key]) or (key == "checkpoint" and value == SAVE_LAST)

    return {k: v for k, v in cfg.items() if not default(k, v)}


def translate(cfg: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """treadle.openmmlab.translate.translate, less the Runner's defaults (:func:`engine_keys`):
    the tests of one group of keys compare what that group gives."""
    from treadle.openmmlab.translate import translate as translate_all

    return engine_keys(translate_all(cfg, *args, **kwargs))


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
