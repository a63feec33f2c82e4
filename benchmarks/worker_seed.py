"""Cost of per-sample seeds (treadle/data/worker_seed.py) per sample loaded.

    python benchmarks/worker_seed.py [--samples 20000] [--batch 1 32 256] [--reps 7] [--workers 0]

A dataset whose items cost almost nothing (a small tensor, one draw from torch), so
what is measured is the loading path itself. For each batch size, whole epochs through
a DataFeed with ``seed_per_sample`` on and off, alternating, ``--reps`` of each; prints
the median microseconds per sample of each and their difference. Then the pieces,
timed apart: seeding torch, numpy and ``random`` for one sample (what each sample
pays) and saving and restoring their states (what each batch pays).
``--workers N`` runs the epochs with N worker processes (the seeding then runs in the
workers, in parallel with the main process).
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import torch
from torch.utils.data import DataLoader, Dataset

from treadle.data import DataFeed
from treadle.data import worker_seed


class Cheap(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(4)


def epoch_seconds(loader: DataLoader, on: bool, epoch: int) -> float:
    feed = DataFeed(loader, seed=0, seed_per_sample=on)
    start = time.perf_counter()
    feed.start_epoch(epoch)
    for _ in feed:
        pass
    elapsed = time.perf_counter() - start
    feed.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.samples} samples, {args.workers} workers, median of {args.reps} epochs each, alternating")
    print(f"{'batch':>6} {'off us/sample':>14} {'on us/sample':>13} {'cost us/sample':>15}")
    for batch in args.batch:
        loader = DataLoader(Cheap(args.samples), batch_size=batch, shuffle=True, num_workers=args.workers)
        times: dict[bool, list[float]] = {False: [], True: []}
        epoch_seconds(loader, True, 0)  # warm up
        for rep in range(args.reps):
            for on in ((False, True) if rep % 2 else (True, False)):
                times[on].append(epoch_seconds(loader, on, rep) / args.samples * 1e6)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print(f"{batch:>6} {off:>14.2f} {on:>13.2f} {on - off:>15.2f}")

    key = (worker_seed.epoch_seed(0, 1), 12345, 0)
    n = 20000
    seed = timeit.timeit(lambda: worker_seed._seed(key), number=n) / n * 1e6
    state = worker_seed._save()
    save = timeit.timeit(worker_seed._save, number=n) / n * 1e6
    restore = timeit.timeit(lambda: worker_seed._restore(state), number=n) / n * 1e6
    print(f"pieces: seeding the 3 RNGs {seed:.2f} us per sample; saving their states {save:.2f} us and "
          f"restoring them {restore:.2f} us per batch")


if __name__ == "__main__":
    main()
