"""treadle on the workload of peers_common.py, set up as its docs say (docs/checkpoints.md,
docs/reproducibility.md, docs/distributed.md).

    python run_treadle.py train --work-dir D --out W [--resume]   # Trainer(..., resume=True)

Several processes go through treadle's own launcher with the config beside this file
(``treadle train treadle_job.yaml --nproc 2``; the harness writes that command).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from peers_common import CKPT_EVERY, EPOCHS, LR, Net, SEED, arguments, kill_if_due, loader, save_weights


def train(args: argparse.Namespace) -> None:
    import treadle

    class Kill(treadle.Hook):
        priority = "HIGHEST"

        def before_train_iter(self, trainer: Any, batch: Any) -> None:
            kill_if_due(trainer.state.iter)  # optimizer steps done so far

    torch.manual_seed(SEED)  # the initial weights (the Trainer seeds everything after, from seed=)
    trainer = treadle.Trainer(
        Net(), work_dir=args.work_dir, train_dataloader=loader(), loss_fn=nn.CrossEntropyLoss(),
        optimizer=dict(type="AdamW", lr=LR), max_epochs=EPOCHS,
        checkpoint=dict(interval=CKPT_EVERY, by_epoch=False), seed=SEED,
        resume=args.resume,  # the newest verified checkpoint in work_dir
        hooks=[Kill()], progress=False, log_interval=5)
    trainer.fit()
    save_weights(trainer.model, args.out)


def main() -> None:
    train(arguments(__doc__, modes=("train",)))


if __name__ == "__main__":
    main()
