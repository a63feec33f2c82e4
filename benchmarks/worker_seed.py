"""Cost of per-sample seeds (treadle/data/worker_seed.py) per sample loaded.

    python benchmarks/worker_seed.py [--samples 20000] [--batch 1 32 256] [--reps 7] [--workers 0]

Two datasets whose items cost almost nothing, so what is measured is the loading path
itself: ``Draws`` (a 4-element ``torch.rand``: it draws, so every sample stays seeded) and
``Quiet`` (a stored tensor: it draws nothing, so seeding stops after the watched samples).
For each batch size and dataset, one DataFeed with ``seed_per_sample`` on and one with it
off, each past a first epoch (the watch), then whole epochs of each, alternating,
``--reps`` of each; prints the median microseconds per sample of each and their
difference. Then the pieces, timed apart: seeding torch, numpy and ``random`` for one
sample (what each sample of a drawing dataset pays), saving and restoring their states
(what each of its batches pays) and reading them to compare (twice per watched sample).
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


class Draws(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(4)


class Quiet(Draws):
    item = torch.zeros(4)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.item


def epoch_seconds(feed: DataFeed, epoch: int) -> float:
    start = time.perf_counter()
    feed.start_epoch(epoch)
    for _ in feed:
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.samples} samples, {args.workers} workers, median of {args.reps} epochs each after a first one, "
          "alternating")
    print(f"{'dataset':>8} {'batch':>6} {'off us/sample':>14} {'on us/sample':>13} {'cost us/sample':>15}")
    for kind in (Draws, Quiet):
        for batch in args.batch:
            loader = DataLoader(kind(args.samples), batch_size=batch, shuffle=True, num_workers=args.workers)
            feeds = {on: DataFeed(loader, seed=0, seed_per_sample=on) for on in (False, True)}
            for feed in feeds.values():
                epoch_seconds(feed, 0)  # warm up; the watch
            times: dict[bool, list[float]] = {False: [], True: []}
            for rep in range(args.reps):
                for on in ((False, True) if rep % 2 else (True, False)):
                    times[on].append(epoch_seconds(feeds[on], rep + 1) / args.samples * 1e6)
            for feed in feeds.values():
                feed.close()
            off, on = statistics.median(times[False]), statistics.median(times[True])
            print(f"{kind.__name__:>8} {batch:>6} {off:>14.2f} {on:>13.2f} {on - off:>15.2f}")

    key = (worker_seed.epoch_seed(0, 1), 12345, 0)
    n = 20000
    seed = timeit.timeit(lambda: worker_seed._seed(key), number=n) / n * 1e6
    state = worker_seed._save()
    save = timeit.timeit(worker_seed._save, number=n) / n * 1e6
    restore = timeit.timeit(lambda: worker_seed._restore(state), number=n) / n * 1e6
    marks = timeit.timeit(worker_seed._marks, number=n // 10) / (n // 10) * 1e6
    print(f"pieces: seeding the 3 RNGs {seed:.2f} us per sample; saving their states {save:.2f} us and "
          f"restoring them {restore:.2f} us per batch; reading them to compare {marks:.2f} us, twice per "
          f"watched sample ({worker_seed.WATCHED} per process)")


if __name__ == "__main__":
    main()
