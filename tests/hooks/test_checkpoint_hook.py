"""CheckpointHook retention, best-K, load_from, preemption handlers and resume semantics
(in-process; the kill-and-resume tests are in tests/checkpoint/test_resume.py)."""

from __future__ import annotations

import os
import signal
import stat

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import list_checkpoints, read_manifest

from faults import SignalAt
from support import TinyNet, make_data


def make(tmp_path, **kw):
    args = dict(work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=4, seed=0)
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def names(tmp_path):
    return [p.name for p in list_checkpoints(tmp_path / "checkpoints")]


def test_periodic_saves_keep_the_last_n(tmp_path):
    make(tmp_path, checkpoint=dict(interval=1, by_epoch=True, keep=2)).fit()
    assert names(tmp_path) == ["epoch_0003", "epoch_0004"]
    make(tmp_path / "it", max_epochs=None, max_iters=10, checkpoint=dict(interval=3, by_epoch=False, keep=None)).fit()
    assert names(tmp_path / "it") == ["iter_00000003", "iter_00000006", "iter_00000009", "iter_00000010"]  # + final


def test_best_k_by_a_validation_metric(tmp_path):
    scores = iter([0.3, 0.9, 0.5, 0.7])

    class Score:
        def reset(self): pass
        def update(self, o, t): pass
        def compute(self): return next(scores)

    t = make(tmp_path, val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"s": Score()},
             checkpoint=dict(interval=1, keep=1, best="val/s", rule="max", keep_best=2))
    t.fit()
    best = sorted(p.name for p in (tmp_path / "checkpoints" / "best").iterdir())
    assert best == ["best_val_s_00000008", "best_val_s_00000016"]  # 0.9 (epoch 2) and 0.7 (epoch 4)
    assert read_manifest(tmp_path / "checkpoints" / "best" / "best_val_s_00000008")["meta"]["val/s"] == 0.9
    assert names(tmp_path) == ["epoch_0004"]  # best ones are kept apart, never pruned as periodic


@pytest.mark.parametrize("spoil", [True, False])
def test_best_weights_with_nan_are_not_saved_and_the_run_goes_on(tmp_path, caplog, spoil):
    """Best weights go through the checkpointer's non-finite check: a NaN weight at a
    best validation is said and not saved; the run goes on (control: finite ones are saved)."""

    class One:
        def reset(self): pass
        def update(self, o, t): pass
        def compute(self): return 1.0

    class Spoil(treadle.Hook):
        def before_val(self, trainer):
            if spoil:
                with torch.no_grad():
                    trainer.module.fc1.weight[0, 0] = float("nan")

    t = make(tmp_path, max_epochs=1, val_dataloader=DataLoader(make_data(4), batch_size=4), metrics={"s": One()},
             hooks=[Spoil()], nan_guard=False, checkpoint=dict(interval=None, best="val/s", rule="max", save_last=False))
    t.fit()
    saved = list((tmp_path / "checkpoints" / "best").iterdir())
    if spoil:
        assert saved == [] and t.state.epoch == 1
        assert "best val/s = 1: not saved: refusing to save" in caplog.text and "'model.fc1.weight' holds NaN" in caplog.text
    else:
        assert [p.name for p in saved] == ["best_val_s_00000004"]


def test_default_saves_once_at_the_end(tmp_path):
    make(tmp_path).fit()
    assert names(tmp_path) == ["epoch_0004"]
    make(tmp_path / "none", checkpoint=False).fit()
    assert not (tmp_path / "none" / "checkpoints").exists()


