"""Sharding loaders across ranks (no process group needed: rank and world are given)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from support import make_data
from treadle.data.distributed import ShardSampler, shard_eval_loader, shard_train_loader
from treadle.data.feed import DataFeed
from treadle.seeding import derive_seed


def test_shard_sampler_covers_every_index_once():
    shards = [list(ShardSampler(10, r, 3)) for r in range(3)]
    assert sorted(i for s in shards for i in s) == list(range(10))
    assert [len(ShardSampler(10, r, 3)) for r in range(3)] == [4, 3, 3]


def test_eval_loader_shards_without_padding():
    data = make_data(37)
    loaders = [shard_eval_loader(DataLoader(data, batch_size=5), r, 2) for r in range(2)]
    seen = torch.cat([y for loader in loaders for _, y in loader])
    assert len(seen) == 37


def test_train_loader_gets_a_distributed_sampler_keeping_its_options():
    data = make_data(30)
    loader = DataLoader(data, batch_size=4, shuffle=True, drop_last=True)
    sharded = [shard_train_loader(loader, r, 2) for r in range(2)]
    for r, s in enumerate(sharded):
        assert isinstance(s.sampler, DistributedSampler) and s.sampler.shuffle and s.sampler.rank == r
        assert s.drop_last and s.batch_size == 4
        assert len(s) == 3  # 15 samples per rank, 3 full batches
    assert shard_train_loader(loader, 0, 1) is loader  # one process: untouched
    plain = shard_train_loader(DataLoader(data, batch_size=4), 1, 2)
    assert not plain.sampler.shuffle


def test_feed_shuffles_the_same_way_on_every_rank_and_per_epoch():
    """Ranks share the permutation (seeded from the feed's seed), so their shards are
    disjoint; another epoch gives another order; resume can rebuild it."""
    data = make_data(16)
    feeds = [DataFeed(shard_train_loader(DataLoader(data, batch_size=2, shuffle=True), r, 2), seed=5, rank=r)
             for r in range(2)]
    orders = []
    for epoch in range(2):
        idx = []
        for f in feeds:
            f.start_epoch(epoch)
            idx.append(list(f.loader.sampler))
        assert sorted(idx[0] + idx[1]) == list(range(16))
        orders.append(idx[0])
    assert orders[0] != orders[1]
    expected = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=derive_seed(5, 0) >> 2)
    expected.set_epoch(1)
    assert orders[1] == list(expected)


def test_loaders_that_cannot_be_sharded_say_how_to_opt_out():
    data = make_data(8)
    custom = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 2, False))
    custom.batch_sampler.__class__ = type("MyBatches", (BatchSampler,), {})
    with pytest.raises(ValueError, match="shard_data=False"):
        shard_train_loader(custom, 0, 2)
    user = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    assert shard_train_loader(user, 0, 2) is user  # already sharded by the user
    assert shard_train_loader([1, 2], 0, 2) == [1, 2]  # not a DataLoader: left alone (with a warning)
