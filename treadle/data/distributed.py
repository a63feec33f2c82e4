"""Sharding loaders across processes.

Training: the loader's sampler is replaced by torch's ``DistributedSampler`` (shuffle
kept from the original sampler, padded so every rank takes the same number of
batches, as DDP needs); the loader's ``drop_last`` is kept for batching. The
shuffle order is a function of the DataFeed's seed and the epoch (the feed sets
``sampler.seed`` and calls ``set_epoch``), so resume skips into the same order.

A batch sampler that groups its sampler's indices (treadle.data.AspectRatioBatchSampler,
anything with ``sampler`` and ``over(sampler)``) keeps its batching: its sampler is
sharded as above and each rank groups its own shard (``over``), so every rank takes as
many batches (``len`` is exact). Other custom batch samplers are refused.

A sampler that shards itself (a ``shard(rank, world_size, round_up=...)`` method returning
this rank's sampler: MMEngine's orders, treadle.data.samplers) is asked for its shard
instead; for evaluation without padding (``round_up=False``).

Validation/test: :class:`ShardSampler` splits the indices without padding, so every
sample is evaluated exactly once across ranks; the eval loop then sums the
per-rank totals (ranks may take one batch more or less: the eval step runs on the
unwrapped module, with no collective inside).
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.sampler import BatchSampler

from treadle.logging.writers import get_logger


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world_size, ...`` of a dataset of ``length``: no padding,
    no duplicates (the union over ranks is every index once)."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.length, self.rank, self.world_size = length, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))

    def set_epoch(self, epoch: int) -> None:
        """The order is the same every epoch; this says so to DataFeed (no resume warning)."""


def _rebuild(loader: DataLoader, sampler: Sampler[int]) -> DataLoader:
    """The same loader (dataset, batch size, workers, collate, pinning) over ``sampler``."""
    workers = loader.num_workers
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, drop_last=loader.drop_last,
        num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, prefetch_factor=loader.prefetch_factor if workers > 0 else None,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
    )


def regroups(batch_sampler: Any) -> bool:
    """A batch sampler that batches another sampler's indices and can be rebuilt over a
    shard of them (``batch_sampler.over(sampler)``)."""
    return callable(getattr(batch_sampler, "over", None)) and isinstance(getattr(batch_sampler, "sampler", None), Sampler)


def _rebuild_batched(loader: DataLoader, batch_sampler: Any) -> DataLoader:
    """The same loader over another batch sampler."""
    workers = loader.num_workers
    return DataLoader(
        loader.dataset, batch_sampler=batch_sampler, num_workers=workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if workers > 0 else None, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )


def shards_itself(sampler: Any) -> bool:
    """A sampler that makes its own shards (``sampler.shard(rank, world_size, round_up=...)``)."""
    return callable(getattr(sampler, "shard", None))


def _shardable(loader: Any, role: str) -> bool:
    """True for a DataLoader with a default sampler; explains why not otherwise."""
    if not isinstance(loader, DataLoader):
        get_logger().warning(f"the {role} loader is a {type(loader).__name__}, not a DataLoader: every rank reads "
                             "all of it; shard it yourself")
        return False
    if isinstance(loader.dataset, IterableDataset):
        get_logger().warning(f"the {role} loader reads an IterableDataset: every rank reads the whole stream "
                             "unless the dataset shards itself (torch.utils.data.get_worker_info / the rank)")
        return False
    inner = getattr(loader.batch_sampler, "sampler", None)  # a BatchSampler's sampler
    if isinstance(loader.sampler, DistributedSampler) or isinstance(inner, DistributedSampler):
        return False  # already sharded by the user
    if regroups(loader.batch_sampler) or shards_itself(loader.sampler):
        return True
    if loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler \
            or not isinstance(loader.sampler, (RandomSampler, SequentialSampler)):
        raise ValueError(
            f"the {role} DataLoader has a custom sampler or batch_sampler ({type(loader.sampler).__name__}, "
            f"{type(loader.batch_sampler).__name__}), which treadle cannot shard across processes; give it a "
            "DistributedSampler yourself, use treadle.data.AspectRatioBatchSampler for batches grouped by aspect "
            "ratio, or turn automatic sharding off with strategy=dict(type=..., shard_data=False)")
    return True


def shard_train_loader(loader: Any, rank: int, world_size: int) -> Any:
    """``loader`` with a DistributedSampler for this rank (unchanged when it cannot
    or need not be sharded; see the module docstring)."""
    if world_size < 2 or not _shardable(loader, "training"):
        return loader
    if regroups(loader.batch_sampler):
        inner = loader.batch_sampler.sampler
        if shards_itself(inner):
            return _rebuild_batched(loader, loader.batch_sampler.over(inner.shard(rank, world_size)))
        if not isinstance(inner, (RandomSampler, SequentialSampler)):
            raise ValueError(f"the training loader's {type(loader.batch_sampler).__name__} draws from a "
                             f"{type(inner).__name__}, which treadle cannot shard; give it a RandomSampler or a "
                             "SequentialSampler (or shard it yourself with shard_data=False)")
        shuffle = isinstance(inner, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                     drop_last=False)
        return _rebuild_batched(loader, loader.batch_sampler.over(sampler))
    if shards_itself(loader.sampler):
        return _rebuild(loader, loader.sampler.shard(rank, world_size))
    if isinstance(loader.sampler, RandomSampler) and (loader.sampler.replacement or loader.sampler._num_samples is not None):
        raise ValueError("the training loader samples with replacement or a fixed num_samples, which a "
                         "DistributedSampler cannot reproduce; shard it yourself and use shard_data=False")
    shuffle = isinstance(loader.sampler, RandomSampler)
    sampler = DistributedSampler(loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, drop_last=False)
    return _rebuild(loader, sampler)


def shard_eval_loader(loader: Any, rank: int, world_size: int) -> Any:
    """``loader`` over this rank's share of the dataset, without padding."""
    if world_size < 2 or not _shardable(loader, "validation/test"):
        return loader
    if shards_itself(loader.sampler):
        return _rebuild(loader, loader.sampler.shard(rank, world_size, round_up=False))
    inner = getattr(loader.batch_sampler, "sampler", None)
    if regroups(loader.batch_sampler) and shards_itself(inner):
        return _rebuild_batched(loader, loader.batch_sampler.over(inner.shard(rank, world_size, round_up=False)))
    shard = ShardSampler(len(loader.dataset), rank, world_size)
    if regroups(loader.batch_sampler):
        return _rebuild_batched(loader, loader.batch_sampler.over(shard))
    if isinstance(loader.sampler, RandomSampler):
        get_logger().warning("the validation/test loader shuffles; sharded evaluation reads it in order")
    return _rebuild(loader, shard)