def test_load_from_weights_only_with_prefixes_and_report(tmp_path):
    src = TinyNet()
    torch.save({"state_dict": {f"module._orig_mod.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "w.pt")
    t = treadle.Trainer(TinyNet(), load_from=tmp_path / "w.pt")
    for k, v in src.state_dict().items():
        assert torch.equal(t.module.state_dict()[k].cpu(), v)  # the model is on the run's device
    bad = {k: v for k, v in src.state_dict().items() if k != "fc2.bias"}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(treadle.checkpoint.weights.WeightsMismatchError, match="fc2.bias"):
        treadle.Trainer(TinyNet(), load_from=tmp_path / "bad.pt")
    with pytest.raises(FileNotFoundError, match="load_from"):
        treadle.Trainer(TinyNet(), load_from=tmp_path / "missing.pt")


def test_resume_true_without_checkpoint_starts_fresh(tmp_path, caplog):
    t = make(tmp_path, resume=True, max_epochs=1)
    t.fit()
    assert t.state.epoch == 1 and "starting from scratch" in caplog.text


def test_resume_with_larger_max_epochs_extends_training(tmp_path):
    make(tmp_path, max_epochs=2).fit()
    t = make(tmp_path, max_epochs=3, resume=True)
    t.fit()
    assert (t.state.epoch, t.state.iter) == (3, 12)
    ref = make(tmp_path / "ref", max_epochs=3)
    ref.fit()
    for k, v in ref.module.state_dict().items():
        assert torch.equal(t.module.state_dict()[k], v)


def test_resume_path_must_exist():
    with pytest.raises(FileNotFoundError, match="resume="):
        treadle.Trainer(TinyNet(), resume="/nonexistent/ckpt")
    with pytest.raises(ValueError, match="work_dir is None"):
        treadle.Trainer(TinyNet(), resume=True)


def test_signal_handlers_are_restored_after_fit(tmp_path):
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGUSR1, mine)
    try:
        seen = []

        class Peek(treadle.Hook):
            def after_train_iter(self, trainer, batch, outputs):
                seen.append(signal.getsignal(signal.SIGUSR1))

        make(tmp_path, hooks=[Peek()], max_epochs=1).fit()
        assert seen[0] is not mine  # treadle's handler during fit
        assert signal.getsignal(signal.SIGUSR1) is mine  # and the user's again afterwards
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_preemption_requeues_under_slurm_and_exits_143(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'scontrol.args'}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")

    t = make(tmp_path / "run", hooks=[SignalAt(6, signal.SIGUSR1)], checkpoint=dict(interval=None))
    with pytest.raises(SystemExit) as info:
        t.fit()
    assert info.value.code == 143
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    assert names(tmp_path / "run") == ["iter_00000006"]  # saved at the boundary after iteration 5
    assert t.state.stop_reason == "preempted by SIGUSR1"


def test_checkpoint_config_errors():
    with pytest.raises(ValueError, match=r'checkpoint\.every: unknown key for checkpoint \(got 2\); '
                                         r'expected one of interval, by_epoch, keep, best, rule, keep_best, sa'):
        treadle.Trainer(TinyNet(), checkpoint=dict(every=2))
    with pytest.raises(ValueError, match="checkpoint rule must be 'max' or 'min'"):
        treadle.Trainer(TinyNet(), checkpoint=dict(best="val/acc", rule="bigger"))
    with pytest.raises(ValueError, match="preemption signal 'SIGFOO'"):
        treadle.Trainer(TinyNet(), preemption=dict(signals=("SIGFOO",)))


def test_a_saved_checkpoint_holds_only_safe_data(tmp_path):
    make(tmp_path, max_epochs=1).fit()
    ckpt = list_checkpoints(tmp_path / "checkpoints")[-1]
    # weights_only=True loads every file: the state is tensors and plain containers only
    for f in ("state.pt", "rng_rank0.pt"):
        torch.load(ckpt / f, weights_only=True)


def test_a_new_run_prunes_only_its_own_checkpoints_and_resume_finds_it(tmp_path, caplog):
    make(tmp_path, checkpoint=dict(interval=1, keep=1)).fit()  # an earlier, longer run
    first = read_manifest(tmp_path / "checkpoints" / "epoch_0004")
    with caplog.at_level("WARNING", logger="treadle"):
        second = make(tmp_path, max_epochs=2, checkpoint=dict(interval=1, keep=1))
        second.fit()
    assert "already holds 1 checkpoint(s) of another run (the last saved: epoch_0004)" in caplog.text
    # Its own epoch_0001 was pruned, its epoch_0002 kept; the first run's epoch_0004 untouched.
    assert names(tmp_path) == ["epoch_0002", "epoch_0004"]
    assert read_manifest(tmp_path / "checkpoints" / "epoch_0004") == first
    assert read_manifest(tmp_path / "checkpoints" / "epoch_0002")["meta"]["run"] == second.run_id != first["meta"]["run"]
    # resume=True continues the run that saved last (the second), not the finished first one.
    caplog.clear()
    with caplog.at_level("INFO", logger="treadle"):
        resumed = make(tmp_path, max_epochs=3, checkpoint=dict(interval=1, keep=1), resume=True)
        resumed.fit()
    assert "epoch_0002: 8 iterations done, training goes on in epoch 3" in caplog.text and resumed.state.epoch == 3
    assert resumed.run_id == second.run_id
    assert names(tmp_path) == ["epoch_0003", "epoch_0004"]  # the second run's epoch_0002 pruned, the first's kept
    assert read_manifest(tmp_path / "checkpoints" / "epoch_0004") == first


def test_resume_true_refuses_to_start_over_when_every_checkpoint_is_corrupt(tmp_path, caplog):
    make(tmp_path, max_epochs=1).fit()
    payload = tmp_path / "checkpoints" / "epoch_0001" / "state.pt"
    payload.write_bytes(payload.read_bytes()[:-10])
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("INFO", logger="treadle"):
        warnings.simplefilter("always")
        with pytest.raises(treadle.checkpoint.io.CheckpointError, match=r"none of the 1 checkpoint\(s\) in .* passed"):
            make(tmp_path, max_epochs=2, resume=True).fit()
    # Said once, by the log (not again as a CheckpointWarning with its file, line and source line).
    skips = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert len(skips) == 1 and str(payload.parent) in skips[0], skips
    assert not [w for w in caught if issubclass(w.category, treadle.checkpoint.io.CheckpointWarning)], caught


@pytest.mark.parametrize("cfg,match", [
    (dict(best=123), r"checkpoint best=123; expected the name of a validation result such as 'val/acc', or None"),
    (dict(best=""), r"checkpoint best=''; expected the name of a validation result"),
    (dict(by_epoch="no"), r"checkpoint by_epoch='no'; expected True or False"),
    (dict(save_last="no"), r"checkpoint save_last='no'; expected True or False"),
    (dict(save_last=0), r"checkpoint save_last=0; expected True or False"),
])
def test_checkpoint_argument_types_fail_at_construction(cfg, match, tmp_path):
    with pytest.raises(TypeError, match=match):
        make(tmp_path / "run", checkpoint=cfg)
    assert not (tmp_path / "run").exists()


def test_best_not_among_the_validation_results_names_those_there_are(tmp_path):
    # A key validation never produces (no metric of that name, not a loss): refused at once.
    with pytest.raises(ValueError, match=r"^checkpoint best='val/accc': validation never produces 'val/accc': it can "
                                         r"give val/acc, val/loss .* Did you mean 'val/acc'\?"):
        make(tmp_path, checkpoint=dict(interval=1, best="val/accc", rule="max"), metrics={"acc": treadle.Accuracy()},
             val_dataloader=DataLoader(make_data(4), batch_size=4))
    # A loss the step might have given, but did not: at the first validation.
    t = make(tmp_path, checkpoint=dict(interval=1, best="val/loss_box", rule="min"), metrics={"acc": treadle.Accuracy()},
             val_dataloader=DataLoader(make_data(4), batch_size=4))
    with pytest.raises(KeyError, match=r"checkpoint best='val/loss_box' is not among the validation results "
                                       r"\['val/acc', 'val/loss'\]"):
        t.fit()
