"""EarlyStoppingHook: stops after `patience` validations without improvement, at
once on a non-finite value, and keeps its counters in its state."""

from __future__ import annotations

import math
import types
import warnings

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.state import TrainState

from support import TinyNet, make_data


def make_trainer(hook, lr=0.0, max_epochs=10, metrics=None):
    # 16 samples, batch 4: 4 iterations per epoch, a validation after each epoch.
    return treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=4),
                           val_dataloader=DataLoader(make_data(8, seed=1), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                           optimizer=dict(type="SGD", lr=lr), max_epochs=max_epochs, metrics=metrics, hooks=[hook])


def test_stops_after_patience_validations_without_improvement():
    hook = EarlyStoppingHook(monitor="val/loss", patience=2)
    t = make_trainer(hook)  # lr=0: the val loss never changes, so never improves
    t.fit()
    # best at epoch 1, no improvement at epochs 2 and 3 -> stop after epoch 3
    assert (t.state.epoch, t.state.iter) == (3, 12)
    assert t.state.should_stop and "val/loss did not improve" in t.state.stop_reason
    assert hook.wait == 2 and hook.best == pytest.approx(t.state.metrics["val/loss"]) and hook.best_iter == 4


def test_runs_to_the_end_when_patience_is_not_exhausted():
    t = make_trainer(EarlyStoppingHook(patience=5), max_epochs=3)
    t.fit()
    assert (t.state.epoch, t.state.iter) == (3, 12) and not t.state.should_stop


class NanAtCall:
    """A metric whose value is NaN at the chosen compute() call (1-based)."""

    def __init__(self, bad_call):
        self.bad_call, self.calls = bad_call, 0

    def update(self, outputs, targets):
        pass

    def reset(self):
        pass

    def compute(self):
        self.calls += 1
        return math.nan if self.calls == self.bad_call else 1.0 / self.calls


def test_non_finite_value_stops_at_once():
    hook = EarlyStoppingHook(monitor="val/score", rule="less", patience=100)
    t = make_trainer(hook, metrics={"score": NanAtCall(2)})
    t.fit()
    assert (t.state.epoch, t.state.iter) == (2, 8) and "val/score is nan" in t.state.stop_reason


def test_non_finite_value_ignored_when_asked():
    hook = EarlyStoppingHook(monitor="val/score", rule="less", patience=100, stop_on_nonfinite=False)
    t = make_trainer(hook, max_epochs=3, metrics={"score": NanAtCall(2)})
    t.fit()
    assert t.state.iter == 12 and not t.state.should_stop and hook.best == pytest.approx(1 / 3)


def test_missing_key_warns_once_or_raises_when_strict():
    # A loss the step might have given, but did not: told at the validations.
    t = make_trainer(EarlyStoppingHook(monitor="val/loss_nope", rule="less"), max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.fit()
    assert t.state.iter == 12
    assert len([w for w in caught if "val/loss_nope" in str(w.message)]) == 1
    t = make_trainer(EarlyStoppingHook(monitor="val/loss_nope", rule="less", strict=True), max_epochs=3)
    with pytest.raises(KeyError, match="val/loss_nope"):
        t.fit()


def test_a_key_validation_never_produces_is_refused_at_construction_strict_or_not():
    for strict in (False, True):
        with pytest.raises(ValueError, match=r"^EarlyStoppingHook monitor='val/nope': validation never produces "
                                             r"'val/nope': it can give val/acc, val/loss"):
            make_trainer(EarlyStoppingHook(monitor="val/nope", rule="less", strict=strict),
                         metrics={"acc": treadle.Accuracy()})


def fake_trainer():
    return types.SimpleNamespace(state=TrainState(), is_main=True)


def test_greater_rule_with_min_delta():
    hook = EarlyStoppingHook(monitor="val/acc", patience=3, min_delta=0.05)
    assert hook.rule == "greater" and EarlyStoppingHook("val/loss").rule == "less"
    t = fake_trainer()
    stops = []
    for v in (0.5, 0.6, 0.62, 0.7, 0.6, 0.74, 0.6):  # 0.62 and 0.74 are within min_delta
        hook.after_val_epoch(t, {"val/acc": v})
        stops.append(t.state.should_stop)
    assert hook.best == 0.7 and stops == [False] * 6 + [True]


def test_state_dict_round_trip():
    hook = EarlyStoppingHook(patience=3)
    t = fake_trainer()
    for v in (1.0, 0.5, 0.6):
        hook.after_val_epoch(t, {"val/loss": v})
    state = hook.state_dict()
    assert state == {"best": 0.5, "best_iter": 0, "wait": 1}
    other = EarlyStoppingHook(patience=3)
    other.load_state_dict(state)
    for v in (0.7, 0.8):
        other.after_val_epoch(t, {"val/loss": v})
    assert t.state.should_stop and other.wait == 3


@pytest.mark.parametrize("kw", [dict(rule="max"), dict(patience=0), dict(min_delta=-0.1), dict(monitor="")])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        EarlyStoppingHook(**kw)
