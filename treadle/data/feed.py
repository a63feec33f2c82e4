"""DataFeed: the one path through which the loops read batches.

It wraps a DataLoader (or any iterable), starts each epoch, and knows where it is:
the epoch, the number of batches taken in it, and the shuffle seed. Each epoch's
shuffle order and the DataLoader's worker seeds are a pure function of
``(seed, epoch)``, drawn from a private ``torch.Generator`` instead of torch's global
RNG, so the global stream (dropout, augmentation in the main process) is not
disturbed by starting an epoch, and a resumed run can rebuild any epoch's order.
"""

from __future__ import annotations

import secrets
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, RandomSampler

from treadle.seeding import derive_seed


class DataFeed:
    """Iterate a loader epoch by epoch and report the position.

    Usage (what the loops do)::

        feed.start_epoch(epoch)
        for batch in feed:     # raises StopIteration at the end of the epoch
            ...
        feed.position()        # {"epoch": ..., "batch_idx": ..., "seed": ...}
    """

    def __init__(self, loader: Iterable[Any], *, seed: int | None = None) -> None:
        self.loader = loader
        # Without a seed the order is still recorded (and so reproducible on resume).
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
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

    def start_epoch(self, epoch: int) -> None:
        """Begin epoch ``epoch``: seed its order and create a fresh iterator."""
        self.epoch = epoch
        self.batch_idx = 0
        self._seed_epoch(epoch)
        self._it = iter(self.loader)

    def _seed_epoch(self, epoch: int) -> None:
        loader = self.loader
        if not isinstance(loader, DataLoader):
            return
        sampler = loader.sampler
        if loader.batch_sampler is not None and not isinstance(sampler, RandomSampler):
            sampler = getattr(loader.batch_sampler, "sampler", sampler)  # a user batch_sampler
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(epoch)
        gen = torch.Generator()
        gen.manual_seed(derive_seed(self.seed, epoch))
        if isinstance(sampler, RandomSampler):
            sampler.generator = gen
        # The DataLoader draws the workers' base seed from its generator at iter().
        loader.generator = gen

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
        """Restore the seed and epoch (skipping ahead inside an epoch comes with resume)."""
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.batch_idx = 0
        self._it = None
