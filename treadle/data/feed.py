"""DataFeed: the one path through which the loops read batches.

It wraps a DataLoader (or any iterable), starts each epoch, and knows where it is:
the epoch, the number of batches taken in it, and the shuffle seed. Each epoch's
shuffle order and the DataLoader's worker seeds are a pure function of
``(seed, epoch)``, drawn from a private ``torch.Generator`` instead of torch's global
RNG, so the global stream (dropout, augmentation in the main process) is not
disturbed by starting an epoch, and a resumed run can rebuild any epoch's order.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from treadle.seeding import derive_seed


class DataFeed:
    """Iterate a loader epoch by epoch and report the position.

    Usage (what the loops do)::

        feed.start_epoch(epoch)
        for batch in feed:     # raises StopIteration at the end of the epoch
            ...
        feed.position()        # {"epoch": ..., "batch_idx": ..., "seed": ...}
    """

    def __init__(self, loader: Iterable[Any], *, seed: int | None = None, rank: int = 0) -> None:
        self.loader = loader
        # Without a seed the order is still recorded (and so reproducible on resume).
        # Several processes must agree on it: the trainer passes rank 0's seed.
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.rank = rank  # salts the workers' seeds only: the shuffle order is shared
        self.epoch = 0
        self.batch_idx = 0
        self._it: Iterator[Any] | None = None

    @property
    def length(self) -> int | None:
        """Batches per epoch, or None when the loader has no length."""
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            return None

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """Begin epoch ``epoch``: seed its order and create a fresh iterator.

        ``skip`` batches are passed over first (resuming inside an epoch). For a
        DataLoader with a sampler they are skipped in the batch sampler: their indices
        are drawn (the order must stay the same) but nothing is loaded from the
        dataset. Other iterables have no way around producing them.
        """
        self.epoch = epoch
        self.batch_idx = skip
        gen = self._seed_epoch(epoch)
        loader = self.loader
        if skip and isinstance(loader, DataLoader) and loader.batch_sampler is not None:
            self._it = iter(_clone_with_batch_sampler(loader, _SkipBatches(loader.batch_sampler, skip), gen))
        else:
            self._it = iter(loader)
            if skip:
                next(itertools.islice(self._it, skip - 1, None), None)  # consume without keeping

    def _seed_epoch(self, epoch: int) -> torch.Generator | None:
        loader = self.loader
        if not isinstance(loader, DataLoader):
            return None
        sampler = loader.sampler
        if loader.batch_sampler is not None and not isinstance(sampler, RandomSampler):
            sampler = getattr(loader.batch_sampler, "sampler", sampler)  # a user batch_sampler
        if isinstance(sampler, DistributedSampler):  # its order: permutation(seed + epoch)
            sampler.seed = derive_seed(self.seed, 0) >> 2  # the same on every rank; < 2**62
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(epoch)
        gen = torch.Generator()
        gen.manual_seed(derive_seed(self.seed, epoch, self.rank) if self.rank else derive_seed(self.seed, epoch))
        if isinstance(sampler, RandomSampler):
            sampler.generator = gen
        # The DataLoader draws the workers' base seed from its generator at iter().
        loader.generator = gen
        return gen

    def __iter__(self) -> "DataFeed":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self.start_epoch(self.epoch)
        batch = next(self._it)  # type: ignore[arg-type]
        self.batch_idx += 1
        return batch

    def position(self) -> dict[str, int]:
        """Where the feed is: epoch, batches taken in it, shuffle seed."""
        return {"epoch": self.epoch, "batch_idx": self.batch_idx, "seed": self.seed}

    state_dict = position

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the seed and epoch; the trainer reopens the epoch at ``batch_idx``."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batch_idx = 0
        self._it = None


class _SkipBatches:
    """A batch sampler that drops the first ``skip`` batches of each iteration."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip, 0)


def _clone_with_batch_sampler(loader: DataLoader, batch_sampler: Any, gen: torch.Generator | None) -> DataLoader:
    """The same loader (dataset, workers, collate, pinning) over another batch sampler."""
    workers = loader.num_workers
    return DataLoader(
        loader.dataset, batch_sampler=batch_sampler, num_workers=workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=gen,
        prefetch_factor=loader.prefetch_factor if workers > 0 else None, persistent_workers=False,
        pin_memory_device=loader.pin_memory_device,
    )
