"""Ignite on the workload of peers_common.py, set up as its docs say:

* ``create_supervised_trainer(..., deterministic=True)``, a ``DeterministicEngine``, which
  "can produce exactly the same dataflow when resuming the run" with DataLoader workers,
  and ``ignite.utils.manual_seed(seed)`` ("Deterministic training", "DeterministicEngine");
* checkpoints: ``Checkpoint({"trainer", "model", "optimizer"}, DiskSaver(...))`` on
  ``Events.ITERATION_COMPLETED(every=...)``, resumed with ``Checkpoint.load_objects(to_load,
  checkpoint=torch.load(path))`` before ``trainer.run`` ("Resuming the training", ``Checkpoint``);
* several processes: ``idist.Parallel(backend="gloo", nproc_per_node=2)``, which starts the
  processes itself, with ``idist.auto_model``/``auto_optim``/``auto_dataloader``
  ("Distributed", ``idist.Parallel``); the process group's timeout by ``Parallel(...,
  timeout=...)``, which goes to ``init_process_group``.

    python run_ignite.py train --work-dir D --out W [--resume]
    python run_ignite.py dist --work-dir D [--timeout S]
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import Events, create_supervised_trainer
from ignite.handlers import Checkpoint, DiskSaver
from ignite.utils import manual_seed
from torch.nn import functional as F

from peers_common import (BATCH, CKPT_EVERY, EPOCHS, LR, Net, Noisy, SEED,
                          WORKERS, arguments, kill_if_due, loader, save_weights)


def build(args: argparse.Namespace, distributed: bool) -> tuple[Any, torch.nn.Module, Any, dict[str, Any]]:
    manual_seed(SEED)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    data: Any = loader()
    if distributed:
        model, optimizer = idist.auto_model(model), idist.auto_optim(optimizer)
        data = idist.auto_dataloader(Noisy(), batch_size=BATCH, shuffle=True, num_workers=WORKERS)
    trainer = create_supervised_trainer(model, optimizer, F.cross_entropy, deterministic=True)
    to_save = {"trainer": trainer, "model": model, "optimizer": optimizer}
    saver = Checkpoint(to_save, DiskSaver(Path(args.work_dir) / "checkpoints", require_empty=False), n_saved=None,
                       global_step_transform=lambda engine, _: engine.state.iteration)
    trainer.add_event_handler(Events.ITERATION_COMPLETED(every=CKPT_EVERY), saver)
    trainer.add_event_handler(Events.ITERATION_STARTED, lambda engine: kill_if_due(engine.state.iteration - 1))
    return trainer, model, data, to_save


def train(args: argparse.Namespace) -> None:
    trainer, model, data, to_save = build(args, distributed=False)
    if args.resume:
        saved = Path(args.work_dir) / "checkpoints"
        newest = max(saved.glob("checkpoint_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
        checkpoint = torch.load(newest, map_location="cpu")  # as Ignite's "Resuming the training" does
        Checkpoint.load_objects(to_load=to_save, checkpoint=checkpoint)
    trainer.run(data, max_epochs=EPOCHS)
    save_weights(model, args.out)


def dist_training(local_rank: int, args: argparse.Namespace) -> None:
    trainer, _, data, _ = build(args, distributed=True)
    trainer.run(data, max_epochs=EPOCHS)


def main() -> None:
    args = arguments(__doc__)
    if args.mode == "train":
        train(args)
        return
    options = dict(timeout=timedelta(seconds=args.timeout)) if args.timeout else {}
    with idist.Parallel(backend="gloo", nproc_per_node=2, **options) as parallel:
        parallel.run(dist_training, args)


if __name__ == "__main__":
    main()
