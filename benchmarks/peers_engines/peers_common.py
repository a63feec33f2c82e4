"""What every engine of ``benchmarks/peers_compare.py`` trains, and the faults it is given.

The same for each engine: the data (:class:`Noisy`, map-style, 80 items whose every read
draws from torch, numpy and ``random``, as an augmentation does), the model (:class:`Net`,
with dropout, so the main process's torch RNG matters too), the loader (:func:`loader`:
batch 8, shuffled, 2 workers: 10 iterations an epoch), AdamW at lr 1e-2, 3 epochs, a
checkpoint every :data:`CKPT_EVERY` iterations, seed 0.

Faults come through the environment, which every launcher passes to its processes:

* ``PEERS_KILL_AT=K``: the process sends itself SIGKILL before the step that follows the
  K-th optimizer step (:func:`kill_if_due`, which each engine calls where it starts a step);
* ``PEERS_FAULT=raise|hang`` with ``PEERS_FAULT_AT=N`` and ``PEERS_FAULT_RANK=R``: rank R's
  N-th training forward raises, or sleeps forever (:class:`Net`); the moment is written to
  ``PEERS_DIR/fault.time``;
* ``PEERS_DIR``: each process that builds a :class:`Net` writes its pid there (``pid-*``),
  so that the harness can tell which processes are left after the job has ended.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

N_ITEMS, BATCH = 80, 8
WORKERS = int(os.environ.get("PEERS_WORKERS", "2"))  # the fault jobs read in the main process
FEATURES, CLASSES = 8, 4
EPOCHS, CKPT_EVERY, LR, SEED = 3, 4, 1e-2, 0
ITERS_PER_EPOCH = N_ITEMS // BATCH
TOTAL_ITERS = EPOCHS * ITERS_PER_EPOCH


class Noisy(torch.utils.data.Dataset):
    """Fixed points and labels (from their own generator); each read adds noise drawn from
    torch's, numpy's and python's global RNGs, whichever process reads it."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(N_ITEMS, FEATURES, generator=g)
        self.y = self.x[:, :CLASSES].argmax(1)

    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = 0.1 * torch.randn(FEATURES) + 0.1 * torch.from_numpy(np.random.standard_normal(FEATURES)).float()
        return self.x[i] + noise + 0.1 * random.random(), self.y[i]


def loader(dataset: torch.utils.data.Dataset | None = None, **kwargs) -> torch.utils.data.DataLoader:
    """The one DataLoader every engine is given (``kwargs`` add an engine's documented options)."""
    options = dict(batch_size=BATCH, shuffle=True, num_workers=WORKERS, **kwargs)
    return torch.utils.data.DataLoader(dataset or Noisy(), **options)


class Net(nn.Module):
    """8 -> 32 -> 4 with dropout; the fault of ``PEERS_FAULT`` sits in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, CLASSES))
        self.calls = 0
        self.fault = os.environ.get("PEERS_FAULT")
        self.fault_at = int(os.environ.get("PEERS_FAULT_AT", "3"))
        self.fault_rank = int(os.environ.get("PEERS_FAULT_RANK", "1"))
        if os.environ.get("PEERS_DIR"):
            (Path(os.environ["PEERS_DIR"]) / f"pid-{os.getpid()}").write_text(str(os.getpid()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.fault:
            self.calls += 1
            if self.calls == self.fault_at and rank() == self.fault_rank:
                (Path(os.environ["PEERS_DIR"]) / "fault.time").write_text(repr(time.time()))
                if self.fault == "raise":
                    raise RuntimeError(f"the fault of this benchmark: rank {self.fault_rank} fails")
                while True:  # hangs: asleep in Python, as a rank stuck on I/O or a lock would be
                    time.sleep(3600)
        return self.body(x)


def rank() -> int:
    """This process's rank (0 when there is no process group)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def kill_if_due(done: int) -> None:
    """SIGKILL this process when ``done`` optimizer steps equal ``PEERS_KILL_AT``."""
    if os.environ.get("PEERS_KILL_AT") == str(done):
        os.kill(os.getpid(), signal.SIGKILL)


def bare(model: nn.Module) -> nn.Module:
    """The :class:`Net` inside an engine's wrappers (DDP's ``module``, an engine's attribute)."""
    for m in model.modules():
        if isinstance(m, Net):
            return m
    raise TypeError(f"no Net in {type(model).__name__}")


def save_weights(model: nn.Module, path: str | Path) -> None:
    """The final weights, for the harness to compare with another run's."""
    torch.save({k: v.detach().clone() for k, v in bare(model).state_dict().items()}, path)


def done_marker(path: str | Path | None) -> None:
    """Writes ``path`` (when given): the run reached its end."""
    if path:
        Path(path).write_text("done")


def arguments(doc: str, modes: tuple[str, ...] = ("train", "dist"), **extra: str) -> argparse.Namespace:
    """The command line of every engine's script: ``MODE --work-dir D [--out W] [--resume]
    [--timeout S]``, and ``extra`` options (name: default)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("mode", choices=modes)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--out", help="the final weights (train)")
    p.add_argument("--resume", action="store_true", help="resume the engine's documented way (train)")
    p.add_argument("--timeout", type=float, default=None, help="the process group's timeout, seconds (dist)")
    for name, default in extra.items():
        p.add_argument(f"--{name}", default=default)
    return p.parse_args()
