"""Per-sample seeds: the randomness a map-style dataset draws, whatever process loads it.

A DataLoader's workers each have their own RNG stream, seeded once when they start, so a
sample's random augmentation depends on which worker loads it (``num_workers``), on how
many samples that worker loaded before it (where a resumed epoch started) and on the
rank. Here each sample draws from streams set for it alone instead: right before the
dataset's ``__getitem__`` runs (in a worker or in the main process), torch's default
CPU generator, numpy's global RNG and python's ``random`` are seeded from
``(seed, epoch, index)``, where ``index`` is the global sample index the sampler gave
(equal on every rank and world size) and ``seed`` the loader's data seed.

How: :class:`SeededCopy` makes a copy of the DataLoader (the user's loader is left
as it is) whose index sampler is a :class:`KeyedIndices`, which yields, in the main
process, a key ``(epoch_seed, index, repeat)`` for each index instead of the index, and
whose dataset is a :class:`SeededDataset`, which, where the fetch runs, seeds the three
RNGs from each key and calls ``dataset[index]``. The RNG states are saved before a
batch and restored after it, so the main process's streams (dropout, with
``num_workers=0``) and a worker's (``collate_fn``, ``worker_init_fn``) are what they
would be without this.

A dataset that draws no random numbers gives the same samples seeded or not, and
leaves the streams as they were, so seeding it only costs time (about 7 us per sample
and 60 us per batch, numpy's state the most). Each process (the main one, each worker)
finds out by watching: for the first :data:`WATCHED` samples it seeds (batches, for a
batched ``__getitems__``), it compares the three RNG states right after the seed with
those after the fetch. If none moved, that process stops seeding (and saving and
restoring the states) for as long as it holds the loader's copy: the main process for the
whole run, a worker until the loader restarts its workers (each epoch unless
``persistent_workers``). If one moved, it seeds every sample from then on. A dataset
that draws only for some samples, or only from some epoch on, or reads a seed without
drawing (``torch.initial_seed()``), can go unseen, and its later draws then come from
the process's own streams: ``seed_per_sample="always"`` seeds every sample without
watching.

Exceptions, kept as documented: a sampler that yields an index more than once in an
epoch gets a new stream for each repeat (``repeat`` counts them) only when it is torch's
``RandomSampler`` or ``WeightedRandomSampler`` with replacement; another one's repeats
draw the same numbers. A dataset with its own batched ``__getitems__`` is seeded once
per batch (from the batch's first key), so its draws depend on the batch, not the
sample. numpy is seeded with 32 bits (its 64-bit seeding costs 4x more).
"""

from __future__ import annotations

import hashlib
import operator
import random
from itertools import islice
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import (ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler, StackDataset,
                              Subset, TensorDataset, WeightedRandomSampler)

from treadle.seeding import derive_seed

_SALT = 0x5EED_5A3D_1E55  # sample streams: unrelated to the order's derive_seed(seed, epoch)
_M32 = 0xFFFF_FFFF

Key = tuple  # (epoch_seed: int, index: Any, repeat: int)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed every sample key of ``epoch`` carries."""
    return derive_seed(seed, _SALT, epoch)


def sample_seed(key: Key) -> int:
    """The 64-bit seed of one sample: a function of the epoch seed, the index and the repeat."""
    seed, index, repeat = key
    return derive_seed(seed, _as_int(index), repeat)


def _as_int(index: Any) -> int:
    """An int for a sample index: ints, numpy ints and integer tensors as they are, other
    keys (strings, tuples such as ``(index, size)``) through a digest of their repr."""
    if type(index) is int:
        return index
    try:
        return operator.index(index)
    except TypeError:
        return int.from_bytes(hashlib.blake2b(repr(index).encode(), digest_size=8).digest(), "little")


_torch_gen = torch.default_generator


def _seed(key: Key) -> None:
    s = sample_seed(key)
    _torch_gen.manual_seed(s)
    np.random.seed(s & _M32)
    random.seed(s)


def _save() -> tuple[Any, Any, Any]:
    return _torch_gen.get_state(), np.random.get_state(), random.getstate()


def _restore(state: tuple[Any, Any, Any]) -> None:
    _torch_gen.set_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


