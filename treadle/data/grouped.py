"""Batches of images that share an orientation: :class:`AspectRatioBatchSampler`.

Detection models pad the images of a batch to one size; a batch that mixes portrait and
landscape images pads both ways and wastes memory. This batch sampler reads the indices
of its sampler in order and puts each into one of two groups, portrait (``width <
height``) or landscape (``width >= height``); a group that reaches ``batch_size`` is
yielded as a batch. At the end of the epoch the two groups' leftovers are joined
(portrait first) and yielded in batches of ``batch_size`` (the last one short, or
dropped with ``drop_last``). This is mmdet's ``AspectRatioBatchSampler`` rule, and the
grouping detectron2 does by aspect ratio; ``len()`` is exact.

Each item's size comes from ``sizes``: None reads the dataset's ``get_data_info(index)``
(its ``width`` and ``height`` entries, as MMEngine's datasets give them); a callable
``index -> (width, height)``; or a sequence of ``(width, height)`` by index. Sizes are
read once per index and kept.

Resuming and sharding need nothing of its own: the batches are a function of the
sampler's order, which treadle seeds per ``(seed, epoch)`` (treadle/data/feed.py). A
resume inside an epoch draws the order again and passes over the batches already taken
without loading them; several processes shard the sampler (each rank groups its own
shard, so every rank takes the same number of batches) through :meth:`over`, which
treadle/data/distributed.py calls.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from torch.utils.data import Sampler

Sizes = Callable[[int], "tuple[float, float]"] | Sequence["tuple[float, float]"] | None


class AspectRatioBatchSampler(Sampler[list[int]]):
    """Batches of ``batch_size`` indices of ``sampler`` in one orientation group (see the
    module's docstring).

    Args:
        sampler: the order of the indices (a RandomSampler, SequentialSampler,
            DistributedSampler...).
        batch_size: indices per batch.
        drop_last: drop the epoch's last batch when it is short.
        sizes: where each item's ``(width, height)`` comes from: None (the dataset's
            ``get_data_info(index)``), a callable of the index, or a sequence by index.
        dataset: the dataset whose ``get_data_info`` is read (default: the sampler's
            ``dataset`` or ``data_source``).
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool = False, *, sizes: Sizes = None,
                 dataset: Any = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"AspectRatioBatchSampler(batch_size={batch_size!r}); expected an int >= 1")
        if not isinstance(drop_last, bool):
            raise TypeError(f"AspectRatioBatchSampler(drop_last={drop_last!r}); expected True or False")
        if dataset is None:
            dataset = getattr(sampler, "dataset", None) or getattr(sampler, "data_source", None)
        if sizes is None and not callable(getattr(dataset, "get_data_info", None)):
            raise TypeError(f"AspectRatioBatchSampler: the dataset ({type(dataset).__name__}) has no "
                            "get_data_info(index) giving each item's width and height; give sizes= (a function "
                            "index -> (width, height), or a list of them by index)")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self.sizes, self.dataset = sizes, dataset
        self._groups: dict[int, int] = {}  # index -> 0 (portrait) or 1 (landscape), read once

    def group(self, index: int) -> int:
        """0 for a portrait item (``width < height``), 1 for any other."""
        known = self._groups.get(index)
        if known is not None:
            return known
        sizes = self.sizes
        if sizes is None:
            info = self.dataset.get_data_info(index)
            try:
                width, height = info["width"], info["height"]
            except (KeyError, TypeError):
                raise KeyError(f"AspectRatioBatchSampler: get_data_info({index}) gave {info!r}, with no 'width' and "
                               "'height'; expected a mapping with both") from None
        elif callable(sizes):
            width, height = sizes(index)
        else:
            width, height = sizes[index]
        group = 0 if width < height else 1
        self._groups[index] = group
        return group

    def __iter__(self) -> Iterator[list[int]]:
        size = self.batch_size
        groups: tuple[list[int], list[int]] = ([], [])
        for index in self.sampler:
            bucket = groups[self.group(int(index))]
            bucket.append(index)
            if len(bucket) == size:
                yield bucket[:]
                bucket.clear()
        rest = groups[0] + groups[1]
        for start in range(0, len(rest), size):
            batch = rest[start:start + size]
            if len(batch) == size or not self.drop_last:
                yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]  # samplers of map-style data have a length
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def over(self, sampler: Sampler[int]) -> "AspectRatioBatchSampler":
        """The same batching over another sampler (a rank's shard): sizes already read are kept."""
        other = AspectRatioBatchSampler(sampler, self.batch_size, self.drop_last, sizes=self.sizes,
                                        dataset=self.dataset)
        other._groups = self._groups
        return other

    def __repr__(self) -> str:
        return (f"AspectRatioBatchSampler({type(self.sampler).__name__}, batch_size={self.batch_size}, "
                f"drop_last={self.drop_last})")


__all__ = ["AspectRatioBatchSampler"]
