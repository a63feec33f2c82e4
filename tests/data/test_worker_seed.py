"""Per-sample seeds (treadle/data/worker_seed.py): a map-style dataset's draws from torch,
numpy and ``random`` are a function of (seed, epoch, index), whatever loads the sample.

Fast tests run the loaders in the main process; those with worker processes are marked
slow (each loader starts its workers)."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler,
                              Subset, WeightedRandomSampler, get_worker_info)

import treadle
from faults import Crash, CrashAt
from support import ON_CPU, TinyNet, make_data
from treadle.data import DataFeed
from treadle.data.resumable import ResumableLoader
from treadle.data import worker_seed
from treadle.data.worker_seed import WATCHED, SeededDataset, epoch_seed, sample_seed

N, BATCH = 20, 3  # 7 batches an epoch, the last one short


class Draws(Dataset):
    """Sample ``i`` is ``[i, random, numpy, torch]``: what the three global RNGs gave it."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.opened = False  # set through get_worker_info().dataset by a worker_init_fn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i), random.random(), float(np.random.rand()), float(torch.rand(()))],
                            dtype=torch.float64)


def by_index(batches) -> dict[int, list[float]]:
    """{index: its draws}, checking an index never came twice with other draws."""
    out: dict[int, list[float]] = {}
    for b in batches:
        for row in (b if b.dim() == 2 else b[None]):
            i, draws = int(row[0]), row[1:].tolist()
            assert out.setdefault(i, draws) == draws
    return out


def epoch(loader, epoch=1, skip=0, seed=7, **kw) -> torch.Tensor:
    feed = DataFeed(loader, seed=seed, **kw)
    feed.start_epoch(epoch, skip=skip)
    try:
        return torch.cat([b if b.dim() == 2 else b[None] for b in feed])
    finally:
        feed.close()


def shuffled(workers: int = 0, **kw) -> DataLoader:
    return DataLoader(Draws(), batch_size=BATCH, shuffle=True, num_workers=workers, **kw)


def global_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def same_states(a, b) -> bool:
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


# -- what a sample draws -----------------------------------------------------------------
def test_draws_are_a_function_of_seed_epoch_and_index_not_of_the_order():
    a = epoch(shuffled())
    seq = epoch(DataLoader(Draws(), batch_size=4))  # another order, another batching
    assert not torch.equal(a[:, 0], seq[:, 0])
    assert by_index([a]) == by_index([seq])
    assert by_index([epoch(shuffled(), epoch=2)]) != by_index([a])  # another epoch
    assert by_index([epoch(shuffled(), seed=8)]) != by_index([a])  # another seed
    assert len({tuple(v) for v in by_index([a]).values()}) == N  # every sample its own stream


def test_a_resume_inside_the_epoch_draws_what_the_whole_epoch_drew():
    whole = epoch(shuffled())
    assert torch.equal(epoch(shuffled(), skip=4), whole[4 * BATCH:])


def test_the_main_process_rng_is_left_as_it_was():
    """num_workers=0: the dataset runs in the main process; the training step's streams
    (dropout) must not see its draws."""
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    before = global_states()
    epoch(shuffled())
    assert same_states(global_states(), before)
    epoch(shuffled(), seed_per_sample=False)  # torch's behaviour: the dataset draws from them
    assert not same_states(global_states(), before)


def test_training_with_a_dataset_that_draws_equals_training_with_one_that_does_not():
    class Noisy(Dataset):
        def __init__(self):
            self.base = make_data(N)

        def __len__(self):
            return N

        def __getitem__(self, i):
            x, y = self.base[i]
            torch.rand(3), np.random.rand(), random.random()  # drawn, not used
            return x, y

    def fit(dataset, **kw):
        torch.manual_seed(0)
        # On the CPU: the dataset draws from the CPU generator, which dropout must share for
        # the draws to shift its masks (on CUDA it draws from the GPU's: nothing to see).
        t = treadle.Trainer(TinyNet(dropout=0.5), train_dataloader=DataLoader(dataset, batch_size=4, shuffle=True),
                            loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0,
                            log_writers=(), progress=False, strategy=ON_CPU, **kw)
        t.fit()
        return t.module.state_dict()

    plain = fit(make_data(N))
    for k, v in fit(Noisy()).items():
        assert torch.equal(v, plain[k]), k
    off = fit(Noisy(), seed_per_sample=False)  # the draws shift the dropout masks
    assert not all(torch.equal(v, plain[k]) for k, v in off.items())


