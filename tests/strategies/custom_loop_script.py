"""A hand-written loop on the public Strategy API (tests/strategies/test_api_resume.py).

    python custom_loop_script.py STRATEGY WORK_DIR OUT     (STRATEGY: single|ddp|fsdp|deepspeed|deepspeed3)
                                 [--kill-at N] [--save-every K] [--control none|no-rng|no-loader]

Shuffled data, dropout, accumulative_counts=2 and a warmup scheduler; a checkpoint
every K iterations; ``--kill-at N``: SIGKILL itself after iteration N. Run under
tests/support.run_ranks for 2 processes. Rank 0 writes the final full weights and
optimizer state to OUT. ``--control``: a negative control that skips restoring the RNG
or the loader's place after the resume (the result must then differ).
"""

import argparse
import os
import signal

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle

p = argparse.ArgumentParser()
p.add_argument("strategy")
p.add_argument("work_dir")
p.add_argument("out")
p.add_argument("--kill-at", type=int, default=-1)
p.add_argument("--save-every", type=int, default=5)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--control", default="none", choices=["none", "no-rng", "no-loader"])
args = p.parse_args()

torch.set_num_threads(1)
spec = args.strategy
if spec == "deepspeed3":  # ZeRO-3 with every parameter really partitioned
    spec = dict(type="deepspeed", zero_stage=3, config={"zero_optimization": {"stage3_param_persistence_threshold": 0}})
strategy = treadle.build_strategy(spec, work_dir=args.work_dir, seed=3)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)
model, optim_wrapper, schedulers = strategy.prepare(
    model,
    optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2), accumulative_counts=2),
    param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=10)])
loader = strategy.prepare_dataloader(loader)

extra = strategy.load_or_resume(resume=True)
epoch0, it = (extra["epoch"], extra["iter"]) if extra else (0, 0)
if extra and args.control == "no-rng":
    torch.manual_seed(1234)
if extra and args.control == "no-loader":
    loader.set_epoch(epoch0)  # the epoch again from its first batch

for epoch in range(epoch0, args.epochs):
    for xb, yb in loader:
        xb, yb = xb.to(strategy.device), yb.to(strategy.device)  # single: CUDA where present; 2 ranks: the CPU
        with optim_wrapper.optim_context(model):
            loss = nn.functional.mse_loss(model(xb), yb)
            optim_wrapper.update_params(loss)
        for s in schedulers:
            s.step()
        it += 1
        if it % args.save_every == 0:
            strategy.save_checkpoint(os.path.join(args.work_dir, "ckpt", f"iter_{it:04d}"),
                                     extra_ckpt={"epoch": epoch, "iter": it})
        if it == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

weights = {k: v.clone() for k, v in strategy.model_state_dict().items()}  # references, as torch gives them
torch.manual_seed(99)
strategy.load_model_state_dict({f"module.{k}": torch.randn_like(v) for k, v in weights.items()}, strict=True)
changed = strategy.model_state_dict()  # a collective under FSDP: every rank calls it
assert strategy.rank != 0 or not torch.equal(changed["0.weight"], weights["0.weight"])
strategy.load_model_state_dict({f"module.{k}": v for k, v in weights.items()}, strict=True)  # FSDP: rank 0 ones
again = strategy.model_state_dict()
assert all(torch.equal(again[k], v) for k, v in weights.items())  # FSDP: on rank 0 (others: {})
optim = strategy.optim_state_dict()["optimizer"]
if args.strategy.startswith("deepspeed"):  # ZeRO partitions: gathered whole per parameter (collectives)
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    params = list(strategy.module.parameters())
    optim = {"state": {i: {"fp32": safe_get_full_fp32_param(p), "exp_avg": safe_get_full_optimizer_state(p, "exp_avg"),
                           "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq")} for i, p in enumerate(params)}}
if args.strategy == "fsdp":  # sharded optimizer state: gathered whole (a collective)
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map_only

    optim = tree_map_only(DTensor, lambda t: t.full_tensor(), optim)
if strategy.rank == 0:
    torch.save({"weights": weights, "optim_state": optim["state"], "iter": it}, args.out)
