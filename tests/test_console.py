"""A quiet, consistent console (issue 20): the environment and hook tables go to log.txt
with one console line, one number format per kind of value, each message once, one
epoch/iteration convention, and the command line's titles and --set as a user expects."""

from __future__ import annotations

import logging

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.checkpoint.io import find_latest_checkpoint
from treadle.hooks.logger import format_value
from treadle.logging.writers import get_logger

from cli_support import run
from support import TinyNet, make_data


@pytest.fixture
def console(monkeypatch, capsys):
    """The console handler get_logger() makes in a bare process (no logging configured),
    writing to the captured stdout (made at the first call, inside the test); returns a
    function giving what it printed since the last call."""
    root, logger = logging.getLogger(), get_logger()
    monkeypatch.setattr(logger, "handlers", [])

    def printed() -> str:
        if not logger.handlers:
            with monkeypatch.context() as m:
                m.setattr(root, "handlers", [])
                get_logger()
            assert [h.get_name() for h in logger.handlers] == ["treadle-console"]
        return capsys.readouterr().out
    return printed


def make(tmp_path, **kw):
    args = dict(work_dir=tmp_path / "run", train_dataloader=DataLoader(make_data(16), batch_size=4),
                val_dataloader=DataLoader(make_data(8), batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=2, progress=False, log_writers=[])
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def test_the_tables_go_to_log_txt_with_one_console_line(tmp_path, console):
    console()
    make(tmp_path).fit()
    out, log = console(), (tmp_path / "run" / "log.txt").read_text()
    assert "hook order:\n" not in out and "environment:\n" not in out and "torch threads" not in out
    pointer = [ln for ln in out.splitlines() if "environment and hook order" in ln]
    assert len(pointer) == 1 and pointer[0].endswith(f"in {tmp_path / 'run' / 'log.txt'} (verbose prints them here)")
    assert "hook order:" in log and "environment:" in log and "torch threads" in log
    assert "verbose prints them here" not in log  # the pointer is for the console only
    make(tmp_path, work_dir=tmp_path / "loud", verbose=True).fit()
    out = console()
    assert "hook order:\n" in out and "environment:\n" in out and "verbose prints" not in out


def test_each_message_once_at_the_end(tmp_path, console):
    console()
    make(tmp_path, checkpoint=dict(interval=1)).fit()  # epoch_0002 saved, validated, saved again
    out = console()
    last = tmp_path / "run" / "checkpoints" / "epoch_0002"
    assert out.count(f"saved checkpoint {last}\n") == 1
    assert out.count(f"updated checkpoint {last}: it now holds the state after the last validation") == 1


@pytest.mark.parametrize("key,value,shown", [
    ("lr", 0.002, "2.00e-03"), ("lr", 0.0002922, "2.92e-04"), ("lr/pg1", 0.1, "1.00e-01"),
    ("data_time", 0.000104, "0.1ms"), ("step_time", 0.0303, "30.3ms"), ("time/backward", 1.5, "1500.0ms"),
    ("samples_per_s", 48770.123, "48770.1"), ("samples_per_s", 3366.68, "3366.7"), ("max_memory_mb", 512.04, "512.0"),
    ("loss_scale", 65536.0, "65536"),
    ("loss", 10460.3, "1.046e+04"), ("loss", 7074.58, "7075"), ("val/acc", 0.986072, "0.9861"),
    ("val/loss", 0.049821, "0.04982"), ("grad_norm", 2.10234, "2.102"), ("loss", 1.12, "1.120"), ("loss", 0.0, "0.000"),
    ("loss", 999.96, "1000"), ("skipped_steps", 3, "3"),
])
def test_one_number_format_per_kind_of_value(key, value, shown):
    assert format_value(key, value) == shown


def test_validate_of_loaded_weights_shows_no_epoch_0_iter_0(tmp_path, caplog):
    make(tmp_path, checkpoint=dict(interval=1)).fit()
    ckpt = find_latest_checkpoint(tmp_path / "run" / "checkpoints")
    caplog.clear()
    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, work_dir=None, train_dataloader=None, optimizer=None, load_from=ckpt).validate()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("val")]
    assert len(lines) == 1 and lines[0].startswith("val  val/loss ") and "epoch 0" not in caplog.text


def test_a_resume_says_where_training_goes_on_as_the_next_line_counts(tmp_path, caplog):
    make(tmp_path, max_epochs=1, checkpoint=dict(interval=1)).fit()
    caplog.clear()
    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, resume=True, log_interval=1).fit()
    messages = [r.getMessage() for r in caplog.records]
    resumed = next(i for i, m in enumerate(messages) if m.startswith("resumed from"))
    assert messages[resumed].endswith("epoch_0001: 4 iterations done, training goes on in epoch 2")
    assert next(m for m in messages[resumed:] if m.startswith("epoch ")).startswith("epoch 2/2  iter 5/8")


def test_a_finished_run_resumed_says_so_in_one_line(tmp_path, caplog):
    make(tmp_path).fit()
    caplog.clear()
    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, resume=True).fit()
    messages = [r.getMessage() for r in caplog.records]
    about = [m for m in messages if "resumed" in m or "finished" in m or "goes on" in m]
    assert about == [f"resumed from {tmp_path / 'run' / 'checkpoints' / 'epoch_0002'}: the run already finished "
                     "(epoch 2, iter 8); nothing to do"]


