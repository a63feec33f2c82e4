"""An IterableDataset drawing its order from the main process's `random`, num_workers=0,
resumed inside an epoch: the batches after the resume differ from an uninterrupted run's,
and the resume says so in one warning."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

import treadle


class Shuffled(IterableDataset):
    def __iter__(self):
        order = list(range(8))
        random.shuffle(order)  # the main process's global RNG
        return iter(order)


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def forward(self, batch):
        self.seen.append(batch.tolist())
        return (self.w * batch.float()).sum() ** 2


class StatefulShuffled(IterableDataset):
    """The same stream keeping its own position (its order and the items taken): a resume
    goes on from that state, reading nothing again, and is exact."""

    def __init__(self) -> None:
        self.order: list[int] | None = None
        self.taken = 0

    def __iter__(self):
        if self.order is None:
            self.order = list(range(8))
            random.shuffle(self.order)
        while self.taken < len(self.order):
            self.taken += 1
            yield self.order[self.taken - 1]
        self.order, self.taken = None, 0

    def state_dict(self):
        return {"order": self.order, "taken": self.taken}

    def load_state_dict(self, state):
        self.order, self.taken = state["order"], state["taken"]


def _fit(work_dir, max_iters, dataset=Shuffled, **kw):
    model = Recorder()
    trainer = treadle.Trainer(model, work_dir=work_dir, train_dataloader=DataLoader(dataset(), batch_size=2),
                              optimizer=dict(type="SGD", lr=0.0), max_iters=max_iters, seed=0, progress=False,
                              log_writers=[], checkpoint=dict(interval=1, by_epoch=False), **kw)
    trainer.fit()
    return model.seen


def test_a_stream_on_the_global_rng_resumed_inside_an_epoch_warns_once(tmp_path, caplog):
    whole = _fit(tmp_path / "whole", 8)
    _fit(tmp_path / "run", 6)  # 4 batches an epoch: stops inside the second
    with caplog.at_level("WARNING", logger="treadle"):
        resumed = _fit(tmp_path / "run", 8, resume=True)
    warned = [r.getMessage() for r in caplog.records if "IterableDataset" in r.getMessage()]
    assert len(warned) == 1 and "num_workers=0" in warned[0] and "Shuffled" in warned[0], warned
    assert resumed != whole[6:]  # what the warning says: the rest of the epoch differs


def test_a_stream_resumed_from_its_own_state_is_exact_and_does_not_warn(tmp_path, caplog):
    whole = _fit(tmp_path / "whole", 8, StatefulShuffled)
    _fit(tmp_path / "run", 6, StatefulShuffled)
    with caplog.at_level("WARNING", logger="treadle"):
        resumed = _fit(tmp_path / "run", 8, StatefulShuffled, resume=True)
    assert not [r.getMessage() for r in caplog.records if "IterableDataset" in r.getMessage()]
    assert resumed == whole[6:]
