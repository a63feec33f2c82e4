"""A resume whose arguments differ from the checkpoint's run says so, one line per
setting: the value used and why; ``config.yaml`` records what the run uses."""

from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset

import treadle
from treadle.checkpoint.io import find_latest_checkpoint, load_checkpoint

from cli_support import TINY, run
from faults import CrashAt
from support import TinyNet, make_data


def _trainer(work_dir, *, lr=0.1, max_epochs=1, batch_size=8, seed=0, resume=False, **kw):
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(32), batch_size=batch_size, shuffle=True),
                loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=lr, momentum=0.9),
                max_epochs=max_epochs, seed=seed, resume=resume, log_writers=(), progress=False)
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def _saved_group(work_dir):
    """The first param group of the optimizer in the run's latest checkpoint, as saved."""
    state = load_checkpoint(find_latest_checkpoint(work_dir / "checkpoints"), files=["state.pt"])["state.pt"]
    (optim,) = state["optim"].values()
    return optim["optimizer"]["param_groups"][0]


def _resume_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: ")]


def test_each_changed_setting_is_one_line_with_the_value_used_and_why(tmp_path, caplog):
    _trainer(tmp_path).fit()
    saved = _saved_group(tmp_path)
    with caplog.at_level("INFO", logger="treadle"):
        t = _trainer(tmp_path, lr=0.05, max_epochs=2, batch_size=4, seed=3, resume=True)
        t.fit()
    lines = _resume_lines(caplog)
    assert lines == [
        f"resume: optimizer.lr = {saved['lr']:.6g} from the checkpoint, not 0.05 as configured: an exact resume "
        "keeps the optimizer's state; load_from= takes the weights alone",
        "resume: max_epochs = 2 as configured (the checkpoint's run had 1): training goes on to epoch 2",
        "resume: train_dataloader.batch_size = 4 as configured (the checkpoint's run had 8): the next epochs are "
        "batched by it",
        "resume: seed = 0 from the checkpoint, not 3 as configured: an exact resume keeps the checkpoint's data "
        "order and random states",
    ]
    # The lines tell the truth: the optimizer trained on with the checkpoint's lr, for 2 epochs of batch 4.
    assert t.optimizer.param_groups[0]["lr"] == saved["lr"] == 0.1
    assert (t.state.epoch, t.state.iter) == (2, 4 + 8)
    changes = {c.key: (c.config, c.saved, c.used) for c in t.resume_changes}
    assert changes == {"optimizer.lr": (0.05, 0.1, 0.1), "max_epochs": (2, 1, 2),
                       "train_dataloader.batch_size": (4, 8, 4), "seed": (3, 0, 0)}
    # A line follows the "resumed from" one, before training goes on.
    messages = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(messages) if m.startswith("resumed from"))
    assert messages[first + 1].startswith("resume: optimizer.lr")


def test_an_unchanged_resume_says_nothing_even_with_a_schedule_moving_the_lr(tmp_path, caplog):
    schedule = [dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=6)]
    _trainer(tmp_path, max_epochs=2, schedulers=schedule, checkpoint=dict(interval=1)).fit()
    with caplog.at_level("INFO", logger="treadle"):
        _trainer(tmp_path, max_epochs=3, schedulers=schedule, resume=True).fit()
    # The lr moved with the schedule; its base (initial_lr) did not: only the length changed.
    assert _resume_lines(caplog) == [
        "resume: max_epochs = 3 as configured (the checkpoint's run had 2): training goes on to epoch 3"]


class Indices(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.full((6,), float(i)), torch.tensor(i % 3)


class Seen(treadle.Hook):
    def __init__(self):
        self.samples: list[int] = []

    def before_train_iter(self, trainer, batch):
        self.samples += [int(x) for x in batch[0][:, 0].tolist()]


@pytest.mark.parametrize("before, after", [(4, 6), (6, 4)])
def test_a_batch_size_change_inside_an_epoch_goes_on_after_the_samples_taken(tmp_path, before, after, caplog):
    def trainer(batch_size, hooks, resume=False):
        return _trainer(tmp_path, batch_size=batch_size, resume=resume, hooks=hooks, max_epochs=1,
                        train_dataloader=DataLoader(Indices(), batch_size=batch_size, shuffle=True),
                        checkpoint=dict(interval=2, by_epoch=False))

    first, second = Seen(), Seen()
    with pytest.raises(KeyboardInterrupt):
        trainer(before, [first, CrashAt(2, KeyboardInterrupt)]).fit()  # 2 batches saved, then a crash
    with caplog.at_level("INFO", logger="treadle"):
        trainer(after, [second], resume=True).fit()
    assert (f"resume: train_dataloader.batch_size = {after} as configured (the checkpoint's run had {before}): "
            f"the open epoch goes on after the samples already taken, rounded down to whole batches of {after}"
            ) in _resume_lines(caplog)
    taken = first.samples[:2 * before]
    skipped = len(taken) // after * after  # whole batches of the new size
    assert len(second.samples) == 24 - skipped and set(taken + second.samples) == set(range(24))
    assert set(second.samples) >= set(range(24)) - set(taken)  # nothing of the epoch left out


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_config_yaml_records_what_the_resumed_run_uses(tiny, tmp_path, capsys, caplog):
    """The README's sequence: a short run with another lr, then --resume without it."""
    work = tmp_path / "run"
    rc, _, err = run(capsys, "train", tiny, "--work-dir", work, "--set", "max_epochs=1", "optimizer.lr=0.05")
    assert rc == 0, err
    with caplog.at_level("INFO", logger="treadle"):
        rc, _, err = run(capsys, "train", tiny, "--work-dir", work, "--resume")
    assert rc == 0, err
    saved = _saved_group(work)
    config = yaml.safe_load((work / "config.yaml").read_text())
    assert config["optimizer"]["lr"] == saved["lr"] == 0.05  # the lr the run trained with, not the file's 0.1
    assert config["max_epochs"] == 2 and config["resume"] is True
    assert any(line.startswith("resume: optimizer.lr = 0.05 from the checkpoint, not 0.1 as configured")
               for line in _resume_lines(caplog))