def _fetches_batches(dataset: Any) -> bool:
    """True when ``dataset`` has its own batched ``__getitems__`` (torch's Subset and
    StackDataset only pass the call on to the datasets they hold)."""
    if not callable(getattr(dataset, "__getitems__", None)):
        return False
    if type(dataset).__getitems__ is Subset.__getitems__:
        return _fetches_batches(dataset.dataset)
    if type(dataset).__getitems__ is StackDataset.__getitems__:
        inner = dataset.datasets
        return any(_fetches_batches(d) for d in (inner.values() if isinstance(inner, dict) else inner))
    return True


WATCHED = 64  # seeded samples a process watches before it stops seeding a dataset that drew nothing


def _marks() -> tuple[Any, ...]:
    """What any draw from torch's default CPU generator, numpy's global RNG or ``random`` changes."""
    np_state = np.random.get_state()
    return bytes(_torch_gen.get_state().numpy()), np_state[1].tobytes(), np_state[2:], random.getstate()


class _Watch:
    """One process's view of whether its dataset draws: ``left`` seeded samples still to
    watch (None: it drew, or seeding is forced; every sample is seeded); ``off``: none of
    the watched samples drew, so seeding stopped in this process."""

    def __init__(self, always: bool) -> None:
        self.left: int | None = None if always else WATCHED
        self.off = False


class SeededDataset(Dataset):
    """``dataset`` read by keys ``(epoch_seed, index, repeat)``: seeds torch, numpy and
    ``random`` for each sample, then returns ``dataset[index]``.

    Seeding stops, in the process that fetches, once it has watched :data:`WATCHED`
    seeded samples draw nothing (the RNG states right after the seed equal those after
    the fetch): seeded or not, such a dataset gives the same data and leaves the streams
    as they were. One draw in the watched samples keeps seeding on for good;
    ``always=True`` seeds every sample without watching.

    Attributes other than its own are read from and written to ``dataset``, so a
    ``worker_init_fn`` that does ``get_worker_info().dataset.handle = open(...)`` still
    reaches the user's dataset.
    """

    def __init__(self, dataset: Any, always: bool = False) -> None:
        object.__setattr__(self, "_treadle_dataset", dataset)
        object.__setattr__(self, "_treadle_batched", _fetches_batches(dataset))
        object.__setattr__(self, "_treadle_watch", _Watch(always))

    def __getitem__(self, key: Key) -> Any:  # a loader without automatic batching: one sample
        if self._treadle_watch.off:
            return self._treadle_dataset[key[1]]
        state = _save()
        try:
            return self._seeded(self._treadle_dataset.__getitem__, key[1], key)
        finally:
            _restore(state)

    def __getitems__(self, keys: list[Key]) -> list[Any]:
        dataset = self._treadle_dataset
        if self._treadle_watch.off:
            if self._treadle_batched:
                return dataset.__getitems__([k[1] for k in keys])
            return [dataset[k[1]] for k in keys]
        state = _save()
        try:
            if self._treadle_batched:
                if not keys:
                    return dataset.__getitems__([])
                return self._seeded(dataset.__getitems__, [k[1] for k in keys], keys[0])
            fetch, watch = dataset.__getitem__, self._treadle_watch
            return [fetch(k[1]) if watch.off else self._seeded(fetch, k[1], k) for k in keys]
        finally:
            _restore(state)

    def _seeded(self, fetch: Any, arg: Any, key: Key) -> Any:
        """``fetch(arg)`` with the three RNGs seeded from ``key``, watched while undecided."""
        _seed(key)
        watch = self._treadle_watch
        if watch.left is None:
            return fetch(arg)
        before = _marks()
        out = fetch(arg)
        if _marks() != before:
            watch.left = None  # it draws: seeded from now on
        else:
            watch.left -= 1
            watch.off = watch.left == 0
        return out

    def __len__(self) -> int:
        return len(self._treadle_dataset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("__", "_treadle_")):  # unpickling asks before __dict__ is set
            raise AttributeError(name)
        return getattr(self._treadle_dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._treadle_dataset, name, value)

    def __repr__(self) -> str:
        return f"SeededDataset({self._treadle_dataset!r})"


def check_seed_per_sample(value: Any) -> None:
    """``seed_per_sample`` is True (seed while the dataset draws), ``"always"`` or False."""
    if not (isinstance(value, bool) or value == "always"):
        raise TypeError(f"seed_per_sample must be True, False or 'always', got {value!r}")


