"""A training run for the resume tests, started in a subprocess so it can be killed.

    python resume_script.py WORK_DIR [--kill-at N] [--term-at N] [--resume] [--variant NAME]
        [--interval K] [--by-epoch] [--no-rng] [--no-data-pos] [--kill-in-save N]

It trains a small dropout MLP on shuffled data with two DataLoader workers and saves
its final weights (model, and EMA when on) to WORK_DIR/final.pt.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
import treadle.seeding

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from faults import SignalAt


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work_dir")
    p.add_argument("--kill-at", type=int)
    p.add_argument("--term-at", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--variant", default="plain")
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--by-epoch", action="store_true")
    p.add_argument("--no-rng", action="store_true")
    p.add_argument("--no-data-pos", action="store_true")
    p.add_argument("--kill-in-save", type=int, help="SIGKILL half-way through the N-th checkpoint save")
    a = p.parse_args()
    torch.set_num_threads(1)

    if a.no_rng:  # negative control: forget the RNG
        import treadle.engine.loops as loops
        loops.set_rng_state = lambda state: None
    if a.no_data_pos:  # negative control: restart the epoch's data instead of skipping ahead
        from treadle.engine.loops import TrainLoop
        orig = TrainLoop.load_state_dict

        def load_state_dict(self, state):
            orig(self, state)
            self.resume_pos["batch_idx"] = 0
        TrainLoop.load_state_dict = load_state_dict
    if a.kill_in_save:
        import treadle.checkpoint.io as cio
        orig_write, count = cio._write_durably, {"saves": 0, "files": 0}
        orig_save = cio.save_checkpoint

        def save(*args, **kw):
            count["saves"] += 1
            return orig_save(*args, **kw)

        def write(path, *args, **kw):
            if count["saves"] == a.kill_in_save:
                os.kill(os.getpid(), signal.SIGKILL)
            return orig_write(path, *args, **kw)
        cio._write_durably, cio.save_checkpoint = write, save
        import treadle.engine.trainer as tr
        tr.save_checkpoint = save

    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 8, generator=g)
    y = torch.randint(0, 4, (60,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=6, shuffle=True, num_workers=2)
    kw = dict(max_epochs=3)
    extra = {}
    if a.variant == "full":  # bf16, accumulation, EMA, warmup + cosine
        extra = dict(precision="bf16", accumulate=3, ema=dict(momentum=0.9),
                     schedulers=[dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=5),
                                 dict(type="CosineAnnealingLR", by_epoch=False, begin=5, eta_min=1e-4)])
    if a.variant == "iter":
        kw = dict(max_iters=25)
    hooks = []
    if a.kill_at:
        hooks.append(SignalAt(a.kill_at, signal.SIGKILL))
    if a.term_at:
        hooks.append(SignalAt(a.term_at, signal.SIGTERM))
    treadle.seeding.seed_everything(0)  # the initial weights must not depend on the process
    trainer = treadle.Trainer(Net(), work_dir=a.work_dir, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                              optimizer=dict(type="AdamW", lr=3e-3), seed=0, resume=a.resume, hooks=hooks,
                              checkpoint=dict(interval=a.interval, by_epoch=a.by_epoch, keep=3), log_interval=5,
                              **kw, **extra)
    trainer.fit()
    final = {"model": trainer.module.state_dict()}
    if trainer.ema is not None:
        final["ema"] = trainer.ema.state_dict()
    torch.save(final, os.path.join(a.work_dir, "final.pt"))


if __name__ == "__main__":
    sys.exit(main())
