"""NaNGuardHook: raise mode names the first bad iteration and its losses; skip mode
leaves the weights untouched for the bad step and training goes on."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.nan_guard import NaNGuardHook
from treadle.logging import read_jsonl

from support import count_host_reads, TinyNet, make_data


class NanLossAt:
    """A loss dict that is NaN at the chosen (0-based) training iterations."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad
        self.calls = 0

    def __call__(self, outputs, targets):
        i, self.calls = self.calls, self.calls + 1
        loss = F.cross_entropy(outputs, targets)
        if i in self.bad:
            loss = loss * float("nan")
        # On the outputs' device, as a model's losses are: one device, so the guard's checks
        # take their one-transfer fast path (a CPU constant beside CUDA losses would not).
        return {"loss_cls": loss, "loss_aux": torch.tensor(0.25, device=outputs.device)}


def batches(n=32):
    # A list, not a DataLoader: a DataLoader draws a CPU seed (.item()) every epoch.
    return list(DataLoader(make_data(n), batch_size=4))


def trainer(hook, bad, tmp_path=None, **kw):
    kw.setdefault("optimizer", dict(type="SGD", lr=0.1))
    return treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=batches(), loss_fn=NanLossAt(bad),
                           max_epochs=2, hooks=[hook] if hook else [], **kw)


def test_raise_mode_names_iteration_and_every_loss_value():
    t = trainer(NaNGuardHook(), bad={5})
    with pytest.raises(FloatingPointError) as info:
        t.fit()
    msg = str(info.value)
    assert "iteration=6" in msg and "'loss_cls': nan" in msg and "'loss_aux': 0.25" in msg and "'loss': nan" in msg
    assert t.state.iter == 5  # raised during the bad iteration itself (check_interval=1)


def test_raise_mode_with_interval_reports_first_bad_iteration_later():
    t = trainer(NaNGuardHook(check_interval=4), bad={5, 6})
    with pytest.raises(FloatingPointError, match=r"iteration=6 .*after iteration 8") as info:
        t.fit()
    assert "'loss_aux': 0.25" in str(info.value)
    assert t.state.iter == 7  # the window 4..7 was checked after its last iteration


def test_raise_mode_checks_the_last_partial_window_at_the_end():
    t = trainer(NaNGuardHook(check_interval=100), bad={15})  # 16 iterations: no full window
    with pytest.raises(FloatingPointError, match="iteration=16"):
        t.fit()


def test_interval_check_is_sync_free_between_checks(monkeypatch, as_device):
    t = trainer(NaNGuardHook(check_interval=4), bad=set(), log_interval=100)
    calls = count_host_reads(monkeypatch)
    t.fit()
    # 16 iterations in 2 epochs: 4 checks (one .item() each on the fast path) + the logger's flush at each epoch's
    # end (an epoch shorter than the log interval still gets its record, as in MMEngine).
    assert calls == {"item": 4, "tolist": 2}


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", [dict(type="SGD", lr=0.1, momentum=0.9, weight_decay=1e-2),
                                       dict(type="Adam", lr=1e-2, weight_decay=1e-2)])
def test_skip_mode_leaves_weights_unchanged_for_the_bad_step(tmp_path, optimizer):
    changed = {}

    class Watch(treadle.Hook):
        def before_train_iter(self, trainer, batch):
            self.before = snapshot(trainer.module)

        def after_train_iter(self, trainer, batch, outputs):
            after = snapshot(trainer.module)
            changed[trainer.state.iter] = any(not torch.equal(a, b) for a, b in zip(self.before, after))

    guard = NaNGuardHook(mode="skip")
    t = trainer(guard, bad={2, 9}, tmp_path=tmp_path, optimizer=optimizer, log_interval=4)
    t.register_hook(Watch())
    t.fit()
    assert t.state.iter == 16 and guard.skipped == 2
    assert [i for i, c in changed.items() if not c] == [2, 9]  # only the bad steps were skipped
    assert all(torch.isfinite(p).all() for p in t.module.parameters())
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [(r["iter"], r["nan_skipped"]) for r in train] == [(4, 1.0), (8, 1.0), (12, 2.0), (16, 2.0)]
    assert guard.state_dict() == {"skipped": 2}


def test_without_the_guard_the_same_run_is_ruined():
    t = trainer(None, bad={2}, optimizer=dict(type="SGD", lr=0.1, momentum=0.9), nan_guard=False)
    t.fit()
    assert not all(torch.isfinite(p).all() for p in t.module.parameters())


