"""Blocking time of sharded checkpoint saves, sync against async (FSDP2, 2 CPU processes, gloo).

Each process holds half of an MLP's parameters and AdamW state (``--mb`` MB in all,
model + optimizer). Every round saves that state once with ``save_sharded(...)``
(sync: returns once the checkpoint is committed) and once with ``async_=True``
(returns once DCP has copied the state to CPU memory and planned the write), then
runs training steps while the async write goes on and calls ``wait()`` (the commit:
manifest, rename). Reported per round, slowest rank: getting the sharded state
dicts, the sync save, the async call, the ``wait()`` after the training steps,
the whole async save (call to committed, when ``wait()`` is called at once), and
the training step time alone and while an async save is in flight.

    python benchmarks/fsdp_async_checkpoint.py [--mb 400] [--rounds 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WIDTH = 2048


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch
    from torch import nn

    from treadle.checkpoint.sharded import save_sharded
    from treadle.distributed import comm
    from treadle.strategies.fsdp import FSDPStrategy

    torch.set_num_threads(1)
    n_layers = max(1, round(args.mb * 2**20 / (3 * 4 * WIDTH * WIDTH)))  # params + 2 AdamW moments, fp32
    strategy = FSDPStrategy(wrap=(nn.Linear,))
    strategy.setup()
    torch.manual_seed(0)
    model = strategy.setup_model(nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(n_layers)]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, WIDTH)

    def train_step() -> float:
        t = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t

    train_step()
    mb = sum(t.numel() * 4 for t in model.parameters()) * 3 / 2**20
    rows = []
    for r in range(args.rounds):
        comm.barrier()
        t0 = time.perf_counter()
        state = {"model": strategy.get_model_state(model), "optim": strategy.get_optim_state(model, opt)}
        t_state = time.perf_counter() - t0
        comm.barrier()
        t0 = time.perf_counter()
        save_sharded(Path(out_dir) / f"sync{r}", state, {"state.pt": {"round": r}})
        t_sync = time.perf_counter() - t0
        comm.barrier()
        base = [train_step() for _ in range(args.steps)]
        comm.barrier()
        t0 = time.perf_counter()
        pending = save_sharded(Path(out_dir) / f"async{r}", state, {"state.pt": {"round": r}}, async_=True)
        t_call = time.perf_counter() - t0
        during = [train_step() for _ in range(args.steps)]
        t0 = time.perf_counter()
        pending.wait()
        t_wait = time.perf_counter() - t0
        comm.barrier()
        t0 = time.perf_counter()
        save_sharded(Path(out_dir) / f"asyncnow{r}", state, {"state.pt": {"round": r}}, async_=True).wait()
        t_async_total = time.perf_counter() - t0
        rows.append([t_state, t_sync, t_call, t_wait, t_async_total, statistics.median(base),
                     statistics.median(during)])
        for d in (f"sync{r}", f"async{r}", f"asyncnow{r}"):
            if rank == 0:
                shutil.rmtree(Path(out_dir) / d)
        comm.barrier()
    gathered = comm.gather_object(rows)
    if rank == 0:
        names = ["state dicts", "sync save", "async call", "wait() after steps", "async save+wait at once",
                 "train step", "train step during async"]
        print(f"{world} processes, {n_layers} x Linear({WIDTH}, {WIDTH}), model + AdamW state {mb:.0f} MB "
              f"({mb / world:.0f} MB per rank), {args.steps} training steps while the async save runs; "
              f"seconds, slowest rank, per round:")
        for i, name in enumerate(names):
            per_round = [max(g[r][i] for g in gathered) for r in range(args.rounds)]
            print(f"  {name:<26}" + "".join(f"{v:9.3f}" for v in per_round)
                  + f"   median {statistics.median(per_round):.3f}")
    comm.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=400, help="model + AdamW state in MB (all ranks)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="training steps while an async save runs")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    args = p.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_dir = tempfile.mkdtemp(prefix="treadle-fsdp-ckpt-", dir=args.dir)
    try:
        mp.spawn(_worker, args=(2, port, args, out_dir), nprocs=2, join=True)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
