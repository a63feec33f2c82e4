"""SyncBuffersHook: average the model's buffers over the processes after each training epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from treadle.hooks.base import Hook, Priority

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class SyncBuffersHook(Hook):
    """After every training epoch, replace each floating-point buffer of the model
    (BatchNorm's running mean and variance) by its mean over the processes, so that
    validation and checkpoints see one set of statistics, as MMEngine's hook of the
    same name does. One process: nothing to do. Integer buffers
    (BatchNorm's batch counter) are left alone."""

    priority = Priority.NORMAL

    def after_train_epoch(self, trainer: "RunView") -> None:
        if trainer.strategy.world_size < 2 or not dist.is_initialized():
            return
        buffers = [b for b in trainer.module.buffers() if torch.is_floating_point(b)]
        if not buffers:
            return
        flat = torch.cat([b.detach().reshape(-1).float() for b in buffers])  # one all-reduce for all of them
        dist.all_reduce(flat)
        flat /= trainer.strategy.world_size
        offset = 0
        for b in buffers:
            n = b.numel()
            b.copy_(flat[offset:offset + n].view_as(b))
            offset += n


__all__ = ["SyncBuffersHook"]
