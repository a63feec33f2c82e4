"""What a user reaches for in the first hour: fast_dev_run, limit_*_batches, and the model
summary at start."""

from __future__ import annotations

import copy
import re
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data


def _loaders(n=64, batch=8):
    data = make_data(n)
    return dict(train_dataloader=DataLoader(data, batch_size=batch, shuffle=True),
                val_dataloader=DataLoader(data, batch_size=batch), test_dataloader=DataLoader(data, batch_size=batch))


class Counting(treadle.Hook):
    def __init__(self):
        self.batches = {"train": 0, "val": 0, "test": 0}

    def after_train_iter(self, trainer, batch, outputs):
        self.batches["train"] += 1

    def after_val_iter(self, trainer, batch, outputs):
        self.batches["val"] += 1

    def after_test_iter(self, trainer, batch, outputs):
        self.batches["test"] += 1


@pytest.mark.parametrize("fast,n", [(True, 1), (3, 3)])
def test_fast_dev_run_runs_a_few_batches_of_everything_and_writes_nothing(tmp_path, caplog, fast, n):
    count = Counting()
    work = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="treadle"):
        t = treadle.Trainer(TinyNet(), work_dir=work, loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1),
                            max_epochs=20, checkpoint=dict(interval=1), hooks=[count], fast_dev_run=fast,
                            progress=False, **_loaders())
        t.fit()
        t.test()
    assert count.batches == {"train": n, "val": n, "test": n}
    assert t.state.iter == n and t.state.epoch == 1
    assert not work.exists()  # no log, no checkpoint, no env.txt
    assert f"fast_dev_run: 1 epoch of {n} batch(es)" in caplog.text


def test_fast_dev_run_is_checked():
    with pytest.raises(ValueError, match=r"fast_dev_run: out of range \(got 0\); expected true, false or an int >= 1"):
        treadle.Trainer(TinyNet(), fast_dev_run=0)
    with pytest.raises(TypeError, match="fast_dev_run: wrong type str"):
        treadle.Trainer(TinyNet(), fast_dev_run="yes")


def test_limit_train_batches_ends_each_epoch_early_with_the_full_runs_order():
    """The batches taken are the first ones of the full epoch's shuffled order: weights equal
    a hand loop over those batches, epoch after epoch."""
    torch.manual_seed(0)
    model = TinyNet()
    reference = copy.deepcopy(model)
    count = Counting()
    loaders = _loaders()
    t = treadle.Trainer(model, loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=3,
                        limit_train_batches=3, limit_val_batches=2, hooks=[count], seed=0, strategy="single",
                        progress=False, **loaders)
    t.fit()
    assert count.batches == {"train": 9, "val": 6, "test": 0}  # 3 epochs x 3; validation each epoch, 2 batches
    assert t.state.iter == 9 and t.state.epoch == 3 and t.state.max_iters == 9
    # the same run without the limit takes the same first 3 batches of each epoch
    full = treadle.Trainer(copy.deepcopy(reference), loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=0.1), max_epochs=1, seed=0, strategy="single",
                           progress=False, train_dataloader=loaders["train_dataloader"])
    seen_full, seen_limited = [], []
    for trainer, sink in ((full, seen_full), (t, seen_limited)):
        f = trainer.train_loop.feed
        f.start_epoch(1)
        sink.extend(x.sum().item() for x, _ in f)
    assert seen_limited == seen_full[:3] and len(seen_full) == 8


def test_the_model_summary_is_printed_at_the_first_run(tmp_path, caplog):
    t = treadle.Trainer(TinyNet(), work_dir=tmp_path / "run", loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, progress=False, log_writers=[],
                        train_dataloader=DataLoader(make_data(16), batch_size=8))
    with caplog.at_level(logging.INFO, logger="treadle"):
        t.fit()
        t.validate() if t.val_loop is not None else t.fit()
    params = sum(p.numel() for p in TinyNet().parameters())
    line = f"model: TinyNet: {params:,} parameters ({params:,} trainable, 0 frozen), 0.00 MiB"
    console = [r for r in caplog.records if r.getMessage() == line]
    assert len(console) == 1 and getattr(console[0], "treadle_console_only", False)  # once, on the console
    log = (tmp_path / "run" / "log.txt").read_text()
    assert re.search(r"^fc1 +Linear +", log, re.M) and line.removeprefix("model: ") in log  # the table, in log.txt