def test_skip_mode_inf_norm_catches_nan_and_inf_without_overflow():
    from treadle.hooks.nan_guard import _all_finite

    big = torch.full((4,), 3e38)  # its 2-norm overflows; still finite
    assert _all_finite([big, torch.ones(3)])
    assert not _all_finite([torch.tensor([1.0, math.nan]), torch.ones(3)])
    assert not _all_finite([torch.ones(3), torch.tensor([-math.inf])])


@pytest.mark.parametrize("kw", [dict(mode="ignore"), dict(check_interval=0), dict(check_interval=True)])
def test_bad_arguments(kw):
    with pytest.raises(ValueError):
        NaNGuardHook(**kw)


def test_trainer_default_guard_raises_at_the_log_interval_without_per_step_sync():
    """By default the Trainer raises, checking at the log interval (no sync per step)."""
    t = trainer(None, bad={2}, log_interval=4)
    with pytest.raises(FloatingPointError, match=r"iteration=3 \(epoch 1\) \(found at the check after iteration 4\)"):
        t.fit()


def test_default_guard_shares_the_loggers_read(monkeypatch, as_device):
    """check_interval == log interval: the guard reads nothing itself; the logger's
    flush (one transfer per interval) is the only host read."""
    t = trainer(None, bad=set(), log_interval=4)
    calls = count_host_reads(monkeypatch)
    t.fit()
    assert calls == {"item": 0, "tolist": 4}  # 16 iterations, a record every 4


def test_shared_check_writes_the_record_then_names_the_first_bad_iteration(tmp_path):
    t = trainer(None, bad={5, 6}, tmp_path=tmp_path, log_interval=4)
    with pytest.raises(FloatingPointError, match=r"iteration=6 \(epoch 1\) \(found at the check after iteration 8\)") as info:
        t.fit()
    assert "'loss_aux': 0.25" in str(info.value) and t.state.iter == 7
    train = [r for r in read_jsonl(tmp_path / "log.jsonl") if r["mode"] == "train"]
    assert [r["iter"] for r in train] == [4, 8] and train[-1]["loss"] == "nan"  # the log shows the NaN window


def test_shared_check_raises_when_only_the_mean_over_ranks_is_nonfinite():
    """Another rank's NaN reaches this rank only through the reduced means: raise alike."""
    t = trainer(None, bad=set(), log_interval=4)

    def reduce(values):
        return {**values, "loss": math.nan} if t.state.iter >= 7 else values
    t.strategy.reduce_log_values = reduce
    with pytest.raises(FloatingPointError, match=r"between iterations 5 and 8 .*'loss': nan.*another process"):
        t.fit()


def test_guard_after_the_logger_keeps_its_own_checks(monkeypatch, as_device):
    """A guard ordered after the logger cannot use the logger's flush (it would miss the
    logged iteration's values): it reads its window itself."""
    guard = NaNGuardHook(check_interval=4)
    guard.priority = "LOWEST"
    t = trainer(guard, bad={5}, log_interval=4)
    with pytest.raises(FloatingPointError, match="iteration=6"):
        t.fit()
    late = NaNGuardHook(check_interval=4)
    late.priority = "LOWEST"
    t2 = trainer(late, bad=set(), log_interval=4)
    calls = count_host_reads(monkeypatch)
    t2.fit()
    assert calls == {"item": 4, "tolist": 4}  # 16 iterations: its 4 checks, the logger's 4 records


def test_raise_mode_is_not_called_before_optimizer_steps():
    t = trainer(None, bad=set(), log_interval=4)
    assert t._dispatch.table["before_optimizer_step"] == ()
    t = trainer(None, bad=set(), nan_guard="skip")
    assert len(t._dispatch.table["before_optimizer_step"]) == 1


def test_no_checkpoint_is_written_after_a_nonfinite_loss(tmp_path):
    from treadle.checkpoint.io import list_checkpoints

    # The default guard checks every log_interval (20 here) and at epoch ends, but the
    # iteration checkpoint at 10 comes first: the save checks the window and fails before writing.
    t = trainer(None, bad={9}, tmp_path=tmp_path, log_interval=20, checkpoint=dict(interval=5, by_epoch=False))
    with pytest.raises(FloatingPointError, match="iteration=10"):
        t.fit()  # epochs of 8 iterations: the epoch-end check would come at 16, after the save at 10
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["iter_00000005"]