@pytest.mark.parametrize("val", [False, True])
def test_the_final_checkpoint_of_an_iteration_run_is_written_once_and_said_truly(tmp_path, caplog, val):
    """8 iterations in 2 epochs of 4, a checkpoint every 4: the last one is the final save;
    with no validation nothing changes after it but the epoch's close, so it is written
    once, and never said to hold a validation that did not run."""
    kw = dict(max_epochs=None, max_iters=8, checkpoint=dict(interval=4, by_epoch=False))
    if not val:
        kw["val_dataloader"] = None
    else:
        kw["val_interval"] = 8
    saves = []

    class Saves(treadle.Hook):
        def before_save_checkpoint(self, trainer, checkpoint):
            saves.append(trainer.state.iter)

    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, hooks=[Saves()], **kw).fit()
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("saved checkpoint", "updated"))]
    last = tmp_path / "run" / "checkpoints" / "iter_00000008"
    if not val:
        assert len(saves) == 2 and messages == [f"saved checkpoint {tmp_path / 'run' / 'checkpoints' / 'iter_00000004'}",
                                                f"saved checkpoint {last}"]
    else:  # saved at 8, validated, saved again: said as such
        assert len(saves) == 3
        assert messages[-1] == f"updated checkpoint {last}: it now holds the state after the last validation"
    assert val or not any("validation" in m for m in messages)


def test_validation_lines_count_epochs_as_the_train_lines_do(tmp_path, caplog):
    """Iteration-based, 4 iterations an epoch, validation every 2: the validation after
    iteration 6 is in epoch 2, as the train line of iteration 6 says."""
    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, max_epochs=None, max_iters=8, val_interval=2, log_interval=2).fit()
    lines = [r.getMessage() for r in caplog.records]
    train = {int(m.split()[3].split("/")[0]): m.split()[1] for m in lines if m.startswith("epoch ")}
    val = {int(m.split("iter ")[1].split(")")[0]): m.split("(epoch ")[1].split(",")[0]
           for m in lines if m.startswith("val (")}
    assert sorted(val) == [2, 4, 6, 8]
    assert {i: e.split("/")[0] for i, e in train.items()} == val == {2: "1", 4: "1", 6: "2", 8: "2"}


def test_the_best_checkpoint_line_follows_the_validation_line_it_comes_from(tmp_path, caplog):
    with caplog.at_level("INFO", logger="treadle"):
        make(tmp_path, checkpoint=dict(best="val/loss")).fit()
    lines = [r.getMessage() for r in caplog.records]
    best = [i for i, m in enumerate(lines) if m.startswith("best val/loss = ")]
    assert best and all(lines[i - 1].startswith("val (") for i in best)  # right after the line it comes from
    for i in best:
        value = float(lines[i].split(" = ")[1].split(":")[0])
        assert f"val/loss {format_value('val/loss', value)}" in lines[i - 1]


def test_the_console_names_files_relative_to_the_working_directory(tmp_path, console, monkeypatch):
    monkeypatch.chdir(tmp_path)
    console()
    make(tmp_path, work_dir="run").fit()
    out = console()
    assert "environment and hook order: in run/log.txt (verbose prints them here)" in out
    assert str(tmp_path) not in out


def test_a_nan_error_counts_iterations_as_checkpoint_names_do(tmp_path):
    class NaNAt3(TinyNet):
        calls = 0

        def forward(self, x):
            NaNAt3.calls += 1
            out = super().forward(x)
            return out * float("nan") if NaNAt3.calls == 3 else out

    t = treadle.Trainer(NaNAt3(), train_dataloader=DataLoader(make_data(16), batch_size=4),
                        loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_epochs=1,
                        nan_guard=dict(mode="raise", check_interval=1), progress=False)
    with pytest.raises(FloatingPointError, match=r"at iteration=3 \(epoch 1\)"):  # the 3rd: iter_00000003's
        t.fit()


# -- the command line --------------------------------------------------------------------
def test_set_may_come_before_the_config(tiny, tmp_path, capsys):
    rc, out, err = run(capsys, "train", "--set", "max_epochs=1", "log_interval=1", tiny, "--work-dir", tmp_path / "w")
    assert rc == 0, err
    assert find_latest_checkpoint(tmp_path / "w" / "checkpoints").name == "epoch_0001"
    rc, _, err = run(capsys, "train", tiny, "--set", "max_epochs=1", "--work-dir", tmp_path / "w2", "--set", "seed=3")
    assert rc == 0, err


def test_the_result_title_never_wraps_a_path(tiny, tmp_path, capsys):
    deep = tmp_path / ("a_rather_long_directory_name_" * 3) / "run"
    assert run(capsys, "train", tiny, "--work-dir", deep, "--set", "max_epochs=1")[0] == 0
    ckpt = find_latest_checkpoint(deep / "checkpoints")
    rc, out, _ = run(capsys, "validate", deep / "config.yaml", "--checkpoint", ckpt)
    assert rc == 0 and f"validate: {ckpt}" in out.splitlines()
    row = next(line for line in out.splitlines() if "val/loss" in line)
    value = float(row.split()[-2])
    assert row.split()[-2] == format_value("val/loss", value)  # as the log lines show it
