"""Exact resume for loaders beyond a plain shuffled DataLoader: samplers that would draw
from the global RNG, an IterableDataset, persistent workers. Each test trains without
interruption, then stops a second run at ``at`` (after that iteration's checkpoint),
resumes it in a new Trainer, and compares the final weights with ``torch.equal``."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.utils.data import (DataLoader, Dataset, Sampler, SubsetRandomSampler, TensorDataset,
                              WeightedRandomSampler)

import treadle
from faults import Crash, CrashAt
from support import Stream, TinyNet, make_data
from treadle.data import DataFeed

N, BATCH = 30, 6  # 5 batches an epoch


def trainer(work_dir, loader, resume=False, hooks=(), max_epochs=3, **kw):
    torch.manual_seed(0)
    return treadle.Trainer(TinyNet(dropout=0.3), work_dir=work_dir, train_dataloader=loader(),
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=max_epochs,
                           seed=0, checkpoint=dict(interval=1, by_epoch=False), log_writers=(), progress=False,
                           resume=resume, hooks=list(hooks), **kw)


def assert_resume_is_exact(tmp_path, loader, at, after=lambda: None, **kw):
    ref = trainer(tmp_path / "ref", loader, **kw)
    ref.fit()
    after()
    with pytest.raises(Crash):
        trainer(tmp_path / "run", loader, hooks=[CrashAt(at)], **kw).fit()
    after()
    res = trainer(tmp_path / "run", loader, resume=True, **kw)
    res.fit()
    after()
    assert res.state.iter == ref.state.iter
    expected, got = ref.module.state_dict(), res.module.state_dict()
    for k in expected:
        assert torch.equal(expected[k], got[k]), f"{k} differs"


class GeneratorSlot(Sampler[int]):
    """A user sampler following torch's convention: draws from ``self.generator`` (None: global RNG)."""

    def __init__(self, n: int) -> None:
        self.n, self.generator = n, None

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())

    def __len__(self) -> int:
        return self.n


class SlottedGeneratorSlot:
    """The same, not a Sampler subclass, with ``__slots__`` and no ``__weakref__``:
    treadle cannot hold it weakly."""

    __slots__ = ("n", "generator")

    def __init__(self, n: int) -> None:
        self.n, self.generator = n, None

    __iter__ = GeneratorSlot.__iter__
    __len__ = GeneratorSlot.__len__


SAMPLERS = {
    "subset": lambda: SubsetRandomSampler(range(N)),
    "weighted": lambda: WeightedRandomSampler(torch.linspace(0.5, 2.0, N), N),
    "user_generator_slot": lambda: GeneratorSlot(N),
    "user_slots_no_weakref": lambda: SlottedGeneratorSlot(N),
}


@pytest.mark.parametrize("kind", SAMPLERS)
def test_samplers_with_a_generator_slot_resume_mid_epoch_exactly(tmp_path, kind):
    def loader():
        return DataLoader(make_data(N), batch_size=BATCH, sampler=SAMPLERS[kind]())
    assert_resume_is_exact(tmp_path, loader, at=8)  # inside the second epoch


def test_generator_slot_samplers_are_seeded_per_epoch_and_leave_the_global_rng_alone():
    def orders(seed, sampler):
        feed = DataFeed(DataLoader(TensorDataset(torch.arange(N)), batch_size=BATCH, sampler=sampler), seed=seed)
        out = []
        for epoch in range(2):
            feed.start_epoch(epoch)
            out.append([int(i) for (b,) in feed for i in b])
        return out

    torch.manual_seed(0)
    before = torch.get_rng_state()
    user_gen = torch.Generator().manual_seed(123)  # replaced, as for RandomSampler
    a = orders(4, SubsetRandomSampler(range(N), generator=user_gen))
    assert torch.equal(torch.get_rng_state(), before)
    assert a == orders(4, SubsetRandomSampler(range(N))) and a[0] != a[1]
    assert a != orders(5, SubsetRandomSampler(range(N)))
    # A second feed over the same sampler reseeds the generator the first one gave it.
    for make in (lambda: SubsetRandomSampler(range(N)), lambda: SlottedGeneratorSlot(N)):
        shared = make()
        assert orders(4, shared) == orders(4, shared) == orders(4, make())
    w = orders(4, WeightedRandomSampler(torch.ones(N), N))
    assert w == orders(4, WeightedRandomSampler(torch.ones(N), N)) and w[0] != w[1]
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_resumes_mid_epoch_by_loading_and_dropping_batches(tmp_path, workers):
    def loader():
        return DataLoader(Stream(), batch_size=BATCH, num_workers=workers)
    assert_resume_is_exact(tmp_path, loader, at=8)


class Items(Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def test_persistent_workers_resume_exactly_at_a_boundary_and_inside_an_epoch(tmp_path, caplog):
    made = []

    def loader():  # a dataset of its own (a TensorDataset is known to draw nothing: never seeded, never warned)
        made.append(DataLoader(Items(make_data(N)), batch_size=BATCH, shuffle=True, num_workers=2,
                               persistent_workers=True))
        return made[-1]

    def stop_workers():
        # Collected inside the Trainer's reference cycles, a persistent iterator's queues may
        # close first and its workers then take torch's 5 s status interval each to notice.
        for dl in made:
            if dl._iterator is not None:
                dl._iterator._shutdown_workers()

    with caplog.at_level(logging.WARNING, logger="treadle"):
        assert_resume_is_exact(tmp_path / "boundary", loader, at=10, after=stop_workers)  # end of epoch 2
        assert_resume_is_exact(tmp_path / "inside", loader, at=7, after=stop_workers)
        assert "persistent_workers=True" not in caplog.text  # seeded per sample: the workers' RNG does not matter
        assert_resume_is_exact(tmp_path / "off", loader, at=10, after=stop_workers, seed_per_sample=False)
        assert "persistent_workers=True" in caplog.text  # worker-side randomness is not restored


class GlobalRNG(Sampler[int]):
    """A user sampler treadle cannot seed: it draws from torch's global RNG."""

    def __iter__(self):
        return iter(torch.randperm(N).tolist())

    def __len__(self) -> int:
        return N


def test_a_sampler_treadle_cannot_seed_warns_when_resumed_mid_epoch(tmp_path, caplog):
    def loader():
        return DataLoader(make_data(N), batch_size=BATCH, sampler=GlobalRNG())
    with pytest.raises(Crash):
        trainer(tmp_path, loader, hooks=[CrashAt(8)], max_epochs=2).fit()
    with caplog.at_level(logging.WARNING, logger="treadle"):
        trainer(tmp_path, loader, resume=True, max_epochs=2).fit()
    assert caplog.text.count("cannot seed") == 1 and "GlobalRNG" in caplog.text
