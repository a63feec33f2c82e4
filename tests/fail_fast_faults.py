"""Faults for tests/distributed/test_fail_fast.py's jobs (tests/ is on the workers'
PYTHONPATH): a model that raises on one rank, a save that fails on one rank, and a hook
that records each process (and its DataLoader worker) and slows the iterations down."""

from __future__ import annotations

import errno
import os
import signal
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
    """Raises in its ``raise_at``-th training forward on rank ``raise_on`` (-1: never);
    hangs in its ``hang_at``-th one on rank ``hang_on`` (or each rank of a list):
    ``hang="sleep"`` sleeps forever, ``"gil"`` sleeps in native code that holds the GIL
    (libc's sleep through ``ctypes.PyDLL``: no other thread of the process runs Python),
    ``"collective"`` enters a barrier of a group of every rank that the others never enter,
    ``"exit"`` ends the process with ``os._exit(3)`` (no Python error). Writes the time of
    the fault to ``<mark>.rank<r>`` when ``mark`` is given."""

    def __init__(self, raise_on: int = -1, raise_at: int = 8, hang_on: int | list[int] = -1, hang_at: int = 5,
                 hang: str = "sleep", mark: str = "") -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.raise_on, self.raise_at, self.calls = raise_on, raise_at, 0
        self.hang_on = list(hang_on) if isinstance(hang_on, (list, tuple)) else [hang_on]
        self.hang_at, self.hang, self.mark = hang_at, hang, mark
        self.group = None

    def forward(self, x):
        if self.hang == "collective" and self.group is None and self.training:  # every rank's first forward
            self.group = torch.distributed.new_group(backend="gloo")
        if self.training and (_rank() == self.raise_on or _rank() in self.hang_on):
            self.calls += 1
            if self.calls == self.raise_at and _rank() == self.raise_on:
                raise ValueError(f"bad sample on rank {self.raise_on} (simulated)")
            if self.calls == self.hang_at and _rank() in self.hang_on:
                if self.mark:
                    with open(f"{self.mark}.rank{_rank()}", "w") as f:
                        f.write(str(time.time()))
                if self.hang == "exit":
                    os._exit(3)
                if self.hang == "collective":
                    torch.distributed.barrier(group=self.group)
                if self.hang == "gil":
                    import ctypes

                    while True:  # (a signal may cut one sleep short)
                        ctypes.PyDLL(None).sleep(ctypes.c_uint(100000))
                time.sleep(10**9)
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


class FullDisk(treadle.Hook):
    """From iteration ``at`` on (rank ``rank``), every write of the log writer class
    ``writer`` (``treadle.logging.writers.JsonlWriter``, ``...backends.CsvWriter``,
    ``...backends.TensorBoardWriter``) fails as on a full disk; ``checkpoint=True``: the
    checkpointer's fsync fails too (a disk that stays full)."""

    def __init__(self, writer: str, at: int = 7, rank: int = 0, checkpoint: bool = True) -> None:
        self.writer, self.at, self.rank, self.checkpoint = writer, at, rank, checkpoint

    def before_train_iter(self, trainer, batch) -> None:
        if _rank() != self.rank or trainer.state.iter + 1 != self.at:
            return
        import importlib

        module, name = self.writer.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)

        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        cls._write_batch = full
        if self.checkpoint:
            os.fsync = full


class KillWorker(treadle.Hook):
    """After iteration ``at`` (rank ``rank``), a DataLoader worker of this process is
    killed with SIGKILL, as the out-of-memory killer does, and the hook waits ``wait_s``
    (so that torch's SIGCHLD handler raises here, outside the step)."""

    def __init__(self, at: int = 7, rank: int = 0, wait_s: float = 3.0) -> None:
        self.at, self.rank, self.wait_s = at, rank, wait_s

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if _rank() != self.rank or trainer.state.iter + 1 != self.at:
            return
        import multiprocessing

        os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
        time.sleep(self.wait_s)
