"""Hook priorities, ties, dispatch tables, and the order written to the log."""

from __future__ import annotations

import logging

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.base import (HOOK_POINTS, Hook, Priority, build_dispatch, check_hook_points, describe_order, get_priority,
                                implements)

from support import TinyNet, make_data


def test_priority_names_map_to_numbers():
    expected = {"HIGHEST": 0, "VERY_HIGH": 10, "HIGH": 30, "ABOVE_NORMAL": 40, "NORMAL": 50,
                "BELOW_NORMAL": 60, "LOW": 70, "VERY_LOW": 90, "LOWEST": 100}
    assert {p.name: int(p) for p in Priority} == expected
    assert get_priority("low") == 70 and get_priority(Priority.HIGH) == 30 and get_priority(5) == 5


@pytest.mark.parametrize("bad,err", [("MEDIUM", ValueError), (101, ValueError), (-1, ValueError), (1.5, TypeError),
                                     (True, TypeError)])
def test_bad_priorities_are_rejected(bad, err):
    with pytest.raises(err, match="priority"):
        get_priority(bad)


def make_hook(name, priority, log):
    class H(Hook):
        def before_train_iter(self, trainer, batch):
            log.append(name)

    H.__name__ = name
    h = H()
    h.priority = priority
    return h


def test_lower_priority_runs_first_and_ties_keep_registration_order():
    log = []
    hooks = [make_hook("a", "LOW", log), make_hook("b", 50, log), make_hook("c", "NORMAL", log),
             make_hook("d", "HIGHEST", log), make_hook("e", 100, log), make_hook("f", 50, log)]
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(4), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_iters=1, hooks=hooks)
    t.fit()
    assert log == ["d", "b", "c", "f", "a", "e"]


def test_dispatch_only_lists_hooks_that_override_a_point():
    class OnlyEpoch(Hook):
        def after_train_epoch(self, trainer):
            pass

    h = OnlyEpoch()
    table = build_dispatch([h])
    assert set(table) == set(HOOK_POINTS)
    assert table["after_train_epoch"] == (h.after_train_epoch,)
    assert all(table[p] == () for p in HOOK_POINTS if p != "after_train_epoch")
    assert implements(h, "after_train_epoch") and not implements(h, "after_train_iter")


def test_resolved_order_is_logged_at_start(caplog, tmp_path):
    class Mine(Hook):
        priority = "VERY_HIGH"

        def after_train_iter(self, trainer, batch, outputs):
            pass

    t = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(4), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=1, hooks=[Mine()])
    with caplog.at_level(logging.INFO, logger="treadle"):
        t.fit()
    # the default CheckpointHook saves only at the end: it is not called per iteration; the
    # loop records the times itself, and calls the guard and the logger only when they are due
    assert ("after_train_iter         Mine(10) -> NaNGuardHook(30, when due) -> LoggerHook(60, when due)\n"
            in caplog.text)
    assert "Mine(10) -> NaNGuardHook(30, when due) -> LoggerHook(60, when due)" in (tmp_path / "log.txt").read_text()
    assert describe_order([]) == "hook order:\n  (no hooks)"


def test_user_hook_of_default_class_replaces_the_default():
    from treadle.hooks.logger import LoggerHook

    mine = LoggerHook(interval=7)
    t = treadle.Trainer(TinyNet(), hooks=[mine])
    loggers = [h for h in t.hooks if isinstance(h, LoggerHook)]
    assert loggers == [mine]


def test_hook_state_defaults_and_round_trip():
    class Counter(Hook):
        def __init__(self):
            self.n = 0

        def after_train_iter(self, trainer, batch, outputs):
            self.n += 1

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    assert Hook().state_dict() == {}
    c = Counter()
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_iters=3, hooks=[c])
    t.fit()
    c2 = Counter()
    c2.load_state_dict(c.state_dict())
    assert c2.n == 3


def test_disabled_points_are_not_dispatched():
    from treadle.hooks.checkpoint import CheckpointHook

    by_epoch = CheckpointHook(by_epoch=True)
    by_iter = CheckpointHook(by_epoch=False, interval=5, best="val/acc")
    table = build_dispatch([by_epoch, by_iter])
    assert table["after_train_iter"] == (by_iter.after_train_iter,)
    assert table["before_save_checkpoint"] == ()  # only asynchronous saves wait there
    assert not implements(by_epoch, "after_train_iter") and implements(by_epoch, "after_train_epoch")


def _trainer(**kw):
    return treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(4), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=0.1), max_iters=1, progress=False, **kw)


@pytest.mark.parametrize("name,closest", [("after_train_iteration", "after_train_iter"),
                                          ("after_val_epochs", "after_val_epoch"),
                                          ("before_epoch", "before_val_epoch"),
                                          ("before_training", "before_train")])
def test_a_method_named_like_a_hook_point_that_is_not_one_is_refused(name, closest, tmp_path):
    Typo = type("Typo", (Hook,), {name: lambda self, trainer, *args: None})
    with pytest.raises(ValueError, match=rf"hooks\[0\] \(Typo\): method '{name}' looks like a hook point but is not "
                                         rf"one, so it would never be called; did you mean '{closest}'\?"):
        _trainer(hooks=[Typo()], work_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    t = _trainer()
    with pytest.raises(ValueError, match=rf"register_hook\(hook\) \(Typo\): method '{name}'"):
        t.register_hook(Typo())
    assert not any(isinstance(h, Typo) for h in t.hooks)


def test_a_typo_in_a_base_class_is_found_too():
    class Base(Hook):
        def after_train_iteration(self, trainer, batch, outputs):
            pass

    class Child(Base):
        def after_train_iter(self, trainer, batch, outputs):
            pass

    with pytest.raises(ValueError, match=r"method 'after_train_iteration'"):
        check_hook_points(Child())


def test_helper_methods_and_attributes_are_not_taken_for_hook_points():
    class Fine(Hook):
        after_run_timeout = 5.0  # not a method

        def _after_train_iter_impl(self):  # private
            pass

        def afterwards(self):  # no before_/after_ prefix
            pass

        def summarize(self, trainer):
            pass

        def after_train_iter(self, trainer, *args):  # takes any arguments
            pass

        def after_val(self, trainer, metrics=None, extra=0):
            pass

    check_hook_points(Fine())
    _trainer(hooks=[Fine()]).fit()


def test_a_hook_point_that_cannot_take_its_arguments_is_refused():
    class WrongArity(Hook):
        def after_train_iter(self, trainer):
            pass

    with pytest.raises(TypeError, match=r"hooks\[0\] \(WrongArity\): after_train_iter\(trainer\) cannot take the hook "
                                        r"point's arguments; expected after_train_iter\(self, trainer, batch, outputs\)"):
        _trainer(hooks=[WrongArity()])
