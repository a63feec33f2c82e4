"""The DataFeed: position, per-epoch shuffle seeded by (seed, epoch), worker seeding."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from treadle.data import DataFeed


def ids(n=12):
    return TensorDataset(torch.arange(n))


def epoch_order(feed, epoch):
    feed.start_epoch(epoch)
    return [int(i) for (b,) in feed for i in b]


def test_position_is_reported():
    feed = DataFeed(DataLoader(ids(), batch_size=4), seed=1)
    feed.start_epoch(3)
    next(feed)
    next(feed)
    assert feed.position() == {"epoch": 3, "batch_idx": 2, "seed": 1}
    assert feed.length == 3
    assert DataFeed(iter([1, 2])).length is None


def test_shuffle_is_a_function_of_seed_and_epoch_and_leaves_global_rng_alone():
    a = DataFeed(DataLoader(ids(), batch_size=4, shuffle=True), seed=5)
    b = DataFeed(DataLoader(ids(), batch_size=4, shuffle=True), seed=5)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    orders = [epoch_order(a, e) for e in range(3)]
    assert torch.equal(torch.get_rng_state(), before)  # the global stream was not consumed
    assert orders[0] != orders[1] != orders[2]
    assert all(sorted(o) == list(range(12)) for o in orders)
    assert epoch_order(b, 2) == orders[2] and epoch_order(b, 0) == orders[0]  # any epoch, any order
    c = DataFeed(DataLoader(ids(), batch_size=4, shuffle=True), seed=6)
    assert epoch_order(c, 0) != orders[0]


class RandomItems(Dataset):
    """Items drawn from the worker's python, numpy and torch RNGs."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(()))])


def test_dataloader_workers_are_seeded_reproducibly():
    def run(seed):
        feed = DataFeed(DataLoader(RandomItems(), batch_size=2, num_workers=2), seed=seed)
        feed.start_epoch(1)
        return torch.cat(list(feed))

    first, again, other = run(3), run(3), run(4)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_state_dict_round_trip():
    feed = DataFeed(DataLoader(ids(), batch_size=4, shuffle=True), seed=9)
    feed.start_epoch(4)
    state = feed.state_dict()
    other = DataFeed(DataLoader(ids(), batch_size=4, shuffle=True))
    other.load_state_dict(state)
    assert other.seed == 9 and other.epoch == 4
    assert epoch_order(other, 4) == epoch_order(feed, 4)


def test_worker_processes_stop_when_fit_ends_and_do_not_start_before_they_are_needed():
    import multiprocessing

    from torch import nn

    import treadle
    from support import TinyNet, make_data

    earlier = {p.pid for p in multiprocessing.active_children()}  # e.g. another test's, not yet collected

    def workers():
        return [p for p in multiprocessing.active_children() if p.is_alive() and p.pid not in earlier]

    data = make_data(32)
    train = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, persistent_workers=True)
    val = DataLoader(data, batch_size=8, num_workers=2, persistent_workers=True)
    t = treadle.Trainer(TinyNet(), train_dataloader=train, val_dataloader=val, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=2, progress=False, log_writers=())
    assert workers() == []  # constructing the trainer starts no loader (the val one did)
    t.fit()
    # Persistent workers are stopped at the end of fit, not whenever the trainer is
    # garbage collected (which takes about 5 s per worker).
    assert train._iterator is None and val._iterator is None and workers() == []
    t.validate()
    assert val._iterator is None and workers() == []
