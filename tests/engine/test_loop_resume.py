"""Resuming at the exact workflow position: a validation due right after the
checkpoint, a stop inside an epoch, a preemption in the very last iteration. Each run
is compared with the same run uninterrupted (weights, learning rate, validations)."""

from __future__ import annotations

import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.seeding import seed_everything

from faults import Crash, CrashAt, SignalAt, StopAt
from support import TinyNet, make_data


#: At iteration ``at``: raise (after the checkpoint hook saved), send SIGUSR1, or request a stop.
AT = {"crash": CrashAt, "signal": lambda at: SignalAt(at, signal.SIGUSR1), "stop": StopAt}


class Vals(treadle.Hook):
    def __init__(self) -> None:
        self.at: list[int] = []

    def after_val(self, trainer, metrics):
        self.at.append(trainer.state.iter)


def _trainer(work_dir, hooks=(), resume=False, val=True, **kw):
    seed_everything(0)
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(30), batch_size=6, shuffle=True),
                loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="AdamW", lr=3e-3), max_epochs=3, seed=0,
                log_writers=(), progress=False, resume=resume, hooks=list(hooks))
    if val:  # the plateau scheduler reacts to every validation: a skipped one changes the lr
        args.update(val_dataloader=DataLoader(make_data(12, seed=1), batch_size=6),
                    schedulers=[dict(type="ReduceOnPlateauLR", monitor="loss", rule="greater", factor=0.5, patience=0)])
    args.update(kw)
    return treadle.Trainer(TinyNet(dropout=0.2), **args)


def _assert_same(a, b):
    for (name, p), q in zip(a.module.state_dict().items(), b.module.state_dict().values()):
        assert torch.equal(p, q), name
    assert a.optimizer.param_groups[0]["lr"] == b.optimizer.param_groups[0]["lr"]
    assert (a.state.epoch, a.state.iter) == (b.state.epoch, b.state.iter)


def _interrupt(work_dir, at, how, **kw):
    try:
        _trainer(work_dir, hooks=[AT[how](at)], **kw).fit()
    except (Crash, SystemExit):
        pass


@pytest.mark.parametrize("kw", [dict(checkpoint=dict(interval=1)),  # epochs of 5 iterations
                                dict(max_epochs=None, max_iters=15, val_interval=5,
                                     checkpoint=dict(interval=5, by_epoch=False))])
def test_the_validation_due_after_the_checkpoint_runs_after_resuming(tmp_path, kw):
    ref_vals, vals = Vals(), Vals()
    ref = _trainer(tmp_path / "ref", hooks=[ref_vals], **kw)
    ref.fit()
    _interrupt(tmp_path / "run", 8, "crash", **kw)  # saved at 5 (before its validation), lost at 8
    resumed = _trainer(tmp_path / "run", hooks=[vals], resume=True, **kw)
    resumed.fit()
    assert ref_vals.at == [5, 10, 15] and vals.at == [5, 10, 15]  # the one at 5 ran again, once
    _assert_same(resumed, ref)


@pytest.mark.parametrize("kw", [dict(checkpoint=dict(interval=1)), dict(max_epochs=None, max_iters=15)])
def test_a_stop_inside_an_epoch_resumes_inside_it(tmp_path, kw):
    ref = _trainer(tmp_path / "ref", val=False, **kw)
    ref.fit()
    _interrupt(tmp_path / "run", 8, "stop", val=False, **kw)
    # The stop's save records the open epoch (as an iteration checkpoint), not a finished one.
    assert "iter_00000008" in [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    resumed = _trainer(tmp_path / "run", resume=True, val=False, **kw)
    resumed.fit()
    _assert_same(resumed, ref)


@pytest.mark.parametrize("kw", [dict(), dict(max_epochs=None, max_iters=15, val_interval=5)])
def test_a_preemption_in_the_last_iteration_still_closes_and_validates(tmp_path, kw):
    ref_vals, vals = Vals(), Vals()
    ref = _trainer(tmp_path / "ref", hooks=[ref_vals], **kw)
    ref.fit()
    _interrupt(tmp_path / "run", 15, "signal", **kw)
    resumed = _trainer(tmp_path / "run", hooks=[vals], resume=True, **kw)
    resumed.fit()
    assert vals.at == [15] and ref_vals.at[-1] == 15  # the final validation ran after the resume
    _assert_same(resumed, ref)


def test_resuming_a_finished_run_with_validation_does_nothing(tmp_path, caplog):
    _trainer(tmp_path, checkpoint=dict(interval=1)).fit()  # the last periodic save precedes the final validation
    vals = Vals()
    with caplog.at_level("INFO", logger="treadle"):
        _trainer(tmp_path, hooks=[vals], resume=True, checkpoint=dict(interval=1)).fit()
    assert "already finished" in caplog.text and vals.at == []


def test_the_log_window_open_at_the_checkpoint_is_resumed_too(tmp_path):
    from treadle.logging import read_jsonl

    kw = dict(max_epochs=None, max_iters=12, log_interval=4, log_writers=("jsonl",), val=False,
              checkpoint=dict(interval=5, by_epoch=False), clip_grad=dict(max_norm=1.0))  # grad_norm is logged
    _trainer(tmp_path / "ref", **kw).fit()
    _interrupt(tmp_path / "run", 7, "crash", **kw)  # saved at 5, inside the window of iterations 5-8
    _trainer(tmp_path / "run", resume=True, **kw).fit()

    def losses(run):
        return {r["iter"]: (r["loss"], r["grad_norm"]) for r in read_jsonl(tmp_path / run / "log.jsonl")
                if r.get("mode") == "train"}

    ref, resumed = losses("ref"), losses("run")
    assert sorted(ref) == [4, 8, 12] and resumed[8] == ref[8] and resumed[12] == ref[12]


class ValResults(treadle.Hook):
    def __init__(self) -> None:
        self.results: list[tuple[int, dict]] = []

    def after_val(self, trainer, metrics):
        self.results.append((trainer.state.iter, dict(metrics)))


@pytest.mark.parametrize("kw", [
    dict(max_epochs=None, max_iters=12, workflow=[("train", 3), ("val", 1)],  # 1 of 3 val batches per phase
         val_dataloader=DataLoader(make_data(12, seed=1), batch_size=4)),
    dict(val_dataloader=DataLoader(make_data(12, seed=1), batch_size=3, shuffle=True)),  # reshuffled every pass
])
def test_validation_goes_on_where_it_was_after_a_resume(tmp_path, kw):
    ref_vals, vals = ValResults(), ValResults()
    _trainer(tmp_path / "ref", hooks=[ref_vals], checkpoint=dict(interval=1, by_epoch=False), **kw).fit()
    _interrupt(tmp_path / "run", 8, "crash", checkpoint=dict(interval=1, by_epoch=False), **kw)
    _trainer(tmp_path / "run", hooks=[vals], resume=True, checkpoint=dict(interval=1, by_epoch=False), **kw).fit()
    later = [r for r in ref_vals.results if r[0] >= 8]
    assert later and vals.results == later


def test_a_stop_at_an_epochs_last_iteration_keeps_the_due_validation(tmp_path):
    ref_vals, vals = Vals(), Vals()
    ref = _trainer(tmp_path / "ref", hooks=[ref_vals])
    ref.fit()
    _interrupt(tmp_path / "run", 5, "stop")  # the stop skips the validation due after epoch 1 ...
    resumed = _trainer(tmp_path / "run", hooks=[vals], resume=True)
    resumed.fit()
    assert ref_vals.at == [5, 10, 15] and vals.at == [5, 10, 15]  # ... so the resumed run does it first
    _assert_same(resumed, ref)
