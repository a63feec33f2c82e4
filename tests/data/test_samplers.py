"""MMEngine's sample orders (treadle/data/samplers.py): the formula, written out here; their
shards; the run's seed given by the feed; and a loader of an MMEngine-style config resumed
inside an epoch. tests/mmengine_door/test_samplers_mmengine.py compares them with MMEngine's
own classes."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

from treadle.components.build import build_dataloader
from treadle.components.errors import ConfigError
from treadle.data.distributed import shard_eval_loader, shard_train_loader
from treadle.data.feed import DataFeed
from treadle.data.samplers import DefaultSampler, InfiniteSampler


def written_out(n: int, seed: int, epoch: int, shuffle: bool, round_up: bool, rank: int, world: int) -> list[int]:
    """MMEngine's DefaultSampler order, as its documentation describes it."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    total = -(-n // world) * world if round_up else n
    while len(order) < total:
        order += order[:total - len(order)]
    return order[rank:total:world]


@pytest.mark.parametrize("n, world, shuffle, round_up", [
    (10, 1, True, True), (10, 3, True, True), (10, 3, False, True), (10, 4, True, False), (3, 4, True, True),
    (7, 2, False, False)])
def test_default_sampler_is_the_written_out_order(n, world, shuffle, round_up):
    for epoch in (0, 1, 5):
        shards = []
        for rank in range(world):
            s = DefaultSampler(range(n), shuffle=shuffle, seed=7, round_up=round_up).shard(rank, world)
            s.set_epoch(epoch)
            shards.append(list(s))
            assert shards[-1] == written_out(n, 7, epoch, shuffle, round_up, rank, world)
            assert len(s) == len(shards[-1])
        if round_up:  # every shard as long, every index at least once
            assert len({len(x) for x in shards}) == 1 and set(itertools.chain(*shards)) == set(range(n))
        else:  # every index exactly once
            assert sorted(itertools.chain(*shards)) == list(range(n))


def test_infinite_sampler_deals_one_endless_stream():
    n = 5
    g = torch.Generator()
    g.manual_seed(3)
    stream = [i for _ in range(4) for i in torch.randperm(n, generator=g).tolist()]
    shards = [list(itertools.islice(InfiniteSampler(range(n), seed=3).shard(r, 2), 10)) for r in range(2)]
    assert shards == [stream[0:20:2], stream[1:20:2]]
    assert list(itertools.islice(InfiniteSampler(range(n), shuffle=False).shard(1, 2), 4)) == [1, 3, 0, 2]
    assert len(InfiniteSampler(range(n))) == n  # one pass over the data, as MMEngine's


def test_the_run_seed_comes_from_the_feed_and_a_given_seed_stays():
    loader = DataLoader(range(8), batch_size=8, sampler=DefaultSampler(range(8)))
    with pytest.raises(RuntimeError, match="takes the run's seed"):
        list(loader)
    feed = DataFeed(loader, seed=11)
    feed.start_epoch(2)
    assert next(feed).tolist() == written_out(8, 11, 2, True, True, 0, 1)
    given = DataLoader(range(8), batch_size=8, sampler=DefaultSampler(range(8), seed=4))
    feed = DataFeed(given, seed=11)
    feed.start_epoch(0)
    assert next(feed).tolist() == written_out(8, 4, 0, True, True, 0, 1)


def test_the_strategy_shards_it_training_padded_and_evaluation_not():
    loader = DataLoader(range(10), batch_size=2, sampler=DefaultSampler(range(10), seed=1))
    train = [shard_train_loader(loader, r, 4) for r in range(4)]
    assert all(isinstance(t.sampler, DefaultSampler) and len(t.sampler) == 3 for t in train)
    assert [t.sampler.rank for t in train] == [0, 1, 2, 3] and train[0].batch_size == 2
    evaluation = [shard_eval_loader(DataLoader(range(10), batch_size=2, sampler=DefaultSampler(range(10), False)),
                                    r, 4) for r in range(4)]
    assert sorted(i for e in evaluation for b in e for i in b.tolist()) == list(range(10))


def test_a_config_loader_names_the_sampler_and_refuses_shuffle_beside_it():
    spec = {"dataset": {"type": "support.make_data", "n": 6}, "batch_size": 3,
            "sampler": {"type": "mmengine.DefaultSampler", "shuffle": False}}
    loader = build_dataloader(spec, "train_dataloader")
    assert isinstance(loader.sampler, DefaultSampler) and loader.sampler.shuffle is False
    with pytest.raises(ConfigError, match=r"^train_dataloader.shuffle: given with a sampler"):
        build_dataloader({**spec, "shuffle": True}, "train_dataloader")
    with pytest.raises(ConfigError, match=r"^train_dataloader.sampler.type: unknown sampler type"):
        build_dataloader({**spec, "sampler": {"type": "DefaultSamplr"}}, "train_dataloader")


def test_a_feed_resumed_inside_an_epoch_reads_the_rest_of_that_epoch():
    def batches(skip: int) -> list[list[int]]:
        loader = DataLoader(range(12), batch_size=2, sampler=DefaultSampler(range(12)))
        feed = DataFeed(loader, seed=5)
        feed.start_epoch(1, skip=skip)
        return [b.tolist() for b in feed]

    assert batches(2) == batches(0)[2:]
