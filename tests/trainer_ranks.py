"""Running tests/strategies/ddp_script.py on 2 ranks (with torchrun's environment, or
under real torchrun agents), and the one-process reference it must match (shared by
tests/strategies/test_ddp.py, test_fsdp_trainer.py, test_elastic.py, test_multinode.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from support import TinyNet, make_data, run_ranks
from treadle.seeding import derive_seed

SCRIPT = str(Path(__file__).parent / "strategies" / "ddp_script.py")


def _run(out: Path, *args: str, expect: int | None = 0) -> list[tuple[int, str]]:
    results = run_ranks(SCRIPT, [str(out), *args])
    if expect is not None:
        for rank, (code, output) in enumerate(results):
            assert code == expect, f"rank {rank} exited {code}:\n{output[-4000:]}"
    return results


def start_torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m torch.distributed.run ARGS`` (a torchrun agent), its output piped; the
    caller waits for it. The agent sets the workers' RANK etc. itself, so this test
    process's own (if any) are not passed on. The workers see no GPU unless ``env`` says
    otherwise (CUDA_VISIBLE_DEVICES=""): they run on gloo, as support.run_ranks's do."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RESTART_COUNT"):
        env.pop(key, None)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _final(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(out / f"final_rank{rank}.pt", weights_only=True)


def _reference(shuffle: bool, accumulate: int, epochs: int = 2, per_rank_batch: int = 4) -> dict[str, torch.Tensor]:
    """One process, hand-written: each step sees both ranks' micro-batches at once."""
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = make_data(48)
    seed = derive_seed(7, 0) >> 2  # the DataFeed's DistributedSampler seed for seed=7
    samplers = [DistributedSampler(data, num_replicas=2, rank=r, shuffle=shuffle, seed=seed) for r in range(2)]
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        loaders = [list(DataLoader(data, batch_size=per_rank_batch, sampler=s)) for s in samplers]
        micro = list(zip(*loaders))
        for i in range(0, len(micro), accumulate):
            group = micro[i:i + accumulate]
            x = torch.cat([b[0] for pair in group for b in pair])
            y = torch.cat([b[1] for pair in group for b in pair])
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.state_dict()
