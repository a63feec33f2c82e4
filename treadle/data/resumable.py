"""ResumableLoader: a DataLoader for your own loop whose place is part of the checkpoint.

``Strategy.prepare_dataloader`` returns one. Iterate it as the loader it wraps; each
``for batch in loader`` is one epoch, and epochs count up by themselves::

    loader = strategy.prepare_dataloader(DataLoader(ds, batch_size=32, shuffle=True))
    for epoch in range(start_epoch, max_epochs):
        for batch in loader:       # epoch ``loader.epoch``, batch ``loader.batch_idx``
            ...

Each epoch's order is a function of ``(seed, epoch)`` (treadle/data/feed.py), so after
``load_state_dict`` the next ``iter(loader)`` continues the saved epoch at the batch
after the last one taken, and the epochs after it are those of an uninterrupted run.
An epoch that was taken to its end is over: the next ``iter`` starts the one after.

A stream that keeps its own position (treadle/data/feed.py ``stream_owner``: torchdata's
``StatefulDataLoader``, a Stateful dataset read in the main process) resumes from it
instead of reading the batches already taken again: :meth:`stream_state_dict` is this
rank's (the strategy keeps it in each rank's file), :meth:`load_stream_state_dict` takes it back.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from treadle.data.feed import DataFeed


class ResumableLoader:
    """Epoch-by-epoch iteration over ``loader`` with a checkpointable position.

    Args:
        loader: a DataLoader (or any re-iterable); for several processes, already sharded.
        seed: the order's seed, the same on every rank.
        rank: salts the loader workers' seeds (the order is shared by the ranks).
        seed_per_sample: seed the randomness of each sample of a map-style dataset from
            ``(seed, epoch, index)``, whichever worker loads it (treadle/data/worker_seed.py):
            True, False or ``"always"``.
    """

    def __init__(self, loader: Iterable[Any], *, seed: int, rank: int = 0, seed_per_sample: bool | str = True) -> None:
        self.loader = loader
        self._feed = DataFeed(loader, seed=seed, rank=rank, seed_per_sample=seed_per_sample)
        self._seed_per_sample = seed_per_sample
        self._next_epoch = 0  # what the next iter() starts
        self._resume_at: int | None = None  # batches already taken in epoch _next_epoch (after a load)
        self._open = False  # inside an epoch that has not reached its end
        self._resume_stream: Any = None  # the stream's own position to go on from (after a load)

    # -- iteration ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        epoch, skip = self._next_epoch, self._resume_at or 0
        stream = self._resume_stream if skip else None
        self._resume_at = self._resume_stream = None
        self._feed.start_epoch(epoch, skip=skip, stream=stream)
        self._next_epoch = epoch + 1
        self._open = True
        return self._batches()

    def _batches(self) -> Iterator[Any]:
        feed = self._feed
        for batch in feed:  # noqa: UP028 - `yield from` would close the feed when a caller stops early
            yield batch
        self._open = False

    def __len__(self) -> int:
        """Batches per epoch (a TypeError for a loader without a length, as torch's)."""
        return len(self.loader)  # type: ignore[arg-type]  # no length: TypeError, as the docstring says

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` start epoch ``epoch`` from its first batch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}); expected an int >= 0")
        self._next_epoch, self._resume_at, self._open = epoch, None, False
        self._resume_stream = None

    @property
    def epoch(self) -> int:
        """The epoch being iterated (or the last one, between epochs)."""
        return self._feed.epoch

    @property
    def batch_idx(self) -> int:
        """Batches taken in the current epoch."""
        return self._feed.batch_idx

    @property
    def seed(self) -> int:
        return self._feed.seed

    @property
    def batch_size(self) -> Any:
        return getattr(self.loader, "batch_size", None)

    @property
    def dataset(self) -> Any:
        return getattr(self.loader, "dataset", None)

    def close(self) -> None:
        """Stop the loader's worker processes now (see DataFeed.close)."""
        self._feed.close()

    # -- Stateful ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the next ``iter()`` goes on from: inside an epoch, that epoch and the
        batches taken in it; after one, the next epoch."""
        if self._open:
            return {"epoch": self._feed.epoch, "batch_idx": self._feed.batch_idx, "seed": self.seed}
        return {"epoch": self._next_epoch, "batch_idx": self._resume_at or 0, "seed": self.seed}

    def stream_state_dict(self) -> Any:
        """Inside an epoch, the stream's own position (None for a loader that has none, or
        between epochs): what :meth:`load_stream_state_dict` takes back."""
        return self._feed.stream_state() if self._open else None

    def load_stream_state_dict(self, state: Any) -> None:
        """The next ``iter()`` goes on from the stream's own position ``state`` (saved with
        the place :meth:`load_state_dict` took), reading nothing again."""
        self._resume_stream = state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("epoch", "batch_idx", "seed"):
            value = state.get(key) if isinstance(state, dict) else None
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"loader state {key}={value!r}; expected an int >= 0 (state: {state!r})")
        self._feed.close()
        self._feed = DataFeed(self.loader, seed=state["seed"], rank=self._feed.rank,
                              seed_per_sample=self._seed_per_sample)
        self._next_epoch = state["epoch"]
        self._resume_at = state["batch_idx"] or None
        self._open = False
        self._resume_stream = None

    def __repr__(self) -> str:
        return f"ResumableLoader({self.loader!r}, epoch={self._next_epoch}, seed={self.seed})"


def place_of(pos: dict[str, Any]) -> dict[str, Any]:
    """A training loop's position (``epoch``, ``batch_idx``, ``open``, ``seed``: the
    Trainer's, treadle/engine/loops.py) as a ResumableLoader's place: inside an open epoch,
    that epoch and its batches taken; between epochs, the next epoch from its start."""
    return {"epoch": int(pos["epoch"]), "batch_idx": int(pos["batch_idx"]) if pos.get("open") else 0,
            "seed": int(pos["seed"])}


__all__ = ["ResumableLoader", "place_of"]
