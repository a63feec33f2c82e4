"""DataFeed: the one path through which the loops read batches.

It wraps a DataLoader (or any iterable), starts each epoch, and knows where it is:
the epoch, the number of batches taken in it, and the shuffle seed. Each epoch's
shuffle order and the DataLoader's worker seeds are a pure function of
``(seed, epoch)``, drawn from a private ``torch.Generator`` instead of torch's global
RNG, so the global stream (dropout, augmentation in the main process) is not
disturbed by starting an epoch, and a resumed run can rebuild any epoch's order.

The sampler and the workers get two generators with the same seed: the workers' base
seed is drawn by each fresh DataLoader iterator, but a ``persistent_workers`` loader
reuses its iterator and draws none, so a shared generator would give the epoch another
order depending on whether the iterator was reused (an uninterrupted run) or new (a
resumed one). The sampler's generator starts one draw in, where it was when it shared
the generator with a fresh iterator: the order of a RandomSampler is unchanged.

Samplers seeded this way: ``RandomSampler``, ``SubsetRandomSampler``,
``WeightedRandomSampler`` (a generator given to them is replaced), and any sampler
with a ``generator`` attribute that is None. ``DistributedSampler`` gets its seed and
``set_epoch``; other samplers with ``set_epoch`` are trusted to order themselves by
epoch. Any other sampler that draws from torch's global RNG cannot be rebuilt inside
an epoch: resuming in one warns.

A loader's worker processes end with the process that iterates it, even one killed with
SIGKILL (treadle/data/workers.py).

The randomness a map-style dataset draws in ``__getitem__`` is seeded per sample, from
``(seed, epoch, index)`` (treadle/data/worker_seed.py): the feed iterates a copy of the
DataLoader that seeds torch, numpy and ``random`` before each sample, so augmentation is
the same for any ``num_workers`` and after a resume inside an epoch. Each process stops
seeding once the first samples it loads drew nothing (seeded or not, they are the same);
``seed_per_sample="always"`` seeds every sample, ``seed_per_sample=False`` none (the
workers' streams then run per worker, as torch's do).

A stream (a DataLoader over an ``IterableDataset``, or an iterable that is no DataLoader)
has no sampler to skip in: resuming inside an epoch would load the batches already taken
again and throw them away. When the stream keeps its own position, the feed uses it
instead (:func:`stream_owner`): a loader with ``state_dict()`` / ``load_state_dict()``
(torchdata's ``StatefulDataLoader``, which asks a Stateful dataset in each worker), or,
read in the main process (``num_workers=0``), a dataset with them (Hugging Face
``datasets.IterableDataset``, any Stateful dataset). :meth:`DataFeed.stream_state` is that
position (checkpointed per rank, treadle/strategies/states.py), and
``start_epoch(..., stream=state)`` goes on from it without reading anything again.
Hugging Face's ``IterableDataset`` with a shuffle buffer is read again instead: its state
leaves the buffer out, so resuming from it would lose those examples. An
``IterableDataset`` with ``set_epoch(epoch)`` is told each epoch, as a sampler is
(Hugging Face's reshuffles its shards and buffer with it, and resumes only the epoch
its state was saved in).
"""

from __future__ import annotations

import itertools
import secrets
import weakref
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import (DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from treadle.logging.writers import get_logger
from treadle.data.samplers import takes_run_seed
from treadle.data.worker_seed import SeededCopy, check_seed_per_sample, may_draw, seedable
from treadle.data.workers import dies_with_parent
from treadle.seeding import derive_seed

# torch's samplers that draw their order from ``self.generator`` (a user's one is replaced).
_SEEDED = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)
# The generator a DataFeed gave each sampler: still ours when another feed meets the sampler.
# Keyed by the sampler, as torch.Generator takes no weak reference before torch 2.13.
_OURS: "weakref.WeakKeyDictionary[Any, torch.Generator]" = weakref.WeakKeyDictionary()
_OURS_BY_ID: dict[int, tuple[Any, torch.Generator]] = {}


