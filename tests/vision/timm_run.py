"""A run with a timm scheduler (by updates, accumulation 2), checkpointed every 4 iterations:
``timm_run.py WORK_DIR [--kill-at N] [--resume]``. ``--kill-at N`` SIGKILLs the process after
iteration N; at the end WORK_DIR/final.pt holds the weights and the lr of each iteration run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/: faults

from vision_env import load_torchvision

load_torchvision()

import torch  # noqa: E402

from faults import SigkillAt  # noqa: E402
from test_timm_schedulers import RecordLR, trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--kill-at", type=int)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    record = RecordLR()
    kill = [SigkillAt(None, args.kill_at)] if args.kill_at is not None else []
    t, model = trainer(args.work_dir, "updates", 2, hooks=[record, *kill], resume=args.resume,
                       checkpoint=dict(interval=4, by_epoch=False, keep=None))
    t.fit()
    torch.save({"model": model.state_dict(), "lrs": record.lrs}, args.work_dir / "final.pt")


if __name__ == "__main__":
    main()
