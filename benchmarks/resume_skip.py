"""Resume time inside a long epoch: skipping ahead in the sampler against iterating.

    python benchmarks/resume_skip.py [--samples 200000] [--batch 32] [--workers 2]

A dataset whose items cost 20 us each to load; a shuffled DataLoader with workers.
For a resume position near the start and near the end of the epoch it prints the
time until the first batch after the position arrives and how many items were
loaded, for treadle's DataFeed (skips in the batch sampler) and for the naive way
(iterate the loader and throw batches away).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

from treadle.data import DataFeed


class Costly(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        t = time.perf_counter() + 20e-6
        while time.perf_counter() < t:  # stands for decoding an image
            pass
        return torch.tensor([i])


def first_batch_after(loader: DataLoader, skip: int, naive: bool) -> tuple[float, torch.Tensor]:
    feed = DataFeed(loader, seed=0)
    start = time.perf_counter()
    if naive:
        feed.start_epoch(3)
        for _ in range(skip):
            next(feed)
    else:
        feed.start_epoch(3, skip=skip)
    batch = next(feed)
    return time.perf_counter() - start, batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    loader = DataLoader(Costly(a.samples), batch_size=a.batch, shuffle=True, num_workers=a.workers)
    n = len(loader)
    print(f"{a.samples} samples, batch {a.batch}, {n} batches per epoch, {a.workers} workers, 20 us per item")
    for skip in (10, n - 10):
        t_skip, b_skip = first_batch_after(loader, skip, naive=False)
        line = f"resume at batch {skip:6d}: sampler skip {t_skip * 1e3:8.1f} ms"
        if skip < 1000 or a.samples <= 200_000:
            t_naive, b_naive = first_batch_after(loader, skip, naive=True)
            assert torch.equal(b_skip, b_naive), "the skipped and the iterated positions must give the same batch"
            line += f"   iterate-and-discard {t_naive * 1e3:9.1f} ms ({skip * a.batch} items loaded for nothing)"
        print(line)


if __name__ == "__main__":
    main()