def test_switched_off_it_is_torchs_behaviour():
    loader = DataLoader(Draws(), batch_size=BATCH)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    off = epoch(loader, seed_per_sample=False)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    plain = torch.cat(list(loader))
    assert torch.equal(off, plain)
    assert not torch.equal(epoch(loader), plain)


def test_an_iterable_dataset_is_left_alone():
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(N):
                yield Draws()[i]

    loader = DataLoader(Stream(), batch_size=BATCH)
    feed = DataFeed(loader, seed=7)
    assert feed.seed_per_sample is False
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    on = epoch(loader)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    assert torch.equal(on, epoch(loader, seed_per_sample=False))


# -- watching whether the dataset draws -------------------------------------------------------
class Quiet(Dataset):
    """Draws nothing: sample ``i`` is ``(i, torch.initial_seed())``, the seed torch's generator
    had when it was fetched (the sample's own seed while it is seeded)."""

    def __len__(self) -> int:
        return 3 * WATCHED

    def __getitem__(self, i):
        return i, torch.initial_seed()


def was_seeded(samples, seed=7, epoch=0) -> list[bool]:
    return [initial == sample_seed((epoch_seed(seed, epoch), i, 0)) for i, initial in samples]


def counting_seeds(monkeypatch) -> list:
    keys: list = []
    seed = worker_seed._seed

    def counted(key):
        keys.append(key)
        seed(key)
    monkeypatch.setattr(worker_seed, "_seed", counted)
    return keys


def test_a_dataset_that_draws_nothing_stops_being_seeded(monkeypatch):
    loader = DataLoader(Quiet(), batch_size=4, shuffle=True, collate_fn=list)
    feed = DataFeed(loader, seed=7)
    feed.start_epoch(0)
    seeded = was_seeded(s for b in feed for s in b)
    assert seeded == [True] * WATCHED + [False] * (len(seeded) - WATCHED)
    feed.start_epoch(1)  # decided for the process: the next epoch is not watched again
    assert not any(was_seeded((s for b in feed for s in b), epoch=1))


def test_the_data_of_a_dataset_that_draws_nothing_are_the_same(monkeypatch):
    """Seeded, watched then not seeded, or never seeded: the same batches in every epoch
    (from the second on, the main process reads the user's loader itself), and after a skip."""
    keys = counting_seeds(monkeypatch)
    loader = DataLoader(Plain(), batch_size=5, shuffle=True)
    runs = {}
    for mode, seeds in ((True, WATCHED), ("always", 4 * len(Plain()) - 4 * 5), (False, 0)):
        keys.clear()
        feed = DataFeed(loader, seed=7, seed_per_sample=mode)
        runs[mode] = []
        for e in range(3):
            feed.start_epoch(e)
            runs[mode] += list(feed)
        feed.start_epoch(1, skip=4)
        runs[mode] += list(feed)
        assert len(keys) == seeds, mode
    assert len(runs[True]) == 3 * 26 + 22
    for mode in ("always", False):
        for (x, y), (rx, ry) in zip(runs[mode], runs[True], strict=True):
            assert torch.equal(x, rx) and torch.equal(y, ry), mode


@pytest.mark.parametrize("rng", ["torch", "numpy", "random", "numpy gauss"])
def test_a_dataset_that_draws_from_any_one_rng_stays_seeded(rng, monkeypatch):
    draw = {"torch": lambda: float(torch.rand(())), "numpy": lambda: float(np.random.rand()),
            "random": random.random, "numpy gauss": lambda: float(np.random.standard_normal())}[rng]

    class One(Dataset):
        def __len__(self):
            return 2 * WATCHED

        def __getitem__(self, i):
            return torch.tensor([float(i), draw()], dtype=torch.float64)

    keys = counting_seeds(monkeypatch)
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    before = global_states()
    shuffled_rows = epoch(DataLoader(One(), batch_size=BATCH, shuffle=True))
    assert len(keys) == 2 * WATCHED  # every sample, long after the watch
    assert same_states(global_states(), before)  # the main process's streams untouched
    assert by_index([shuffled_rows]) == by_index([epoch(DataLoader(One(), batch_size=5))])
    resumed = epoch(DataLoader(One(), batch_size=BATCH, shuffle=True), skip=30)
    assert torch.equal(resumed, shuffled_rows[30 * BATCH:])


class Late(Dataset):
    """Draws nothing for its first ``WATCHED`` samples, then from torch."""

    def __len__(self):
        return 2 * WATCHED

    def __getitem__(self, i):
        return torch.tensor([float(i), float(torch.rand(())) if i >= WATCHED else 0.0])


