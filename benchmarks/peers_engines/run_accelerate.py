"""Accelerate on the workload of peers_common.py, set up as its docs say:

* reproducibility: ``set_seed(seed)`` and ``DataLoaderConfiguration(use_seedable_sampler=True)``
  with ``set_epoch`` each epoch ("Reproducibility", ``DataLoaderConfiguration``'s docstring);
* checkpoints: ``save_state(dir)`` every few steps into a folder named by the step, as
  Accelerate's example ``examples/by_feature/checkpointing.py`` does; resumed with
  ``load_state(newest)``, the step read from its name, and ``skip_first_batches(loader, n)``
  for the rest of the epoch ("Checkpointing", "Resuming training from a checkpoint");
* several processes: ``accelerate launch --multi_gpu --num_processes 2`` with
  ``Accelerator(cpu=True)`` (gloo); the process group's timeout by
  ``InitProcessGroupKwargs(timeout=...)`` ("Launching", "Kwargs handlers").

    python run_accelerate.py train --work-dir D --out W [--resume]
    accelerate launch --multi_gpu --num_processes 2 run_accelerate.py dist --work-dir D [--timeout S]
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, set_seed
from torch.nn import functional as F

from peers_common import CKPT_EVERY, EPOCHS, LR, Net, SEED, arguments, kill_if_due, loader, save_weights


def run(args: argparse.Namespace) -> None:
    set_seed(SEED)
    handlers = [InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=args.timeout))] if args.timeout else []
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
                      kwargs_handlers=handlers)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer, data = acc.prepare(model, optimizer, loader())
    saved = Path(args.work_dir) / "checkpoints"
    done = 0
    if args.resume:
        done = max(int(d.name.split("_")[1]) for d in saved.glob("step_*"))
        acc.load_state(str(saved / f"step_{done}"))
    per_epoch = len(data)
    first_epoch, skip = divmod(done, per_epoch)
    model.train()
    for epoch in range(first_epoch, EPOCHS):
        data.set_epoch(epoch)
        batches = acc.skip_first_batches(data, skip) if epoch == first_epoch and skip else data
        for x, y in batches:
            kill_if_due(done)
            loss = F.cross_entropy(model(x), y)
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            done += 1
            if done % CKPT_EVERY == 0:
                acc.save_state(str(saved / f"step_{done}"))
    acc.wait_for_everyone()
    if args.out:
        save_weights(acc.unwrap_model(model), args.out)
    acc.end_training()


def main() -> None:
    run(arguments(__doc__))


if __name__ == "__main__":
    main()
