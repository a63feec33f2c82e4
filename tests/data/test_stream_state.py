"""Streams that keep their own position resume from it: torchdata's StatefulDataLoader,
a Stateful IterableDataset read in the main process, Hugging Face's IterableDataset.

Each test trains without interruption, stops a second run inside an epoch (after that
iteration's checkpoint), resumes it in a new Trainer and checks three things: the resumed
run trains on exactly the batches the uninterrupted one had left, ends with equal weights,
and its dataset read each of those samples once (a counter in the dataset, shared with
the loader's workers): nothing taken before the checkpoint is read again."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from faults import Crash, CrashAt
from support import Count, StatefulStream, Stream, TinyNet, make_data
from treadle.data.feed import stream_owner

N, BATCH, EPOCHS = 30, 5, 2  # N: a Stream's samples; 6 batches an epoch in one process


class Record(treadle.Hook):
    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def before_train_iter(self, trainer, batch):
        self.batches.append(batch[1].tolist() + [round(float(batch[0].sum()), 4)])


def run(work_dir, make_loader, hooks=(), resume=False, counter=lambda: multiprocessing.Value("i", 0)):
    """A Trainer over ``make_loader(read)``; returns it and the samples its dataset read."""
    read = counter()
    torch.manual_seed(0)
    t = treadle.Trainer(TinyNet(dropout=0.3), work_dir=work_dir, train_dataloader=make_loader(read),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=EPOCHS,
                        seed=0, checkpoint=dict(interval=1, by_epoch=False), log_writers=(), progress=False,
                        resume=resume, hooks=list(hooks))
    t.fit()
    return t, read.value


def check_resume(tmp_path, make_loader, at, rereads=False, extra=0, **kw):
    """Resume at iteration ``at`` (inside an epoch): the same batches and weights as an
    uninterrupted run; the samples read after the resume: those left (``rereads``: those
    left and the open epoch's ones taken before the checkpoint, read again; ``extra``:
    those left and that many more)."""
    ref_rec = Record()
    ref, ref_read = run(tmp_path / "ref", make_loader, [ref_rec], **kw)
    with pytest.raises(Crash):
        run(tmp_path / "run", make_loader, [CrashAt(at)], **kw)
    rec = Record()
    res, res_read = run(tmp_path / "run", make_loader, [rec], resume=True, **kw)
    assert rec.batches == ref_rec.batches[at:]
    assert res.state.iter == ref.state.iter == len(ref_rec.batches)
    for k, v in ref.module.state_dict().items():
        assert torch.equal(v, res.module.state_dict()[k]), f"{k} differs"
    taken = sum(len(b) - 1 for b in ref_rec.batches[:at])  # samples in the batches before the checkpoint
    per_epoch = len(ref_rec.batches) // EPOCHS
    taken_in_epoch = sum(len(b) - 1 for b in ref_rec.batches[at - at % per_epoch:at])
    assert 0 < at % per_epoch, "the checkpoint must be inside an epoch"
    assert ref_read == N * EPOCHS
    assert res_read == N * EPOCHS - taken + (taken_in_epoch if rereads else extra)
    return res


def test_a_stateful_dataset_read_in_the_main_process_resumes_from_its_own_position(tmp_path):
    def loader(read):
        return DataLoader(StatefulStream(read), batch_size=BATCH)
    assert stream_owner(loader(multiprocessing.Value("i", 0))) is not None
    check_resume(tmp_path, loader, at=4)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_plain_dataloaders_workers_hold_copies_so_the_stream_is_read_again_exactly(tmp_path, workers):
    def loader(read):  # the main process never sees its workers' positions: no state to take
        return DataLoader(StatefulStream(read), batch_size=BATCH, num_workers=workers)
    assert stream_owner(loader(multiprocessing.Value("i", 0))) is None
    check_resume(tmp_path, loader, at=4, rereads=True)


def test_a_stream_without_state_is_read_again_exactly(tmp_path):
    check_resume(tmp_path, lambda read: DataLoader(Stream(read), batch_size=BATCH), at=4, rereads=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_from_its_state(tmp_path, workers):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader(read):
        return sdl.StatefulDataLoader(StatefulStream(read), batch_size=BATCH, num_workers=workers)
    # 2 workers: each reads half (15 samples: batches of 5, 5, 5), 6 batches an epoch, alternating.
    check_resume(tmp_path, loader, at=3 if workers else 4)


def _hf_loader(datasets, read, buffer_size=None):
    """A DataLoader over a Hugging Face IterableDataset of 3 generator shards of 10 items
    (counting each item read in ``read``), optionally through a shuffle buffer."""
    data = make_data(N)

    def items(shards):
        for s in shards:
            for i in range(s * 10, s * 10 + 10):
                with read.get_lock():
                    read.value += 1
                yield {"i": i}

    def collate(rows):
        idx = torch.tensor([r["i"] for r in rows])
        return data.tensors[0][idx], data.tensors[1][idx]

    ds = datasets.IterableDataset.from_generator(items, gen_kwargs={"shards": [0, 1, 2]})
    if buffer_size is not None:
        ds = ds.shuffle(seed=3, buffer_size=buffer_size)
    return DataLoader(ds, batch_size=BATCH, collate_fn=collate)


def test_hugging_face_iterable_dataset_resumes_from_its_state(tmp_path):
    datasets = pytest.importorskip("datasets")

    def make(read):
        return _hf_loader(datasets, read)
    assert stream_owner(make(Count())) is not None
    # Its state names the shard and the example in it; a generator's shard is run again up
    # to that example (Hugging Face's own skip): the 5 samples of shard 1 taken, not the 15.
    check_resume(tmp_path, make, at=3, extra=5, counter=Count)


def test_hugging_face_shuffle_buffer_is_read_again_as_its_state_loses_the_buffer(tmp_path):
    datasets = pytest.importorskip("datasets")

    def make(read):
        return _hf_loader(datasets, read, buffer_size=8)
    assert stream_owner(make(Count())) is None
    check_resume(tmp_path, make, at=4, rereads=True, counter=Count)


@pytest.mark.parametrize("resume_first", [False, True])
def test_a_hand_written_loop_resumes_a_stateful_dataloader_from_its_own_state(tmp_path, resume_first):
    """strategy.save_checkpoint/resume: the stream's state is in this rank's file; a loader
    prepared after the resume takes it too."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def setup(read, before=None):
        s = treadle.build_strategy("single", work_dir=tmp_path, seed=3)
        s.prepare(TinyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
        if before:
            before(s)
        return s, s.prepare_dataloader(sdl.StatefulDataLoader(StatefulStream(read), batch_size=BATCH, num_workers=2))

    def ids(batch):
        return batch[1].tolist()

    read = multiprocessing.Value("i", 0)
    s, loader = setup(read)
    ref = [ids(b) for e in range(EPOCHS) for b in loader]
    assert read.value == N * EPOCHS
    read = multiprocessing.Value("i", 0)
    s, loader = setup(read)
    it = iter(loader)
    first = [ids(next(it)) for _ in range(4)]  # 4 of the 6 batches of epoch 0
    s.save_checkpoint(tmp_path / "ckpt")
    rank_file = torch.load(tmp_path / "ckpt" / "rng_rank0.pt", weights_only=True)
    assert rank_file["rank_state"]["data"][0] is not None  # the loader's own state, in this rank's file
    del it
    read = multiprocessing.Value("i", 0)
    if resume_first:
        s, loader = setup(read, before=lambda st: st.resume(tmp_path / "ckpt"))
    else:
        s, loader = setup(read)
        s.resume(tmp_path / "ckpt")
    rest = [ids(b) for b in loader] + [ids(b) for e in range(1, EPOCHS) for b in loader]
    assert first + rest == ref
    assert read.value == N * EPOCHS - 4 * BATCH  # nothing taken before the checkpoint is read again


class RankStream(StatefulStream):
    """Each rank's own share of the stream (items ``i % world == rank``); its state names the
    rank, so each rank's file can be told apart. ``read`` is a plain counter here."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__(Count())
        self.rank, self.world = rank, world
        self.loaded: dict[str, int] | None = None  # the state last loaded

    def _mine(self) -> list[int]:
        return list(range(self.rank, N, self.world))

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken, "rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        super().load_state_dict(state)
        self.loaded = state


def two_rank_worker(rank: int, world: int, root: str) -> dict:
    from pathlib import Path

    def setup():
        s = treadle.build_strategy("ddp", work_dir=root, seed=3)
        s.prepare(TinyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
        ds = RankStream(rank, world)
        return s, s.prepare_dataloader(DataLoader(ds, batch_size=BATCH)), ds

    s, loader, ds = setup()
    ref = [b[1].tolist() for e in range(EPOCHS) for b in loader]
    s, loader, ds = setup()
    it = iter(loader)
    first = [next(it)[1].tolist() for _ in range(2)]  # 2 of the 3 batches of this rank's epoch 0
    ckpt = Path(root) / "ckpt"
    s.save_checkpoint(ckpt)
    del it
    s, loader, ds = setup()
    s.resume(ckpt)  # every rank's file is in place once the resume has read them
    saved = torch.load(ckpt / f"rng_rank{rank}.pt", weights_only=True)["rank_state"]["data"][0]
    rest = [b[1].tolist() for b in loader] + [b[1].tolist() for e in range(1, EPOCHS) for b in loader]
    return {"same": first + rest == ref, "saved": saved, "read": ds.read.value}


@pytest.mark.slow
def test_each_rank_resumes_its_stream_from_the_state_in_its_own_file(tmp_path):
    from dist_support import run_ranks

    ranks = run_ranks(two_rank_worker, world_size=2, args=(str(tmp_path),), timeout_s=120)
    for rank, got in enumerate(ranks):
        assert got["same"], f"rank {rank}'s batches differ from its uninterrupted run"
        assert got["saved"] == {"taken": 2 * BATCH, "rank": rank}  # this rank's position, in this rank's file
        assert got["read"] == N // 2 * EPOCHS - 2 * BATCH  # nothing taken before the checkpoint read again
    # On one process the stream is shared out otherwise: the saved states are not used, the
    # open epoch is read again up to the place (batch 2), exact as for a stream without state.
    s = treadle.build_strategy("single", work_dir=tmp_path, seed=3)
    s.prepare(TinyNet(), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    ds = RankStream(0, 1)
    loader = s.prepare_dataloader(DataLoader(ds, batch_size=BATCH))
    s.resume(tmp_path / "ckpt")
    rest = [b[1].tolist() for b in loader]
    assert rest == [b[1].tolist() for b in DataLoader(RankStream(0, 1), batch_size=BATCH)][2:]
    assert ds.loaded is None and ds.read.value == N  # the whole epoch: its first 2 batches read again


class OddState(StatefulStream):
    def state_dict(self):
        return {"taken": self.taken, "at": object()}  # not plain data: weights_only could not read it back


def test_a_state_a_checkpoint_cannot_hold_is_left_out_with_one_warning_and_the_stream_read_again(tmp_path, caplog):
    def loader(read):
        return DataLoader(OddState(read), batch_size=BATCH)
    check_resume(tmp_path, loader, at=4, rereads=True)
    said = [r.getMessage() for r in caplog.records if "left out of checkpoints" in r.getMessage()]
    assert len(said) == 3  # once in each of the three runs, not at every save
    assert "the stream state of training loader 0['at'] is a object" in said[0]


def test_what_keeps_a_streams_position():
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    datasets = pytest.importorskip("datasets")
    read = Count()
    stateful, plain = StatefulStream(read), Stream(read)
    hf = datasets.Dataset.from_dict({"i": list(range(N))}).to_iterable_dataset(num_shards=3)
    buffered = hf.shuffle(seed=0, buffer_size=4)
    loader = sdl.StatefulDataLoader(plain, batch_size=BATCH)
    assert stream_owner(loader) is loader  # torchdata's loader: it keeps its workers' places
    assert stream_owner(DataLoader(stateful, batch_size=BATCH)) is stateful  # read in the main process
    assert stream_owner(DataLoader(hf, batch_size=BATCH)) is hf
    assert stream_owner(DataLoader(plain, batch_size=BATCH)) is None
    assert stream_owner(DataLoader(stateful, batch_size=BATCH, num_workers=2)) is None  # the workers' copies
    # A shuffle buffer is left out of Hugging Face's state: read again, with any loader.
    assert stream_owner(DataLoader(buffered, batch_size=BATCH)) is None
    assert stream_owner(sdl.StatefulDataLoader(buffered, batch_size=BATCH)) is None
    assert stream_owner(DataLoader(datasets.interleave_datasets([hf, buffered]), batch_size=BATCH)) is None
    # A map-style dataset skips in its sampler, reading nothing: no state needed.
    assert stream_owner(sdl.StatefulDataLoader(make_data(N), batch_size=BATCH)) is None
