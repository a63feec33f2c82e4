"""One rank of a 2-process DDP run with train_metrics (started by tests/hooks/test_train_metrics.py
with torchrun's environment variables).

    python train_metrics_ranks.py WORK_DIR [crash|resume]

Each rank trains on its half of each global batch (batch 4 per rank, unshuffled), logs
``train/acc`` every 2 iterations (rank 0 writes WORK_DIR/log.jsonl), saves a checkpoint
every 3 iterations and saves the outputs and targets its train metrics were fed to
WORK_DIR/seen_rank<r>.pt. ``crash``: every rank raises after iteration 4 (the checkpoint
at 3 is inside a log interval); ``resume``: go on from the latest checkpoint.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faults import CrashAt
from support import TinyNet, make_data

import treadle
from treadle.seeding import seed_everything


def build(work_dir: str, batch_size: int, loss_fn, hooks=(), resume: bool = False, strategy="auto") -> treadle.Trainer:
    """The run; the test builds the one-process reference (doubled batch) with it too."""
    seed_everything(0)
    return treadle.Trainer(TinyNet(), work_dir=work_dir, train_dataloader=DataLoader(make_data(48), batch_size=batch_size),
                           loss_fn=loss_fn, optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0, log_interval=2,
                           train_metrics={"acc": treadle.Accuracy()}, log_writers=("jsonl",), progress=False,
                           checkpoint=dict(interval=3, by_epoch=False, keep=10), hooks=list(hooks), resume=resume,
                           strategy=strategy)


class Recorded:
    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, outputs, targets):
        self.seen.append((outputs.detach().clone(), targets.clone()))
        return nn.functional.cross_entropy(outputs, targets)


if __name__ == "__main__":
    loss = Recorded()
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    crash = [CrashAt(4, RuntimeError("crash after iteration 4"))] if mode == "crash" else []
    trainer = build(sys.argv[1], 4, loss, hooks=crash, resume=mode == "resume")
    assert trainer.strategy.world_size == 2, trainer.strategy
    trainer.fit()
    torch.save(loss.seen, os.path.join(sys.argv[1], f"seen_rank{trainer.strategy.rank}.pt"))
