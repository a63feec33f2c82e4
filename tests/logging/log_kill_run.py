"""A small run whose log files tests/logging/test_logs_after_kill.py compares: killed with
SIGKILL after ``--kill-at`` iterations (tests/faults.py), or resumed with ``--resume``."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: faults.py, support.py

import torch
from faults import SigkillAt
from support import TinyNet, make_data
from torch.utils.data import DataLoader

import treadle

# Events written at once: the interrupted run's events after its checkpoint are on disk when it is killed.
TENSORBOARD = {"type": "tensorboard", "flush_secs": 0}

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("work_dir")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    treadle.seeding.seed_everything(0)
    data = make_data(96)
    hooks = [SigkillAt(rank=0, at_iter=args.kill_at)] if args.kill_at else []
    treadle.Trainer(TinyNet(), work_dir=args.work_dir, train_dataloader=DataLoader(data, batch_size=8, shuffle=True),
                    val_dataloader=DataLoader(data, batch_size=32), loss_fn=torch.nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.1), max_iters=36, val_interval=10, log_interval=3,
                    checkpoint=dict(interval=7, by_epoch=False, keep=2), seed=0, hooks=hooks, progress=False,
                    log_writers=["jsonl", "csv", TENSORBOARD], resume=args.resume).fit()
