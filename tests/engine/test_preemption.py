"""PreemptionConfig: every bad ``preemption=`` value fails at construction, naming the key;
Ctrl-C is a clean stop (the SIGTERM/SIGUSR1 handlers are exercised in
tests/hooks/test_checkpoint_hook.py, killed processes in tests/checkpoint/test_resume.py)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint import io as checkpoint_io
from treadle.checkpoint.io import find_latest_checkpoint, list_checkpoints, verify_checkpoint
from treadle.engine.preemption import PreemptionConfig

from faults import SignalAt
from support import TinyNet, make_data


@pytest.mark.parametrize("cfg,exc,match", [
    (dict(signals=("SIGKILL",)), ValueError, r"preemption signal 'SIGKILL' cannot be caught"),
    (dict(signals=["SIGTERM", "SIGSTOP"]), ValueError, r"preemption signal 'SIGSTOP' cannot be caught"),
    (dict(signals="SIGTERM"), TypeError, r"preemption signals='SIGTERM'; expected a list of signal names such as "
                                         r"\['SIGTERM', 'SIGUSR1'\]"),
    (dict(signals=None), TypeError, r"preemption signals=None; expected a list of signal names"),
    (dict(signals=["SIGFOO"]), ValueError, r"preemption signal 'SIGFOO' is not a signal name"),
    (dict(signals=[15]), ValueError, r"preemption signal 15 is not a signal name"),
    (dict(exit_code="x"), TypeError, r"preemption exit_code='x' is not an int; expected an int in 0..255"),
    (dict(exit_code=143.0), TypeError, r"preemption exit_code=143.0 is not an int"),
    (dict(exit_code=300), ValueError, r"preemption exit_code=300 is out of range; expected an int in 0..255"),
    (dict(requeue="no"), TypeError, r"preemption requeue='no'; expected True .* or False"),
    (dict(signal=["SIGTERM"]), ValueError,
     r"preemption has unknown keys \['signal'\]|preemption\.signal: unknown key for preemption"),
    (dict(interrupt="yes"), TypeError, r"preemption interrupt='yes'; expected True \(Ctrl-C saves and exits 130\)"),
    ("yes", TypeError, r"preemption must be True, False or dict|preemption: wrong type str \(got 'yes'\); expected true, false"),
])
def test_bad_preemption_fails_at_construction(cfg, exc, match, tmp_path):
    with pytest.raises(exc, match=match):
        PreemptionConfig.build(cfg)
    with pytest.raises(exc, match=match):
        treadle.Trainer(TinyNet(), work_dir=tmp_path / "run", train_dataloader=DataLoader(make_data(8), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1, preemption=cfg)
    assert not (tmp_path / "run").exists()


def test_good_preemption_values():
    assert PreemptionConfig.build(False) is None and PreemptionConfig.build(None) is None
    assert PreemptionConfig.build(True) == PreemptionConfig()
    cfg = PreemptionConfig.build(dict(signals=["SIGUSR2"], exit_code=0, requeue=False))
    assert (cfg.signals, cfg.exit_code, cfg.requeue) == (("SIGUSR2",), 0, False)
    assert PreemptionConfig.build(dict(requeue=False)).signals == ("SIGTERM", "SIGUSR1")


# -- Ctrl-C ---------------------------------------------------------------------------------
def ctrl_c(at: int, times: int = 1) -> SignalAt:
    """Press Ctrl-C (SIGINT to this process) ``times`` times after iteration ``at``."""
    return SignalAt(at, signal.SIGINT, times)


@pytest.fixture
def ctrl_c_reaches_python():
    """SIGINT raises KeyboardInterrupt, as in a terminal, even where pytest was started as a
    background job (a shell starts those with SIGINT ignored, which fit() keeps)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def trainer(work_dir, hooks=(), **kw):
    torch.manual_seed(0)
    loader = DataLoader(make_data(32), batch_size=4, shuffle=True)
    args = dict(work_dir=work_dir, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="AdamW", lr=0.01), max_epochs=3, seed=0, hooks=list(hooks), progress=False,
                log_writers=("jsonl",), checkpoint=dict(interval=1, by_epoch=True))
    args.update(kw)
    return treadle.Trainer(TinyNet(dropout=0.2), **args)


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_ctrl_c_stops_at_the_boundary_saves_and_resumes_exactly(tmp_path, caplog, capsys):
    whole = trainer(tmp_path / "whole")
    whole.fit()
    t = trainer(tmp_path / "run", hooks=[ctrl_c(at=11)])
    with pytest.raises(SystemExit) as stop:
        t.fit()
    assert stop.value.code == 130 and t.state.iter == 11 and t.state.interrupted
    assert "press Ctrl-C again to abort at once" in capsys.readouterr().err
    path = tmp_path / "run" / "checkpoints" / "iter_00000011"
    verify_checkpoint(path)
    assert f"interrupted (Ctrl-C): saved {path} at iteration 11; continue with resume=True" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    resumed = trainer(tmp_path / "run", resume=True)
    resumed.fit()
    for k, v in whole.module.state_dict().items():
        assert torch.equal(resumed.module.state_dict()[k], v), k


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_a_second_ctrl_c_aborts_at_once_and_keeps_the_last_checkpoint(tmp_path):
    t = trainer(tmp_path, hooks=[ctrl_c(at=11, times=2)])
    with pytest.raises(KeyboardInterrupt, match="a second Ctrl-C"):
        t.fit()
    assert t.state.iter == 10  # aborted inside iteration 11's hooks: nothing more ran, nothing saved
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["epoch_0001"]
    verify_checkpoint(tmp_path / "checkpoints" / "epoch_0001")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_a_second_ctrl_c_during_the_save_leaves_no_damaged_checkpoint(tmp_path, monkeypatch):
    write = checkpoint_io._write_durably

    def write_then_ctrl_c(path, *args, **kwargs):
        out = write(path, *args, **kwargs)
        if "iter_00000011" in str(path):  # half-way through the save the first Ctrl-C asked for
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(checkpoint_io, "_write_durably", write_then_ctrl_c)
    before = (tmp_path / "checkpoints" / "epoch_0001")
    t = trainer(tmp_path, hooks=[ctrl_c(at=11)])
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch_0001"]  # no scratch left either
    verify_checkpoint(before)
    assert find_latest_checkpoint(tmp_path / "checkpoints") == before


@pytest.mark.usefixtures("ctrl_c_reaches_python")
def test_interrupt_false_leaves_ctrl_c_to_python(tmp_path):
    t = trainer(tmp_path, hooks=[ctrl_c(at=3)], preemption=dict(interrupt=False))
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    assert t.state.iter == 2 and not t.state.interrupted


def test_an_ignored_sigint_stays_ignored(tmp_path):
    """A shell starts background jobs with SIGINT ignored: fit() must not turn it back on."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seen = []

        class Look(treadle.Hook):
            def after_train_iter(self, trainer, batch, outputs):
                seen.append(signal.getsignal(signal.SIGINT))

        trainer(tmp_path, hooks=[Look(), ctrl_c(at=2)], max_epochs=1).fit()
        assert set(seen) == {signal.SIG_IGN}
    finally:
        signal.signal(signal.SIGINT, old)