def test_always_seeds_a_dataset_that_draws_only_after_the_watch(monkeypatch):
    loader = DataLoader(Late(), batch_size=4)  # in order: the draws start after the watched samples
    keys = counting_seeds(monkeypatch)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    epoch(loader)  # the rule: its later draws are not seen, so they come from the main process's stream
    assert len(keys) == WATCHED and not torch.equal(torch.get_rng_state(), before)
    keys.clear()
    torch.manual_seed(0)
    whole = epoch(loader, seed_per_sample="always")
    assert len(keys) == 2 * WATCHED and torch.equal(torch.get_rng_state(), before)
    assert by_index([whole]) == by_index([epoch(DataLoader(Late(), batch_size=4, shuffle=True),
                                                seed_per_sample="always")])


def test_a_batched_fetch_is_watched_per_batch(monkeypatch):
    class Batched(Dataset):
        def __len__(self):
            return 2 * WATCHED

        def __getitems__(self, indices):
            return [torch.tensor([float(i)]) for i in indices]

    keys = counting_seeds(monkeypatch)
    rows = epoch(DataLoader(Batched(), batch_size=1, shuffle=True))
    assert len(keys) == WATCHED  # seeded once per batch while watched
    assert sorted(rows[:, 0].tolist()) == list(range(2 * WATCHED))


def test_the_trainer_takes_always(monkeypatch):
    keys = counting_seeds(monkeypatch)
    for mode, seeds in ((True, WATCHED), ("always", 2 * len(Plain()))):  # 2 epochs
        keys.clear()
        torch.manual_seed(0)
        t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(Plain(), batch_size=4, shuffle=True),
                            loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=2, seed=0,
                            log_writers=(), progress=False, strategy=ON_CPU, seed_per_sample=mode)
        t.fit()
        assert len(keys) == seeds, mode


class Plain(Dataset):
    """make_data's samples, through a Dataset class of its own: draws nothing."""

    def __init__(self) -> None:
        self.base = make_data(2 * WATCHED)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        return self.base[i]


# -- samplers, batching, sharding ----------------------------------------------------------
def test_shards_of_a_distributed_sampler_draw_what_one_process_draws():
    """Seeds come from the global index: 1 or 3 ranks give each sample the same draws."""
    one = by_index([epoch(shuffled())])
    for world in (2, 3):
        parts = [epoch(DataLoader(Draws(), batch_size=BATCH, sampler=DistributedSampler(Draws(), world, r)),
                       rank=r) for r in range(world)]
        assert by_index(parts) == one  # padding repeats a sample with its draws


def test_a_user_batch_sampler_and_collate_fn_still_work():
    class Pairs:  # a batch sampler of its own: (i, i + 10)
        def __iter__(self):
            return iter([[i, i + 10] for i in range(10)])

        def __len__(self):
            return 10

    def collate(samples):
        return {"rows": torch.stack(samples)}

    loader = DataLoader(Draws(), batch_sampler=Pairs(), collate_fn=collate)
    feed = DataFeed(loader, seed=7)
    feed.start_epoch(1)
    batches = [b["rows"] for b in feed]
    assert [b[:, 0].tolist() for b in batches] == [[i, i + 10] for i in range(10)]
    assert by_index(batches) == by_index([epoch(shuffled())])


def test_a_loader_without_automatic_batching():
    loader = DataLoader(Draws(), batch_size=None, shuffle=True)
    assert by_index([epoch(loader)]) == by_index([epoch(shuffled())])
    assert torch.equal(epoch(loader, skip=5), epoch(loader)[5:])


def test_repeats_of_a_sampler_with_replacement_draw_anew_and_resume_exactly():
    def loader():
        sampler = WeightedRandomSampler(torch.ones(N), 3 * N, replacement=True)
        return DataLoader(Draws(), batch_size=BATCH, sampler=sampler)
    whole = epoch(loader())
    ids = whole[:, 0].tolist()
    assert len(set(ids)) < len(ids)  # some index came twice
    assert len({tuple(r) for r in whole[:, 1:].tolist()}) == len(ids)  # each time with new draws
    assert torch.equal(epoch(loader(), skip=6), whole[6 * BATCH:])
    assert torch.equal(epoch(DataLoader(Draws(), sampler=RandomSampler(Draws(), True, 3 * N), batch_size=2), skip=3),
                       epoch(DataLoader(Draws(), sampler=RandomSampler(Draws(), True, 3 * N), batch_size=2))[6:])


