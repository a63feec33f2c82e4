"""The parts a config file names in tests/config/test_model_doors.py (tests/ is on the ranks'
PYTHONPATH): token batches, and a hook that writes each rank's peak resident memory when
training is about to start (the model built, sharded and filled; the optimizer built)."""

from __future__ import annotations

import json
import os

import torch
from torch.utils.data import Dataset

import treadle


class Tokens(Dataset):
    """``n`` sequences of ``seq`` token ids below ``vocab``, each its own label."""

    def __init__(self, n: int = 8, vocab: int = 1000, seq: int = 8) -> None:
        self.n, self.vocab, self.seq = n, vocab, seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = (torch.arange(self.seq) * 7 + i * 13) % self.vocab
        return {"input_ids": x, "labels": x}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM: not inherited from its parent)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class PeakBeforeTraining(treadle.Hook):
    """Writes ``{"rank": r, "peak": bytes}`` to ``<out>/peak.rank<r>.json`` at ``before_train``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def before_train(self, trainer) -> None:
        rank = trainer.strategy.rank
        with open(os.path.join(self.out, f"peak.rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "peak": peak_rss()}, f)
