"""One rank of a 2-process DDP (or FSDP or DeepSpeed: --strategy fsdp|deepspeed) training run (started by
tests/strategies/test_ddp.py with torchrun's environment variables).

    python ddp_script.py OUT_DIR [--strategy S] [--zero-stage Z] [--precision P] [--compile] [--work-dir D] [--batch B]
        [--shuffle] [--accumulate N]
        [--dropout P] [--max-iters N] [--kill-at N] [--term-at N] [--int-at N] [--raise-at N] [--resume]
        [--interval K] [--val] [--fault-attempt N]

``--fault-attempt N``: the faults fire only in attempt N of a torchrun ``--max-restarts``
job (TORCHELASTIC_RESTART_COUNT; a process not started by torchrun's agent is attempt 0).

Writes OUT_DIR/final_rank<r>.pt (weights), OUT_DIR/result_rank<r>.pt (metrics,
counters, all-reduce count, the iteration a resume started from, where
treadle.distributed.detect_launcher placed this process).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import TinyNet, make_data

import treadle
from treadle.distributed import detect_launcher


class Fault(treadle.Hook):
    """Kills, signals or raises on one rank at one iteration (after the checkpoint hook)."""

    priority = "LOWEST"

    def __init__(self, a):
        self.a = a
        self.resumed_at = None
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.armed = a.fault_attempt is None or a.fault_attempt == attempt

    def after_load_checkpoint(self, trainer, checkpoint):
        self.resumed_at = trainer.state.iter

    def after_train_iter(self, trainer, batch, outputs):
        done, rank = trainer.state.iter + 1, trainer.strategy.rank
        if not self.armed:
            return
        if done == self.a.kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if done == self.a.term_at and rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        if done == self.a.int_at and rank == 1:  # Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
        if done == self.a.raise_at and rank == 1:
            raise RuntimeError(f"boom on rank 1 at iteration {done}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--work-dir")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--max-epochs", type=int, default=2)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--term-at", type=int)
    p.add_argument("--int-at", type=int)
    p.add_argument("--raise-at", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--interval", type=int)
    p.add_argument("--val", action="store_true")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--fault-attempt", type=int)
    p.add_argument("--zero-stage", type=int, help="with --strategy deepspeed (parameters really partitioned at 3)")
    p.add_argument("--precision", default="32")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    strategy = a.strategy
    if a.zero_stage is not None:
        strategy = dict(type=a.strategy, zero_stage=a.zero_stage,
                        config={"zero_optimization": {"stage3_param_persistence_threshold": 0}})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyNet(dropout=a.dropout)
    train = DataLoader(make_data(48), batch_size=a.batch, shuffle=a.shuffle)
    val = DataLoader(make_data(37, seed=1), batch_size=3) if a.val else None  # ranks: 7 and 6 batches
    checkpoint = dict(interval=a.interval, by_epoch=False, keep=None) if a.interval else None
    fault = Fault(a)
    trainer = treadle.Trainer(
        model, work_dir=a.work_dir, train_dataloader=train, val_dataloader=val, loss_fn=nn.CrossEntropyLoss(),
        optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=a.max_epochs, accumulate=a.accumulate,
        metrics={"acc": treadle.Accuracy()} if a.val else None, seed=7, resume=a.resume,
        checkpoint=checkpoint if a.work_dir else False, hooks=[fault], log_interval=2, strategy=strategy,
        precision=a.precision, compile=a.compile,
    )
    calls = [0]
    ddp = getattr(trainer.model, "_orig_mod", trainer.model)  # under compile=True: the module compiled
    if isinstance(ddp, nn.parallel.DistributedDataParallel):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counting_hook(state, bucket):
            calls[0] += 1
            return allreduce_hook(state, bucket)
        ddp.register_comm_hook(None, counting_hook)
    metrics = trainer.fit()
    rank = trainer.strategy.rank
    os.makedirs(a.out, exist_ok=True)
    weights = trainer.strategy.get_full_model_state(trainer.module)  # FSDP: gathered on rank 0 only
    if weights:
        torch.save({k: v.detach().clone() for k, v in weights.items()}, os.path.join(a.out, f"final_rank{rank}.pt"))
    torch.save({"metrics": metrics, "iter": trainer.state.iter, "allreduces": calls[0],
                "world_size": trainer.strategy.world_size, "strategy": trainer.strategy.name,
                "resumed_at": fault.resumed_at, "dist_env": dataclasses.asdict(detect_launcher()),
                "node": os.environ.get("GROUP_RANK")},
               os.path.join(a.out, f"result_rank{rank}.pt"))


if __name__ == "__main__":
    main()
