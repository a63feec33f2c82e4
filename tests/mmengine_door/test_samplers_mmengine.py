"""treadle's DefaultSampler and InfiniteSampler (treadle/data/samplers.py) give MMEngine's own
classes' orders, index for index, on every shard: MMEngine's read their shard from
``torch.distributed``, so each is built here as one rank of a world of that size would build it."""

from __future__ import annotations

import itertools
from unittest import mock

import pytest

from treadle.data.samplers import DefaultSampler, InfiniteSampler


def mmengine_sampler(cls_name: str, rank: int, world: int, **kwargs):
    import mmengine.dataset.sampler as sampler

    with mock.patch.object(sampler, "get_dist_info", return_value=(rank, world)):
        return getattr(sampler, cls_name)(**kwargs)


@pytest.mark.parametrize("n", [1, 7, 16, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("round_up", [True, False])
def test_default_sampler_is_mmengines(n, world, shuffle, round_up):
    for rank in range(world):
        ours = DefaultSampler(range(n), shuffle=shuffle, seed=42, round_up=round_up).shard(rank, world)
        theirs = mmengine_sampler("DefaultSampler", rank, world, dataset=range(n), shuffle=shuffle, seed=42,
                                  round_up=round_up)
        for epoch in (0, 1, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs)


@pytest.mark.parametrize("n, world", [(1, 1), (7, 2), (16, 3), (5, 8)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_infinite_sampler_is_mmengines(n, world, shuffle):
    for rank in range(world):
        ours = InfiniteSampler(range(n), shuffle=shuffle, seed=9).shard(rank, world)
        theirs = mmengine_sampler("InfiniteSampler", rank, world, dataset=range(n), shuffle=shuffle, seed=9)
        assert list(itertools.islice(ours, 4 * n)) == list(itertools.islice(iter(theirs), 4 * n))
        assert len(ours) == len(theirs)