class DataFeed:
    """Iterate a loader epoch by epoch and report the position.

    Usage (what the loops do)::

        feed.start_epoch(epoch)
        for batch in feed:     # raises StopIteration at the end of the epoch
            ...
        feed.position()        # {"epoch": ..., "batch_idx": ..., "seed": ...}

    ``seed``: the order's seed (one for all ranks); ``rank`` salts the workers' seeds;
    ``seed_per_sample``: read a DataLoader over a map-style dataset through a copy that
    seeds each sample's randomness from ``(seed, epoch, index)`` (treadle/data/worker_seed.py):
    True, while the dataset is seen to draw (each process stops once the first samples it
    loads drew nothing); ``"always"``: every sample; False: none. The attribute of that
    name says what this feed does (False for a loader it cannot seed). ``limit``: an epoch ends
    after this many batches (``limit_train_batches`` and friends); the order of the ones
    taken is the same as without it.
    """

    def __init__(self, loader: Iterable[Any], *, seed: int | None = None, rank: int = 0,
                 seed_per_sample: bool | str = True, limit: int | None = None) -> None:
        check_seed_per_sample(seed_per_sample)
        self.loader = loader
        self.limit = limit  # at most this many batches per epoch (None: all of them)
        # Without a seed the order is still recorded (and so reproducible on resume).
        # Several processes must agree on it: the trainer passes rank 0's seed.
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        self.rank = rank  # salts the workers' seeds only: the shuffle order is shared
        self.epoch = 0
        self.batch_idx = 0
        self._it: Iterator[Any] | None = None
        self._started = False  # the first start_epoch of a resumed run starts past (0, 0)
        # A DataLoader over a map-style dataset is read through a seeded copy (made at the first epoch).
        self.seed_per_sample = seed_per_sample if seedable(loader) else False
        self._seeded: SeededCopy | None = None
        self._stream = stream_owner(loader)  # what keeps a stream's position, or None
        dies_with_parent(loader)  # its workers end with this process, even one killed with SIGKILL

    @property
    def length(self) -> int | None:
        """Batches per epoch (at most ``limit``), or None when the loader has no length
        and there is no limit."""
        try:
            n = len(self.loader)  # type: ignore[arg-type]  # no length: TypeError, caught below
        except TypeError:
            return self.limit
        return n if self.limit is None else min(n, self.limit)

    def start_epoch(self, epoch: int, skip: int = 0, stream: Any = None) -> None:
        """Begin epoch ``epoch``: seed its order and create a fresh iterator.

        ``skip`` batches are passed over first (resuming inside an epoch). For a
        DataLoader with a sampler they are skipped in the batch sampler: their indices
        are drawn (the order must stay the same) but nothing is loaded from the
        dataset. A DataLoader over an ``IterableDataset`` has no sampler, and other
        iterables no way around producing them: their first ``skip`` batches are
        loaded (workers, collate and all) and thrown away, so the skip costs the
        time of loading them, unless ``stream`` is given: the position
        :meth:`stream_state` saved after those batches, which the stream's own
        ``load_state_dict`` takes instead (nothing is read again).
        """
        if not self._started:
            self._started = True
            if epoch or skip:
                # A stream resumed from its own state reads nothing again: the global RNGs the
                # checkpoint restored are where the uninterrupted run's were at that batch.
                self._warn_resumed(0 if stream is not None and self._stream is not None else skip)
        self.epoch = epoch
        self.batch_idx = skip
        gen = self._seed_epoch(epoch)
        loader = self.loader
        # Seen to draw nothing in this process: the user's loader gives the same batches.
        quiet = self._seeded is not None and self._seeded.quiet and (not skip or loader.batch_sampler is not None)
        if self.seed_per_sample and not quiet:
            if self._seeded is None:
                self._seeded = SeededCopy(loader, always=self.seed_per_sample == "always")  # type: ignore[arg-type]  # seedable() found a DataLoader
            self._it = self._seeded.epoch(self.seed, epoch, skip, gen)
        elif skip and isinstance(loader, DataLoader) and loader.batch_sampler is not None \
                and not isinstance(loader.dataset, IterableDataset):
            self._it = iter(_clone_with_batch_sampler(loader, _SkipBatches(loader.batch_sampler, skip), gen))
        elif stream is not None and self._stream is not None:  # the stream goes on from its own position
            self._stream.load_state_dict(stream)
            self._it = iter(loader)
        else:
            self._it = iter(loader)
            if skip:
                next(itertools.islice(self._it, skip - 1, None), None)  # consume without keeping

    def _seed_epoch(self, epoch: int) -> torch.Generator | None:
        loader = self.loader
        if not isinstance(loader, DataLoader):
            return None
        dataset = loader.dataset
        if isinstance(dataset, IterableDataset) and callable(getattr(dataset, "set_epoch", None)):
            dataset.set_epoch(epoch)  # a stream ordered by epoch (Hugging Face's), as a sampler's set_epoch
        sampler = _order_source(loader)
        if isinstance(sampler, DistributedSampler):  # its order: permutation(seed + epoch)
            sampler.seed = derive_seed(self.seed, 0) >> 2  # the same on every rank; < 2**62
        elif takes_run_seed(sampler):  # MMEngine's orders: the run's seed itself, as its Runner gives it
            sampler.seed = self.seed
        if hasattr(sampler, "set_epoch"):  # DistributedSampler and friends
            sampler.set_epoch(epoch)
        seed = derive_seed(self.seed, epoch, self.rank) if self.rank else derive_seed(self.seed, epoch)
        gen = torch.Generator()
        gen.manual_seed(seed)
        if _takes_generator(sampler):
            own = torch.Generator()
            own.manual_seed(seed)
            torch.empty((), dtype=torch.int64).random_(generator=own)  # past the workers' base seed
            sampler.generator = own
            _remember(sampler, own)
        # A fresh DataLoader iterator draws the workers' base seed from its generator.
        loader.generator = gen
        return gen

    def _warn_resumed(self, skip: int) -> None:
        """Resuming (the first epoch is not epoch 0 from its start): say what is not exact."""
        loader = self.loader
        if not isinstance(loader, DataLoader):
            return
        if loader.persistent_workers and loader.num_workers > 0 and not self.seed_per_sample and may_draw(loader.dataset):
            get_logger().warning(
                "resuming a training DataLoader with persistent_workers=True: the data order is restored, but "
                "the workers' RNG is not: an uninterrupted run's workers keep the seeds of the first epoch they "
                "started in, a resumed run's start from the resumed epoch's; random augmentation inside the "
                "dataset will differ from an uninterrupted run (persistent_workers=False makes it exact at epoch "
                "boundaries; for a map-style dataset, seed_per_sample=True, the default, makes it exact anywhere)")
        sampler = _order_source(loader)
        inside = skip and (self.length is None or skip < self.length)  # else: the epoch's end
        if inside and _unseeded(sampler):
            get_logger().warning(
                f"resuming inside an epoch with a {type(sampler).__name__}, which treadle cannot seed (it has no "
                "generator attribute that is None, nor set_epoch): if it draws its order from torch's global "
                "RNG, the rest of this epoch is drawn from another state than in an uninterrupted run, so the "
                "batches differ; give it a `generator` attribute (None) that treadle seeds per epoch, or a "
                "set_epoch(epoch) that makes its order a function of the epoch")
        if inside and isinstance(loader.dataset, IterableDataset) and loader.num_workers == 0:
            # The stream runs in this process: it draws from the global RNGs, which the resume set to where
            # the interrupted run stopped, not to where this epoch's stream started; the skipped batches are
            # drawn again from that state. (With workers, each draws from its own stream, seeded per epoch.)
            get_logger().warning(
                f"resuming inside an epoch of a {type(loader.dataset).__name__} (an IterableDataset) with "
                "num_workers=0: if the stream draws from the global RNG (random, numpy, torch), the rest of "
                "this epoch is drawn from another state than in an uninterrupted run, so the batches differ; "
                "num_workers >= 1 makes it exact (each worker's RNG is seeded per epoch)")

    def __iter__(self) -> "DataFeed":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self.start_epoch(self.epoch)
        if self.limit is not None and self.batch_idx >= self.limit:  # the epoch ends early (limit_*_batches)
            raise StopIteration
        batch = next(self._it)  # type: ignore[arg-type]  # start_epoch() above set it
        self.batch_idx += 1
        return batch

    def close(self) -> None:
        """Stop the loader's worker processes now (the Trainer calls it when fit, validate
        or test ends). Left to the garbage collector, which frees a trainer's reference
        cycles late and in no set order, persistent workers take about 5 s each to stop."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)  # torch's multi-process iterator
        if callable(shutdown):
            shutdown()
        for loader in (self.loader, self._seeded.loader if self._seeded else None):
            if isinstance(loader, DataLoader) and getattr(loader, "_iterator", None) is it:
                loader._iterator = None  # persistent workers: the loader keeps its iterator

    def stream_state(self) -> Any:
        """The stream's own position (:func:`stream_owner`'s ``state_dict()``: after the
        batches taken so far), or None for a loader that has none (a sampler's loader needs
        none: its place is ``batch_idx``) and before an epoch started or after :meth:`close`
        (a closed loader may have forgotten it: the resume then reads the batches again)."""
        if self._stream is None or self._it is None:
            return None
        return self._stream.state_dict()

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


def detached_copy(loader: Any) -> Any:
    """A DataLoader reading what ``loader`` reads (dataset, sampler and batch sampler, workers,
    collate) through iterators of its own, without persistent workers: iterating it never
    resets the iterator ``loader`` keeps for persistent workers. Anything else is returned
    as it is."""
    if isinstance(loader, DataLoader) and loader.batch_sampler is not None \
            and not isinstance(loader.dataset, IterableDataset):
        return _clone_with_batch_sampler(loader, loader.batch_sampler, loader.generator)
    return loader


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def stream_owner(loader: Any) -> Any:
    """What keeps the position of a stream that a resume would otherwise read again: the
    loader, when it has ``state_dict()`` / ``load_state_dict()`` (torchdata's
    ``StatefulDataLoader``; any iterable with them) and iterates an ``IterableDataset`` or is
    no DataLoader; else, for a DataLoader reading its ``IterableDataset`` in the main process
    (``num_workers=0``, so the dataset object is the one iterated), the dataset when it has
    them (Hugging Face's ``IterableDataset``). None otherwise: a DataLoader over a map-style
    dataset skips in its sampler without reading, and a plain DataLoader's workers iterate
    copies of the dataset whose positions the main process never sees."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(loader, DataLoader) and not isinstance(dataset, IterableDataset):
        return None
    if _drops_buffer(dataset):
        return None
    if _stateful(loader):
        return loader
    if isinstance(loader, DataLoader) and loader.num_workers == 0 and _stateful(dataset):
        return dataset
    return None


def _drops_buffer(dataset: Any) -> bool:
    """A Hugging Face ``IterableDataset`` with a shuffle buffer: its ``state_dict()`` leaves
    the buffer's examples out (they are lost on resume, as its documentation says), so the
    feed reads the batches again instead, which is exact. Found by the buffer's class in the
    dataset's chain of example iterables (datasets has no public attribute saying it)."""
    if type(dataset).__module__.split(".")[0] != "datasets":
        return False
    todo, seen = [getattr(dataset, "_ex_iterable", None)], 0
    while todo and seen < 256:  # wrappers, each over one (ex_iterable) or several (ex_iterables)
        node, seen = todo.pop(), seen + 1
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        todo += [n for n in [getattr(node, "ex_iterable", None), *(getattr(node, "ex_iterables", None) or [])]
                 if n is not None]
    return False


def _order_source(loader: DataLoader) -> Any:
    """What draws the loader's order: its sampler, a user batch sampler's sampler, a
    user batch sampler that has none, or None (an IterableDataset orders itself)."""
    if isinstance(loader.dataset, IterableDataset):
        return None
    batch_sampler = loader.batch_sampler
    if batch_sampler is None or isinstance(loader.sampler, RandomSampler):
        return loader.sampler
    return getattr(batch_sampler, "sampler", batch_sampler)  # a user batch_sampler


def _takes_generator(sampler: Any) -> bool:
    """True for a sampler that draws its order from ``sampler.generator`` and is left to us."""
    if isinstance(sampler, _SEEDED):
        return True
    gen = getattr(sampler, "generator", False)
    return gen is None or (isinstance(gen, torch.Generator) and _given(sampler) is gen)


def _remember(sampler: Any, gen: torch.Generator) -> None:
    try:
        _OURS[sampler] = gen
    except TypeError:  # a sampler with __slots__ and no __weakref__: kept by id (and kept alive)
        _OURS_BY_ID[id(sampler)] = (sampler, gen)


def _given(sampler: Any) -> torch.Generator | None:
    """The generator a DataFeed gave ``sampler``, or None."""
    try:
        return _OURS.get(sampler)
    except TypeError:
        return _OURS_BY_ID.get(id(sampler), (None, None))[1]


def _unseeded(sampler: Any) -> bool:
    """A sampler whose order may not be a function of (seed, epoch)."""
    if sampler is None or _takes_generator(sampler) or hasattr(sampler, "set_epoch"):
        return False
    return not isinstance(sampler, (SequentialSampler, DistributedSampler, list, tuple, range))


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