def test_a_subset_and_a_dataset_with_its_own_batched_fetch():
    sub = Subset(Draws(), list(range(0, N, 2)))  # torch's Subset: seeded per sample, by the index into it
    rows = epoch(DataLoader(sub, batch_size=BATCH))
    full = by_index([epoch(shuffled())])
    assert rows[:, 1:].tolist() == [full[k] for k in range(len(sub))]

    class Batched(Draws):
        calls = 0

        def __getitems__(self, indices):
            Batched.calls += 1
            return [self[i] for i in indices]

    loader = DataLoader(Batched(), batch_size=BATCH, shuffle=True)
    whole = epoch(loader)
    assert Batched.calls == 7  # its own fetch is used, seeded once per batch
    assert torch.equal(epoch(loader, skip=2), whole[2 * BATCH:])


def test_the_users_loader_and_dataset_stay_as_they_were():
    loader = shuffled()
    data = loader.dataset
    feed = DataFeed(loader, seed=7)
    feed.start_epoch(0)
    next(feed)
    assert feed.loader is loader and loader.dataset is data and isinstance(data, Draws)
    wrapped = ResumableLoader(loader, seed=7)
    assert wrapped.dataset is data
    # What a worker gets (pickled under spawn/forkserver): attributes read and written on the dataset.
    copy = pickle.loads(pickle.dumps(SeededDataset(data)))
    assert len(copy) == N and copy.n == N and not copy.opened
    copy.opened = True
    assert copy._treadle_dataset.opened and copy[(5, 3, 0)][0] == 3


