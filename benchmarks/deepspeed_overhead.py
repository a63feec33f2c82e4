"""Per-step cost of treadle's DeepSpeed strategy against a raw DeepSpeed loop (CPU, gloo, 2 processes).

One training loop, written twice, in the same 2 processes:

* raw: ``deepspeed.initialize(model, torch.optim.AdamW, config)`` with the config treadle
  wrote (ZeRO stage ``--stage``, no clipping, one micro-batch per step), a ``DataLoader`` over
  a ``DistributedSampler`` (``set_epoch`` each epoch), ``engine(x)``,
  ``engine.backward(loss)``, ``engine.step()``;
* treadle: ``treadle.build_strategy(dict(type="deepspeed", zero_stage=S))``,
  ``strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))``,
  ``strategy.prepare_dataloader(loader)`` and ``optim_wrapper.update_params(loss)``.

An MLP (``--dim``-``--hidden``-``--hidden``-10) on in-memory data, ``--batch`` samples per
process and step, ``--steps`` steps per epoch. Whole epochs of the two loops are timed in
turn (the order reversed every other round), ``--warmup`` rounds left out, then ``--reps``
rounds; an epoch's time is its slower rank's. Reported: each loop's median time per step,
and the median over rounds of the treadle/raw ratio within a round, with its quartiles,
beside a control: the raw loop built a second time, whose ratio to the first would be 1 on a
quiet machine.

    python benchmarks/deepspeed_overhead.py [--stage 2] [--reps 20] [--steps 50]
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LR = 1e-3


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import treadle

    torch.set_num_threads(1)
    strategy = treadle.build_strategy(dict(type="deepspeed", zero_stage=args.stage), seed=0)
    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * 2
    data = TensorDataset(torch.randn(n, args.dim, generator=g), torch.randint(0, 10, (n,), generator=g))
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                           nn.Linear(args.hidden, 10))
    loss_fn = nn.CrossEntropyLoss()

    model, optim_wrapper = strategy.prepare(copy.deepcopy(module),
                                            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR)),
                                            dispatch_kwargs=dict(train_micro_batch_size_per_gpu=args.batch))
    loader = strategy.prepare_dataloader(DataLoader(data, batch_size=args.batch, shuffle=True))

    def treadle_epoch() -> int:
        for x, y in loader:
            optim_wrapper.update_params(loss_fn(model(x), y))
        return len(loader)

    import deepspeed

    def raw_loop():
        raw_module = copy.deepcopy(module)
        engine, *_ = deepspeed.initialize(model=raw_module, optimizer=torch.optim.AdamW(raw_module.parameters(), lr=LR),
                                          config={**strategy.config, "managed_gradient_accumulation": True})
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        raw_loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
        epoch = [0]

        def raw_epoch() -> int:
            sampler.set_epoch(epoch[0])
            epoch[0] += 1
            for x, y in raw_loader:
                engine.backward(loss_fn(engine(x), y))
                engine.step()
            return len(raw_loader)
        return raw_epoch

    # raw_again: the raw loop built twice; its ratio to the first, 1 on a quiet machine, shows the noise.
    loops = {"raw": raw_loop(), "treadle": treadle_epoch, "raw_again": raw_loop()}
    times: dict[str, list[float]] = {k: [] for k in loops}
    for rep in range(args.warmup + args.reps):
        for name in (list(loops) if rep % 2 == 0 else list(loops)[::-1]):
            dist.barrier()
            start = time.perf_counter()
            steps = loops[name]()
            dist.barrier()
            if rep >= args.warmup:
                times[name].append((time.perf_counter() - start) / steps)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    if strategy.rank == 0:
        slow = {k: [max(ts) for ts in zip(*(g[k] for g in gathered))] for k in times}
        raw, ours = statistics.median(slow["raw"]), statistics.median(slow["treadle"])

        def quartiles(name: str) -> tuple[float, float, float]:
            q = statistics.quantiles(sorted(t / r for t, r in zip(slow[name], slow["raw"])), n=4)
            return q[0], q[1], q[2]
        q1, med, q3 = quartiles("treadle")
        c1, cmed, c3 = quartiles("raw_again")
        params = sum(p.numel() for p in module.parameters())
        print(f"ZeRO stage {args.stage}, 2 processes (gloo, 1 thread each), {params / 1e6:.2f} M parameters, "
              f"batch {args.batch}/process, {args.steps} steps/epoch, {args.reps} rounds")
        print(f"  raw DeepSpeed loop  {raw * 1e3:8.3f} ms/step")
        print(f"  treadle             {ours * 1e3:8.3f} ms/step  ({(ours - raw) * 1e6:+.1f} us/step)")
        print(f"  treadle/raw per round: median {med:.3f} (IQR {q1:.3f}-{q3:.3f}); "
              f"control raw_again/raw {cmed:.3f} (IQR {c1:.3f}-{c3:.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        procs.append(subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--child"], env=env))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        sys.exit(f"a process failed: exit codes {codes}")


if __name__ == "__main__":
    main()
