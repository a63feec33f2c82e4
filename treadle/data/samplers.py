"""MMEngine's sample orders, for loaders of MMEngine-style configs (``sampler: {type:
DefaultSampler}``): a run sees the batches MMEngine's Runner gives it, on every rank.

:class:`DefaultSampler` (epoch-based loops): epoch ``e`` is ``randperm(n)`` drawn from a
generator seeded ``seed + e`` (``range(n)`` without ``shuffle``); with ``round_up`` the list
is repeated up to a multiple of the number of shards, then shard ``r`` of ``w`` takes
positions ``r, r + w, ...``. Without ``round_up`` the last shards are one shorter.
:class:`InfiniteSampler` (iteration-based loops): one generator seeded ``seed`` draws
permutation after permutation, endlessly, and shard ``r`` takes every ``w``-th index of
that stream from position ``r``.

Both are MMEngine 0.10's orders (``mmengine.dataset.sampler``; tests compare them with it),
with two differences of ownership, not of order:

* the shard is the strategy's to set (:meth:`DefaultSampler.shard`: the data-parallel rank
  and size of its layout, which under tensor parallelism are not the process's rank and
  world size), not read from ``torch.distributed`` when the sampler is built;
* ``seed=None`` means the run's seed, given by the :class:`~treadle.data.feed.DataFeed` that
  iterates the loader (MMEngine's Runner gives its samplers the run's seed the same way;
  a sampler built without a Runner draws one). A seed written in the config stays.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterator, Sized

import torch
from torch.utils.data import Sampler


def _size(dataset: Sized) -> int:
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(f"a {type(dataset).__name__} has no length: an MMEngine sampler needs a map-style dataset "
                        "(an IterableDataset orders itself)") from None


def _check(shuffle: Any, seed: Any) -> None:
    if not isinstance(shuffle, bool):
        raise TypeError(f"shuffle={shuffle!r}; expected true or false")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed={seed!r}; expected an int >= 0, or null for the run's seed")


class DefaultSampler(Sampler[int]):
    """MMEngine's ``DefaultSampler`` order (see the module's docstring).

    Args:
        dataset: a map-style dataset (its length is read).
        shuffle: a new permutation every epoch (``set_epoch``); False: the dataset's order.
        seed: the permutations' seed; None: the run's (set by the feed that iterates it).
        round_up: pad the order so that every shard has as many indices.
        rank, world_size: this shard; the strategy sets them (:meth:`shard`).
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int | None = None, round_up: bool = True, *,
                 rank: int = 0, world_size: int = 1) -> None:
        _check(shuffle, seed)
        if not isinstance(round_up, bool):
            raise TypeError(f"round_up={round_up!r}; expected true or false")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world_size {world_size}; expected 0 <= rank < world_size")
        self.dataset = dataset
        self.size = _size(dataset)
        self.shuffle, self.round_up = shuffle, round_up
        self.seed = seed
        self.seed_given = seed is not None  # a config's seed; else the feed gives the run's
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        if round_up:
            self.num_samples = math.ceil(self.size / world_size)
            self.total_size = self.num_samples * world_size
        else:
            self.num_samples = math.ceil((self.size - rank) / world_size)
            self.total_size = self.size

    def shard(self, rank: int, world_size: int, *, round_up: bool | None = None) -> "DefaultSampler":
        """This order's shard ``rank`` of ``world_size`` (``round_up``: None keeps this one's;
        evaluation passes False, so that no sample is seen twice)."""
        out = DefaultSampler(self.dataset, self.shuffle, self.seed, self.round_up if round_up is None else round_up,
                             rank=rank, world_size=world_size)
        out.seed_given, out.epoch = self.seed_given, self.epoch
        return out

    def set_epoch(self, epoch: int) -> None:
        """The permutation of epoch ``epoch`` (from 0), as MMEngine's DistSamplerSeedHook sets it."""
        self.epoch = epoch

    def _seed(self) -> int:
        if self.seed is None:
            raise RuntimeError("DefaultSampler(seed=None) takes the run's seed from the loop that iterates it "
                               "(treadle's Trainer, or strategy.prepare_dataloader); give seed= to iterate it alone")
        return self.seed

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self._seed() + self.epoch)
            indices = torch.randperm(self.size, generator=g).tolist()
        else:
            indices = list(range(self.size))
        if self.round_up and indices:
            indices = (indices * (self.total_size // len(indices) + 1))[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.world_size])

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DefaultSampler(shuffle={self.shuffle}, seed={self.seed}, round_up={self.round_up}, "
                f"rank={self.rank}, world_size={self.world_size})")


class InfiniteSampler(Sampler[int]):
    """MMEngine's ``InfiniteSampler`` order (see the module's docstring): an endless stream,
    so an iteration-based loop never meets the end of an epoch. Its length is the dataset's,
    as MMEngine's (a loader's ``len`` then counts the batches of one pass over the data)."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int | None = None, *,
                 rank: int = 0, world_size: int = 1) -> None:
        _check(shuffle, seed)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world_size {world_size}; expected 0 <= rank < world_size")
        self.dataset = dataset
        self.size = _size(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.seed_given = seed is not None
        self.rank, self.world_size = rank, world_size

    def shard(self, rank: int, world_size: int, *, round_up: bool | None = None) -> "InfiniteSampler":
        """This stream's shard ``rank`` of ``world_size`` (``round_up`` has no meaning here)."""
        out = InfiniteSampler(self.dataset, self.shuffle, self.seed, rank=rank, world_size=world_size)
        out.seed_given = self.seed_given
        return out

    def set_epoch(self, epoch: int) -> None:
        """Nothing: the stream has no epochs (MMEngine's ignores it too)."""

    def _stream(self) -> Iterator[int]:
        if not self.shuffle:
            while True:
                yield from range(self.size)
        if self.seed is None:
            raise RuntimeError("InfiniteSampler(seed=None) takes the run's seed from the loop that iterates it "
                               "(treadle's Trainer, or strategy.prepare_dataloader); give seed= to iterate it alone")
        g = torch.Generator()
        g.manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.size, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._stream(), self.rank, None, self.world_size)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"InfiniteSampler(shuffle={self.shuffle}, seed={self.seed}, rank={self.rank}, world_size={self.world_size})"


#: The samplers a loader spec's ``sampler: {type: ...}`` may name (MMEngine's names).
SAMPLERS: dict[str, type] = {"DefaultSampler": DefaultSampler, "InfiniteSampler": InfiniteSampler}


def takes_run_seed(sampler: Any) -> bool:
    """A sampler of this module whose seed the run gives (no seed in its config)."""
    return isinstance(sampler, (DefaultSampler, InfiniteSampler)) and not sampler.seed_given


__all__ = ["DefaultSampler", "InfiniteSampler", "SAMPLERS", "takes_run_seed"]
