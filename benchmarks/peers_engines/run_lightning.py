"""Lightning on the workload of peers_common.py, set up as its docs say:

* reproducibility: ``seed_everything(seed, workers=True)`` and ``Trainer(deterministic=True)``
  (Lightning docs, "Reproducibility");
* checkpoints: ``ModelCheckpoint(every_n_train_steps=..., save_last=True)``, resumed with
  ``trainer.fit(..., ckpt_path="last")`` ("Saving and loading checkpoints", "ModelCheckpoint");
* several processes: ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, whose launcher
  starts the other process by running this script again ("GPU training (Intermediate)": the
  ``ddp`` strategy; on the CPU it takes gloo); the process group's timeout by
  ``DDPStrategy(timeout=...)``.

    python run_lightning.py train --work-dir D --out W [--resume]
    python run_lightning.py dist --work-dir D [--timeout S]
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.nn import functional as F

from peers_common import CKPT_EVERY, EPOCHS, LR, Net, SEED, arguments, kill_if_due, loader, save_weights


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=LR)


class Kill(L.Callback):
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        kill_if_due(trainer.global_step)  # optimizer steps done so far


def trainer(args: argparse.Namespace, **options: Any) -> L.Trainer:
    checkpoints = ModelCheckpoint(dirpath=Path(args.work_dir) / "checkpoints", every_n_train_steps=CKPT_EVERY,
                                  save_top_k=-1, save_last=True)
    return L.Trainer(max_epochs=EPOCHS, deterministic=True, callbacks=[checkpoints, Kill()],
                     default_root_dir=args.work_dir, enable_progress_bar=False, enable_model_summary=False,
                     log_every_n_steps=5, **options)


def main() -> None:
    args = arguments(__doc__)
    L.seed_everything(SEED, workers=True)
    module = Module()
    if args.mode == "train":
        t = trainer(args, accelerator="cpu", devices=1)
        t.fit(module, loader(), ckpt_path="last" if args.resume else None)
        save_weights(module, args.out)
    else:
        strategy = DDPStrategy(timeout=timedelta(seconds=args.timeout)) if args.timeout else "ddp"
        trainer(args, accelerator="cpu", devices=2, strategy=strategy).fit(module, loader())


if __name__ == "__main__":
    main()