class KeyedIndices:
    """The index sampler of a seeded copy: yields keys ``(epoch_seed, index, repeat)``
    where ``sampler`` yields indices (``batched``: lists of them), from batch ``skip`` on.

    ``epoch_seed`` and ``skip`` are set before each epoch; the indices of skipped
    batches are still drawn (the order and the repeat counts must stay the same).
    """

    def __init__(self, sampler: Any, batched: bool, repeats_from: int | None) -> None:
        self.sampler = sampler
        self.batched = batched
        self.repeats_from = repeats_from  # dataset size, for samplers that repeat indices; else None
        self.epoch_seed = 0
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        seed, batched = self.epoch_seed, self.batched
        if self.repeats_from is not None:
            yield from islice(self._counted(seed), self.skip, None)
        elif batched:
            for batch in islice(iter(self.sampler), self.skip, None):
                yield [(seed, i, 0) for i in batch]
        else:
            for i in islice(iter(self.sampler), self.skip, None):
                yield (seed, i, 0)

    def _counted(self, seed: int) -> Iterator[Any]:
        counts = np.zeros(self.repeats_from, dtype=np.int64)  # type: ignore[arg-type]  # called only with repeats_from set
        for item in self.sampler:
            keys = []
            for i in (item if self.batched else (item,)):
                n = int(counts[i])
                counts[i] = n + 1
                keys.append((seed, i, n))
            yield keys if self.batched else keys[0]

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


def _repeats_from(sampler: Any) -> int | None:
    """The dataset size for torch's samplers that draw with replacement; None for others."""
    if isinstance(sampler, RandomSampler) and sampler.replacement:
        return len(sampler.data_source)
    if isinstance(sampler, WeightedRandomSampler) and sampler.replacement:
        return len(sampler.weights)
    return None


def seedable(loader: Any) -> bool:
    """True for a DataLoader over a map-style dataset that iterates as torch's does (a
    subclass with its own ``__iter__``, such as a stateful loader, is left alone) and may
    draw random numbers: torch's in-memory ``TensorDataset`` (alone or under ``Subset``,
    ``ConcatDataset``, ``StackDataset``) never does, so it costs nothing."""
    return (isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)
            and type(loader).__iter__ is DataLoader.__iter__
            and type(loader)._get_iterator is DataLoader._get_iterator
            and may_draw(loader.dataset))


def may_draw(dataset: Any) -> bool:
    """False for datasets whose items are known to involve no randomness."""
    kind = type(dataset)
    if kind is TensorDataset:
        return False
    if kind is Subset:
        return may_draw(dataset.dataset)
    if kind is ConcatDataset:
        return any(may_draw(d) for d in dataset.datasets)
    if kind is StackDataset:
        parts = dataset.datasets.values() if isinstance(dataset.datasets, dict) else dataset.datasets
        return any(may_draw(d) for d in parts)
    return True


class SeededCopy:
    """A copy of ``loader`` over a :class:`SeededDataset` and :class:`KeyedIndices`,
    made once and reused each epoch (so persistent workers persist)."""

    def __init__(self, loader: DataLoader, always: bool = False) -> None:
        batched = loader.batch_sampler is not None
        source = loader.batch_sampler if batched else loader.sampler
        order = getattr(source, "sampler", None) if batched else source
        self.keys = KeyedIndices(source, batched, _repeats_from(order))
        workers = loader.num_workers
        extra = {"in_order": loader.in_order} if hasattr(loader, "in_order") else {}
        sampling = dict(batch_sampler=self.keys) if batched else dict(sampler=self.keys, batch_size=None)
        self.loader = DataLoader(
            SeededDataset(loader.dataset, always), **sampling, num_workers=workers,
            collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator, prefetch_factor=loader.prefetch_factor if workers > 0 else None,
            persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device, **extra)

    @property
    def quiet(self) -> bool:
        """True when this process reads the dataset (no workers) and saw it draw nothing: the
        user's loader then gives the same batches, without the keys and the wrapper."""
        return self.loader.num_workers == 0 and self.loader.dataset._treadle_watch.off

    def epoch(self, seed: int, epoch: int, skip: int, generator: torch.Generator | None) -> Iterator[Any]:
        """A fresh iterator over epoch ``epoch`` from batch ``skip`` on."""
        self.keys.epoch_seed = epoch_seed(seed, epoch)
        self.keys.skip = skip
        self.loader.generator = generator  # the workers' base seed, as for the user's loader
        return iter(self.loader)


__all__ = ["WATCHED", "KeyedIndices", "SeededCopy", "SeededDataset", "check_seed_per_sample", "epoch_seed", "may_draw",
           "sample_seed", "seedable"]