def test_a_bad_switch_is_refused():
    with pytest.raises(TypeError, match="seed_per_sample must be True, False or 'always', got 'yes'"):
        DataFeed(shuffled(), seed_per_sample="yes")
    with pytest.raises(ValueError, match="seed_per_sample: not a supported value.*'always'"):
        treadle.Trainer(TinyNet(), train_dataloader=shuffled(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        seed_per_sample="sometimes", log_writers=())
    with pytest.raises(TypeError, match="seed_per_sample: wrong type int"):
        treadle.Trainer(TinyNet(), train_dataloader=shuffled(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        seed_per_sample=1, log_writers=())


# -- worker processes ------------------------------------------------------------------------
def _open(worker_id):
    get_worker_info().dataset.opened = True  # reaches the user's dataset through the wrapper


class Opened(Draws):
    def __getitem__(self, i):
        assert self.opened, "worker_init_fn's attribute did not reach the dataset"
        return super().__getitem__(i)


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_any_number_of_workers_draws_the_same(persistent):
    def loader(workers):
        return DataLoader(Opened(), batch_size=BATCH, shuffle=True, num_workers=workers, worker_init_fn=_open,
                          persistent_workers=persistent)

    ref = [epoch(shuffled(), epoch=e) for e in (0, 1)]  # num_workers=0 (and no worker_init_fn)
    for workers in (2, 4):
        dl = loader(workers)
        feed = DataFeed(dl, seed=7)
        for e in (0, 1):  # a persistent loader keeps its workers between the epochs
            feed.start_epoch(e)
            assert torch.equal(torch.cat(list(feed)), ref[e]), (workers, e)
        feed.start_epoch(1, skip=3)
        assert torch.equal(torch.cat(list(feed)), ref[1][3 * BATCH:])
        feed.close()
        off = epoch(loader(workers), epoch=1, seed_per_sample=False)
        assert not torch.equal(off, ref[1])  # without: each worker's own stream


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_each_worker_watches_for_itself(persistent):
    """Worker w loads batches w, w + 2, ...: the first WATCHED samples of each are seeded;
    workers that start again (not persistent) watch again."""
    loader = DataLoader(Quiet(), batch_size=4, shuffle=True, num_workers=2, collate_fn=list,
                        persistent_workers=persistent)
    feed = DataFeed(loader, seed=7)
    for e in (0, 1):
        feed.start_epoch(e)
        seeded = [was_seeded(batch, epoch=e) for batch in feed]
        watched = e == 0 or not persistent
        assert seeded == [[watched and b // 2 < WATCHED // 4] * 4 for b in range(len(seeded))], e
    feed.close()


# -- resume through the Trainer and the Strategy API ---------------------------------------
class Augmented(Dataset):
    """make_data with noise from torch, numpy and random added to x."""

    def __init__(self) -> None:
        self.base = make_data(N)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i):
        x, y = self.base[i]
        return x + 0.3 * torch.randn(x.shape) + float(np.random.rand()) - random.random(), y


def _trainer(work_dir, workers, resume=False, hooks=(), **kw):
    torch.manual_seed(0)
    loader = DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=workers)
    return treadle.Trainer(TinyNet(dropout=0.3), work_dir=work_dir, train_dataloader=loader,
                           loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=3, seed=0,
                           checkpoint=dict(interval=1, by_epoch=False), log_writers=(), progress=False,
                           resume=resume, hooks=list(hooks), **kw)


def _resumed_equals_whole(tmp_path, workers, **kw) -> bool:
    ref = _trainer(tmp_path / "ref", workers, **kw)
    ref.fit()
    with pytest.raises(Crash):
        _trainer(tmp_path / "run", workers, hooks=[CrashAt(8)], **kw).fit()  # epoch 1, batch 3
    res = _trainer(tmp_path / "run", workers, resume=True, **kw)
    res.fit()
    assert res.state.iter == ref.state.iter == 15
    return all(torch.equal(v, res.module.state_dict()[k]) for k, v in ref.module.state_dict().items())


def test_trainer_resume_inside_an_epoch_is_exact_in_the_main_process(tmp_path):
    assert _resumed_equals_whole(tmp_path, 0)


@pytest.mark.slow
def test_trainer_resume_inside_an_epoch_is_exact_with_workers(tmp_path):
    assert _resumed_equals_whole(tmp_path / "on", 2)
    assert not _resumed_equals_whole(tmp_path / "off", 2, seed_per_sample=False)  # the test sees it


def _api_run(work_dir, workers, stop_at=None, resume=False, seed_per_sample=True):
    strategy = treadle.build_strategy("single", work_dir=work_dir, seed=3)
    torch.manual_seed(0)
    model, ow = strategy.prepare(TinyNet(dropout=0.3), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    loader = strategy.prepare_dataloader(DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=workers),
                                         seed_per_sample=seed_per_sample)
    extra = strategy.load_or_resume(resume=True) if resume else None
    it, epoch0 = (extra["iter"], extra["epoch"]) if extra else (0, 0)
    for e in range(epoch0, 3):
        for x, y in loader:
            x, y = x.to(strategy.device), y.to(strategy.device)  # a loop of one's own moves its batches
            ow.update_params(nn.functional.cross_entropy(model(x), y))
            it += 1
            if it == stop_at:
                strategy.save_checkpoint(strategy.work_dir / "ckpt" / f"iter_{it}", extra_ckpt={"iter": it, "epoch": e})
                loader.close()
                return None
    loader.close()
    return model.state_dict()


def _api_resumed_equals_whole(tmp_path, workers, **kw) -> bool:
    whole = _api_run(tmp_path / "a", workers, **kw)
    _api_run(tmp_path / "b", workers, stop_at=8, **kw)  # epoch 1, batch 3
    resumed = _api_run(tmp_path / "b", workers, resume=True, **kw)
    return all(torch.equal(v, resumed[k]) for k, v in whole.items())


def test_strategy_api_resume_inside_an_epoch_is_exact_in_the_main_process(tmp_path):
    assert _api_resumed_equals_whole(tmp_path, 0)


@pytest.mark.slow
def test_strategy_api_resume_inside_an_epoch_is_exact_with_workers(tmp_path):
    assert _api_resumed_equals_whole(tmp_path / "on", 2)
    assert not _api_resumed_equals_whole(tmp_path / "off", 2, seed_per_sample=False)  # the test sees it


def test_in_memory_tensor_datasets_are_not_seeded():
    """torch's TensorDataset (alone or under Subset/ConcatDataset/StackDataset) draws
    nothing: its loader is iterated as it is, at no cost per sample."""
    from torch.utils.data import ConcatDataset, StackDataset, Subset, TensorDataset

    from treadle.data.feed import DataFeed
    from treadle.data.worker_seed import may_draw

    t = TensorDataset(torch.arange(8.0))
    for ds in (t, Subset(t, [0, 1]), ConcatDataset([t, t]), StackDataset(t, t), StackDataset(a=t)):
        assert not may_draw(ds)
        assert not DataFeed(DataLoader(ds, batch_size=2)).seed_per_sample
    assert may_draw(ConcatDataset([t, Draws()]))
    assert DataFeed(DataLoader(Draws(), batch_size=2)).seed_per_sample
