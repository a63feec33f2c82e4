"""Resume time inside an epoch of a stream: its own state against reading again.

    python benchmarks/stream_resume.py [--items 2000] [--batch 10] [--cost-ms 5]

A stream (an IterableDataset) whose items cost 5 ms each (a sleep: a network read). For a
resume at 10 % and at 90 % of its epoch it prints the time from the resume call (a fresh
loader's ``DataFeed.start_epoch(epoch, skip=k, ...)``) to the first batch after the
position, and the items the stream produced in that time, for:

- a Stateful IterableDataset read in the main process (``num_workers=0``): with its
  ``state_dict`` (the feed loads it) and without (the same stream, no state: the feed
  reads the first ``k`` batches again and throws them away);
- torchdata's ``StatefulDataLoader`` with 2 workers over the Stateful dataset, against a
  plain DataLoader with 2 workers over the same dataset (torch's workers hold copies of the
  dataset, so there is no state to take: read again). Skipped when torchdata is absent.

The position saved is taken from an uninterrupted run of the same loader; each resumed
run checks that its first batch is the one the uninterrupted run had there.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from treadle.data import DataFeed


class Stream(IterableDataset):
    """``items`` numbered items, split between workers, each costing ``cost`` seconds."""

    def __init__(self, items: int, cost: float, read: Any) -> None:
        self.items, self.cost, self.read = items, cost, read

    def _mine(self) -> range:
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        return range(start, self.items, step)

    def _produce(self, i: int) -> torch.Tensor:
        time.sleep(self.cost)
        with self.read.get_lock():
            self.read.value += 1
        return torch.tensor([i])

    def __iter__(self):
        for i in self._mine():
            yield self._produce(i)


class StatefulStream(Stream):
    """The same stream with its position: items of its share taken so far."""

    def __init__(self, items: int, cost: float, read: Any) -> None:
        super().__init__(items, cost, read)
        self.taken, self._start = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = int(state["taken"])

    def __iter__(self):
        self.taken, start, self._start = self._start, self._start, 0
        for i in list(self._mine())[start:]:
            item = self._produce(i)
            self.taken += 1
            yield item


def resume_time(make: Callable[[Any], Any], skip: int) -> tuple[float, int, torch.Tensor]:
    """Seconds from the resume call to the first batch after ``skip`` batches, items
    produced meanwhile, and that batch; the position is saved from an uninterrupted run."""
    read = multiprocessing.Value("i", 0)
    feed = DataFeed(make(read), seed=0)
    feed.start_epoch(0)
    for _ in range(skip):
        next(feed)
    state = feed.stream_state()
    expected = next(feed)
    feed.close()
    read = multiprocessing.Value("i", 0)
    feed = DataFeed(make(read), seed=0)
    start = time.perf_counter()
    feed.start_epoch(0, skip=skip, stream=state)
    batch = next(feed)
    took = time.perf_counter() - start
    feed.close()
    assert torch.equal(batch, expected), "the resumed stream gave another batch than the uninterrupted run"
    return took, read.value, batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=2000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--cost-ms", type=float, default=5.0)
    a = p.parse_args()
    cost, n = a.cost_ms / 1000, a.items // a.batch
    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("dataset state, main process", lambda r: DataLoader(StatefulStream(a.items, cost, r), batch_size=a.batch)),
        ("no state, main process", lambda r: DataLoader(Stream(a.items, cost, r), batch_size=a.batch)),
    ]
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        print("torchdata is not installed: the StatefulDataLoader cases are left out")
    else:
        cases += [
            ("StatefulDataLoader, 2 workers",
             lambda r: StatefulDataLoader(StatefulStream(a.items, cost, r), batch_size=a.batch, num_workers=2)),
            ("DataLoader, 2 workers (no state)",
             lambda r: DataLoader(StatefulStream(a.items, cost, r), batch_size=a.batch, num_workers=2)),
        ]
    print(f"{a.items} items, batch {a.batch}, {n} batches per epoch, {a.cost_ms:g} ms per item")
    print(f"{'loader':36} {'at':>5} {'to first batch':>15} {'items read':>11}")
    for name, make in cases:
        for frac in (0.1, 0.9):
            skip = round(n * frac)
            took, read, _ = resume_time(make, skip)
            print(f"{name:36} {frac:>5.0%} {took * 1000:>12.0f} ms {read:>11}")


if __name__ == "__main__":
    main()
