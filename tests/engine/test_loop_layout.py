"""A train loop's place saved under one layout of the processes (processes, data shards,
tensor-parallel ranks per shard) and resumed under another: the samples taken are kept,
counted in this layout's batches; the per-rank RNG streams are restored only when the
layout is the same (other cases say so in one warning)."""

from __future__ import annotations

import logging

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, TinyNet, make_data


def _loop(world: int, data: int, tp: int):
    trainer = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(64), batch_size=4),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=2,
                              log_writers=(), progress=False, strategy=ON_CPU)
    loop = trainer.train_loop
    loop.world_size, loop.data_world, loop.tp = world, data, tp  # as a strategy on that layout sets them
    return loop


def _saved(world: int, data: int | None, tp: int | None, batch_idx: int = 6) -> dict:
    pos = {**_loop(1, 1, 1).state_dict(), "epoch": 0, "iter": batch_idx, "inner_iter": batch_idx,
           "batch_idx": batch_idx, "open": True, "batch_size": 4, "world_size": world}
    for key, value in (("data_world", data), ("tp", tp)):
        if value is None:
            pos.pop(key)  # a checkpoint from before tensor parallelism
        else:
            pos[key] = value
    return pos


@pytest.mark.parametrize("saved, now, batch_idx, rng", [
    ((4, 4, 1), (4, 4, 1), 6, True),      # the same layout: exact
    ((4, 2, 2), (4, 2, 2), 6, True),      # 2 shards x tp 2, the same
    ((4, 4, 1), (4, 2, 2), 12, False),    # 4 shards -> 2 shards of tp 2: twice the batches each, fresh streams
    ((4, 2, 2), (4, 4, 1), 3, False),     # and back
    ((4, 2, 2), (2, 2, 1), 6, True),      # 2 shards either way: the order goes on (fewer processes keep rank r's streams)
    ((4, None, None), (4, 4, 1), 6, True),  # an older checkpoint: one shard per process
])
def test_a_place_saved_on_one_layout_resumes_on_another(saved, now, batch_idx, rng, caplog):
    loop = _loop(*now)
    with caplog.at_level(logging.WARNING, logger="treadle"):
        loop.load_state_dict(_saved(*saved))
    loop.resume_rng({"torch": "a rank's streams"})
    assert loop.resume_pos["batch_idx"] == batch_idx
    assert (loop.resume_pos["rng"] is not None) == rng
    warned = [r.getMessage() for r in caplog.records if "resuming a run saved" in r.getMessage()]
    assert bool(warned) == (tuple(x or y for x, y in zip(saved, (0, saved[0], 1))) != now)
    if saved[0] == now[0] and warned:
        assert f"{saved[1]} data shard(s) x tp {saved[2]} on {now[1]} x tp {now[2]}" in warned[0]


def test_the_place_records_the_layout():
    pos = _loop(4, 2, 2).state_dict()
    assert (pos["world_size"], pos["data_world"], pos["tp"]) == (4, 2, 2)


def test_a_layout_warning_is_said_once_for_the_job_by_rank_0(monkeypatch, caplog):
    """Every rank resumes alike onto another layout: only rank 0 says it (each rank said it
    before: the reshard warning twice under --nproc 2)."""
    from treadle.distributed import voice

    loop, saved = _loop(2, 2, 1), _saved(1, 1, 1)
    for rank, said in ((1, 0), (0, 1)):
        class Job:  # torch.distributed in a group of 2, as this rank sees it
            @staticmethod
            def get_rank(rank: int = rank) -> int:
                return rank
        monkeypatch.setattr(voice, "_process_group", lambda job=Job: job)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="treadle"):
            loop.load_state_dict(saved)
        assert len([r for r in caplog.records if "resuming a run saved by 1 process(es) on 2" in r.getMessage()]) \
            == said, (rank, caplog.records)


@pytest.mark.parametrize("saved_batch, batch, max_epochs", [(8, 4, 3), (4, 8, 2), (4, 4, 2)])
def test_an_iteration_run_resumed_at_another_epoch_length_counts_its_epochs_in_this_one(tmp_path, saved_batch, batch,
                                                                                        max_epochs):
    """Saved at iteration 9 with 32 samples per epoch, resumed to 12 iterations at another
    batch size (another epoch length; as with another number of processes): the epochs are
    those done, the open one and what the iterations left take (it read "epoch 3/2")."""
    def trainer(size: int, iters: int, resume: bool) -> treadle.Trainer:
        return treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(32), batch_size=size),
                               loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=iters,
                               log_writers=(), progress=False, strategy=ON_CPU, resume=resume, seed=0,
                               checkpoint=dict(interval=9, by_epoch=False))
    trainer(saved_batch, 9, False).fit()
    resumed = trainer(batch, 12, True)
    resumed.fit()
    assert resumed.state.epoch <= resumed.state.max_epochs == max_epochs
