"""ProgressBarHook: a rich bar on terminals, plain lines elsewhere, no device reads per step."""

from __future__ import annotations

import io
import logging
import re
import sys
import time

import pytest
from rich.console import Console
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, count_host_reads, make_data
from treadle.hooks.progress import ProgressBarHook
from treadle.logging.writers import get_logger

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=160), buf


def _text(buf: io.StringIO) -> str:
    return ANSI.sub("", buf.getvalue())


def _trainer(**kw):
    args = dict(train_dataloader=DataLoader(make_data(40), batch_size=4),
                val_dataloader=DataLoader(make_data(8, seed=1), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=2, log_interval=5, checkpoint=False)
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def _has_bar(t: treadle.Trainer) -> bool:
    return any(isinstance(h, ProgressBarHook) for h in t.hooks)


def test_forced_bar_shows_epochs_iterations_rate_and_loss():
    console, buf = _console()
    t = _trainer(hooks=[ProgressBarHook(console=console)])
    t.fit()
    out = _text(buf)
    assert "epoch 2/2" in out and "20/20" in out
    assert "it/s" in out and "eta" in out
    assert f"loss {t.store.latest['loss']:.4g}" in out  # the value LoggerHook logged last


def test_validation_and_test_passes_get_their_own_task():
    console, buf = _console()
    t = _trainer(test_dataloader=DataLoader(make_data(12, seed=2), batch_size=4),
                 hooks=[ProgressBarHook(console=console)])
    t.validate()
    assert "val" in _text(buf) and "2/2" in _text(buf)
    t.test()
    assert "test" in _text(buf) and "3/3" in _text(buf)


def test_auto_on_a_non_terminal_gives_plain_lines_and_no_bar(caplog):
    assert not sys.stdout.isatty()  # pytest captures stdout
    with caplog.at_level(logging.INFO, logger="treadle"):
        t = _trainer()
        t.fit()
    assert not _has_bar(t)
    assert any("epoch 2/2  iter 20/20" in r.message for r in caplog.records)


def test_auto_on_a_terminal_true_forces_false_disables(monkeypatch):
    assert _has_bar(_trainer(progress=True))
    assert not _has_bar(_trainer(progress=False))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert _has_bar(_trainer())
    assert not _has_bar(_trainer(progress=False))


def test_non_main_ranks_never_show_a_bar(monkeypatch):
    monkeypatch.setattr(treadle.Trainer, "is_main", property(lambda self: False))
    level = get_logger().level  # a non-main Trainer quiets the shared logger
    try:
        assert not _has_bar(_trainer(progress=True))
        console, buf = _console()
        t = _trainer(hooks=[ProgressBarHook(console=console)])  # given explicitly: still silent
        t.fit()
        assert buf.getvalue() == ""
    finally:
        get_logger().setLevel(level)


def test_bad_progress_value():
    with pytest.raises(ValueError, match="progress: not a supported value \\(got 'yes'\\); expected one of 'auto'"):
        _trainer(progress="yes")


def test_terminal_log_lines_go_above_the_bar_while_it_is_live():
    console, buf = _console()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.set_name("treadle-console")  # the handler get_logger() makes on a bare process
    logger = get_logger()
    logger.addHandler(handler)
    try:
        _trainer(hooks=[ProgressBarHook(console=console)]).fit()
        assert "epoch 2/2  iter 20/20" in _text(buf)  # printed through the bar's console
        assert "iter 20/20" not in stream.getvalue()  # not written under the bar by the handler
        assert handler.filters == []  # restored after the run
        logger.info("after the run")
        assert "after the run" in stream.getvalue()
    finally:
        logger.removeHandler(handler)


def test_bar_reads_no_device_values_per_step(monkeypatch, as_device):
    console, _ = _console()
    batches = list(DataLoader(make_data(40), batch_size=4))
    t = treadle.Trainer(TinyNet(), train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.05), max_iters=20, log_interval=10,
                        hooks=[ProgressBarHook(console=console)])
    calls = count_host_reads(monkeypatch)
    t.fit()
    assert calls == {"item": 0, "tolist": 2}  # as without the bar: one read per interval (logger, shared by the NaN guard)


def test_per_step_cost_is_small():
    console, _ = _console()
    t = _trainer(max_epochs=None, max_iters=10**6, val_dataloader=None)
    hook = ProgressBarHook(console=console)
    hook.before_run(t)
    hook.before_train(t)
    try:
        n = 20_000
        start = time.perf_counter()
        for _ in range(n):
            hook.after_train_iter(t, None, None)
            t.state.iter += 1
        per_step = (time.perf_counter() - start) / n
    finally:
        hook.after_run(t)
    assert per_step < 50e-6  # about 1 us measured; a generous bound for loaded machines


def test_config_key_is_checked():
    from treadle.config import ConfigError, resolve_config

    base = {"model": {"type": "support.TinyNet"}, "optimizer": {"type": "SGD", "lr": 0.1}, "max_epochs": 1,
            "train_dataloader": {"dataset": {"type": "support.make_data"}, "batch_size": 8}}
    assert resolve_config({**base, "progress": False}, mode="train")["progress"] is False
    with pytest.raises(ConfigError, match="progress: not a supported value"):
        resolve_config({**base, "progress": "always"}, mode="train")
