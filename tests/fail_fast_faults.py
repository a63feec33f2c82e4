"""Faults for tests/distributed/test_fail_fast.py's jobs (tests/ is on the workers'
PYTHONPATH): a model that raises on one rank, a save that fails on one rank, and a hook
that records each process (and its DataLoader worker) and slows the iterations down."""

from __future__ import annotations

import errno
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

import treadle


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Numbers(Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Net(nn.Module):
    """Raises in its ``raise_at``-th training forward on rank ``raise_on`` (-1: never)."""

    def __init__(self, raise_on: int = -1, raise_at: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.raise_on, self.raise_at, self.calls = raise_on, raise_at, 0

    def forward(self, x):
        if self.training and _rank() == self.raise_on:
            self.calls += 1
            if self.calls == self.raise_at:
                raise ValueError(f"bad sample on rank {self.raise_on} (simulated)")
        return self.fc(x)


class Record(treadle.Hook):
    """Writes this process's pid to ``<dir>/pid.rank<r>`` and sleeps ``secs`` per
    iteration, so that a job left alone runs for minutes."""

    def __init__(self, dir: str, secs: float = 0.1) -> None:
        self.dir, self.secs = dir, secs

    def before_train(self, trainer) -> None:
        with open(os.path.join(self.dir, f"pid.rank{_rank()}"), "w") as f:
            f.write(str(os.getpid()))

    def after_train_iter(self, trainer, batch, outputs) -> None:
        time.sleep(self.secs)
        with open(os.path.join(self.dir, f"iter.rank{_rank()}"), "w") as f:
            f.write(str(trainer.state.iter + 1))


class FailSave(treadle.Hook):
    """From the ``nth`` checkpoint save of rank ``rank`` on, every fsync fails as on a
    full disk (the checkpointer's own write path, as a real ENOSPC)."""

    def __init__(self, rank: int = 0, nth: int = 1) -> None:
        self.rank, self.nth, self.n = rank, nth, 0

    def before_save_checkpoint(self, trainer, checkpoint) -> None:
        if _rank() == self.rank:
            self.n += 1
            if self.n >= self.nth:
                def full(fd: int) -> None:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                os.fsync = full
