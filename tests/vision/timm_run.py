"""A run with a timm scheduler (by updates, accumulation 2), checkpointed every 4 iterations:
``timm_run.py WORK_DIR [--kill-at N] [--resume]``. ``--kill-at N`` SIGKILLs the process after
iteration N; at the end WORK_DIR/final.pt holds the weights and the lr of each iteration run."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vision_env import load_torchvision

load_torchvision()

import torch  # noqa: E402

import treadle  # noqa: E402
from test_timm_schedulers import RecordLR, trainer  # noqa: E402


class KillAt(treadle.Hook):
    priority = "LOWEST"

    def __init__(self, at: int | None) -> None:
        self.at = at

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if self.at is not None and trainer.state.iter + 1 == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--kill-at", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    record = RecordLR()
    t, model = trainer(args.work_dir, "updates", 2, hooks=[record, KillAt(args.kill_at)], resume=args.resume,
                       checkpoint=dict(interval=4, by_epoch=False, keep=None))
    t.fit()
    torch.save({"model": model.state_dict(), "lrs": record.lrs}, args.work_dir / "final.pt")


if __name__ == "__main__":
    main()
