"""The order of hook calls and the loop semantics (epochs, iterations, workflows)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.base import HOOK_POINTS

from support import TinyNet, make_data


class Recorder(treadle.Hook):
    """Records every hook point with the counters at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []


def _record(point):
    def fn(self, trainer, *args):
        s = trainer.state
        self.calls.append((point, s.epoch, s.iter, s.inner_iter))
    return fn


for _p in HOOK_POINTS:
    setattr(Recorder, _p, _record(_p))


def trainer_for(hooks=(), **kw):
    torch.manual_seed(0)
    defaults = dict(train_dataloader=DataLoader(make_data(16), batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                    optimizer=dict(type="SGD", lr=0.1), log_interval=100)
    defaults.update(kw)
    return treadle.Trainer(TinyNet(), hooks=list(hooks), **defaults)


def test_exact_hook_sequence_two_epochs_with_validation():
    rec = Recorder()
    t = trainer_for([rec], max_epochs=2, val_dataloader=DataLoader(make_data(8, seed=1), batch_size=8))
    t.fit()
    points = [c[0] for c in rec.calls if c[0] not in ("before_save_checkpoint", "after_load_checkpoint")]
    it = ["before_train_iter", "after_backward", "before_optimizer_step", "after_train_iter"]
    val = ["before_val", "before_val_epoch", "before_val_iter", "after_val_iter", "after_val_epoch", "after_val"]
    epoch = ["before_train_epoch", *it, *it, "after_train_epoch", *val]
    assert points == ["before_run", "before_train", *epoch, *epoch, "after_train", "after_run"]
    # counters seen by the hooks: (point, epoch, iter, inner_iter)
    iters = [c for c in rec.calls if c[0] == "after_train_iter"]
    assert iters == [("after_train_iter", 0, 0, 0), ("after_train_iter", 0, 1, 1),
                     ("after_train_iter", 1, 2, 0), ("after_train_iter", 1, 3, 1)]
    epochs = [c[:3] for c in rec.calls if c[0] in ("before_train_epoch", "after_train_epoch", "after_val")]
    assert epochs == [("before_train_epoch", 0, 0), ("after_train_epoch", 0, 2), ("after_val", 1, 2),
                      ("before_train_epoch", 1, 2), ("after_train_epoch", 1, 4), ("after_val", 2, 4)]
    assert (t.state.epoch, t.state.iter, t.state.max_iters) == (2, 4, 4)


def test_validate_and_test_hook_sequences():
    rec = Recorder()
    loader = DataLoader(make_data(8, seed=1), batch_size=4)
    t = trainer_for([rec], max_epochs=1, val_dataloader=loader, test_dataloader=loader)
    t.validate()
    t.test()
    points = [c[0] for c in rec.calls]

    def one(m):
        return ([f"before_{m}", f"before_{m}_epoch"] + [f"before_{m}_iter", f"after_{m}_iter"] * 2
                + [f"after_{m}_epoch", f"after_{m}"])
    assert points == ["before_run", *one("val"), "after_run", "before_run", *one("test"), "after_run"]


def test_iteration_based_run_crosses_epoch_boundaries():
    rec = Recorder()
    t = trainer_for([rec], max_iters=5)  # 2 batches per epoch
    t.fit()
    s = t.state
    assert (s.iter, s.epoch, s.max_epochs, s.by_epoch) == (5, 2, 3, False)
    seq = [c[:3] for c in rec.calls if c[0] in ("before_train_epoch", "after_train_epoch")]
    # epochs 0 and 1 complete; epoch 2 is open when max_iters is reached and still gets its after_train_epoch
    assert seq == [("before_train_epoch", 0, 0), ("after_train_epoch", 0, 2), ("before_train_epoch", 1, 2),
                   ("after_train_epoch", 1, 4), ("before_train_epoch", 2, 4), ("after_train_epoch", 2, 5)]
    inner = [c[3] for c in rec.calls if c[0] == "after_train_iter"]
    assert inner == [0, 1, 0, 1, 0]


def test_where_is_fraction_of_training_done():
    seen = []

    class Where(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            seen.append(trainer.state.where)

    t = trainer_for([Where()], max_epochs=2)
    t.fit()
    assert seen == [0 / 4, 1 / 4, 2 / 4, 3 / 4]
    assert t.state.where == 1.0


class PhaseLog(treadle.Hook):
    def __init__(self):
        self.events = []

    def after_train_iter(self, trainer, batch, outputs):
        self.events.append(("train", trainer.state.iter))

    def after_train_epoch(self, trainer):
        self.events.append(("epoch_end", trainer.state.epoch))

    def after_val_iter(self, trainer, batch, outputs):
        self.events.append(("val_batch", int(batch[1][0])))

    def after_val(self, trainer, metrics):
        self.events.append(("val",))


def test_epoch_workflow_train2_val1():
    log = PhaseLog()
    val = DataLoader(make_data(4, seed=1), batch_size=4)
    t = trainer_for([log], max_epochs=3, val_dataloader=val, workflow=[("train", 2), ("val", 1)])
    t.fit()
    compact = [e for e in log.events if e[0] in ("epoch_end", "val")]
    # mmcv: train 2 epochs, validate once, repeat until max_epochs (the val phase still runs after the last)
    assert compact == [("epoch_end", 0), ("epoch_end", 1), ("val",), ("epoch_end", 2), ("val",)]


def test_iteration_workflow_counts_iterations_and_val_continues():
    log = PhaseLog()
    val_data = make_data(3, seed=1)
    val_data.tensors = (val_data.tensors[0], torch.arange(3))  # val batch i has label i
    val = DataLoader(val_data, batch_size=1)
    t = trainer_for([log], max_iters=7, val_dataloader=val, workflow=[("train", 3), ("val", 2)])
    t.fit()
    assert [e for e in log.events if e[0] != "epoch_end"] == [
        ("train", 0), ("train", 1), ("train", 2), ("val_batch", 0), ("val_batch", 1), ("val",),
        ("train", 3), ("train", 4), ("train", 5), ("val_batch", 2), ("val_batch", 0), ("val",),
        ("train", 6), ("val_batch", 1), ("val_batch", 2), ("val",),
    ]


@pytest.mark.parametrize("by_epoch,limit,interval,expected", [
    (True, 5, 2, [2, 4, 5]),       # epochs after which validation runs
    (False, 10, 4, [4, 8, 10]),    # iterations after which validation runs
])
def test_val_interval_and_final_validation(by_epoch, limit, interval, expected):
    when = []

    class W(treadle.Hook):
        def after_val(self, trainer, metrics):
            when.append(trainer.state.epoch if by_epoch else trainer.state.iter)

    kw = {"max_epochs": limit} if by_epoch else {"max_iters": limit}
    t = trainer_for([W()], val_dataloader=DataLoader(make_data(4, seed=1), batch_size=4), val_interval=interval, **kw)
    t.fit()
    assert when == expected


def test_a_hook_can_stop_training_cleanly():
    rec = Recorder()

    class Stopper(treadle.Hook):
        def after_train_iter(self, trainer, batch, outputs):
            if trainer.state.iter == 2:
                trainer.state.request_stop("enough")

    t = trainer_for([rec, Stopper()], max_epochs=10)
    t.fit()
    assert t.state.iter == 3 and t.state.stop_reason == "enough"
    points = [c[0] for c in rec.calls]
    assert points[-3:] == ["after_train_epoch", "after_train", "after_run"]
    assert points.count("before_train_epoch") == points.count("after_train_epoch") == 2
    assert t.state.epoch == 1  # the interrupted second epoch is not counted as done


def test_empty_training_loader_is_an_error():
    t = treadle.Trainer(TinyNet(), train_dataloader=[], loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1)
    with pytest.raises(RuntimeError, match="no batches"):
        t.fit()


class EveryThird(treadle.Hook):
    """A hook that names its iterations: 2, 5, 8, ... (every third)."""

    priority = 40

    def __init__(self, log):
        self.log = log

    def next_train_iter(self, state):
        return state.iter + (-(state.iter + 1)) % 3

    def after_train_iter(self, trainer, batch, outputs):
        # called at its iterations, and at any other hook's (the logger's): it checks
        self.log.append(("third", trainer.state.iter))


class EveryIter(treadle.Hook):
    def __init__(self, log, priority):
        self.log, self.priority = log, priority

    def after_train_iter(self, trainer, batch, outputs):
        self.log.append((f"every{self.priority}", trainer.state.iter))


def test_a_hook_that_names_its_iterations_is_called_only_there_and_in_order():
    log = []
    t = trainer_for([EveryIter(log, 30), EveryThird(log), EveryIter(log, 50)],
                    train_dataloader=DataLoader(make_data(40), batch_size=8), max_epochs=2)  # 5 batches an epoch
    t.fit()
    thirds = [i for name, i in log if name == "third"]
    # its own iterations (asked again when the second epoch opens: it counts the run's), and
    # the default logger's (each epoch's last, 4 and 9: the interval is longer than an epoch)
    assert thirds == [2, 4, 5, 8, 9]
    assert [i for name, i in log if name == "every30"] == list(range(10))
    assert [i for name, i in log if name == "every50"] == list(range(10))
    # where it is called, it runs at its priority between the others
    at_5 = [name for name, i in log if i == 5]
    assert at_5 == ["every30", "third", "every50"]


def test_the_default_hooks_are_not_called_between_their_iterations(monkeypatch):
    from treadle.hooks.logger import LoggerHook
    from treadle.hooks.nan_guard import NaNGuardHook

    calls = []
    for cls in (LoggerHook, NaNGuardHook):
        orig = cls.after_train_iter
        monkeypatch.setattr(cls, "after_train_iter",
                            lambda self, t, b, o, orig=orig, cls=cls: (calls.append((cls.__name__, t.state.iter)),
                                                                        orig(self, t, b, o))[1])
    t = trainer_for(train_dataloader=DataLoader(make_data(80), batch_size=8), max_epochs=2, log_interval=4)
    t.fit()
    # 10 batches an epoch, interval 4: records at the 4th and 8th iteration of each epoch
    # (the 2 left at its end join the next epoch's first: MMEngine's ignore_last) and at the
    # run's last; the guard (the logger's interval: it checks the means the logger reads)
    # is called there only
    due = [3, 7, 13, 17, 19]
    assert [i for name, i in calls if name == "LoggerHook"] == due
    assert [i for name, i in calls if name == "NaNGuardHook"] == due
