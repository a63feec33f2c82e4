"""The Trainer's arguments as config dicts (built as a config file's are), and the
``ema`` dict's ``start_iter`` name."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.config import ConfigError, build_trainer, resolve_config
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.metrics import Accuracy
from treadle.seeding import seed_everything

from support import TinyNet, make_data

SPECS = dict(
    model=dict(type="support.TinyNet", dropout=0.2),  # dropout: training's RNG stream must match too
    train_dataloader=dict(dataset=dict(type="support.make_data", n=24), batch_size=8, shuffle=True),
    val_dataloader=dict(dataset=dict(type="support.make_data", n=8, seed=1), batch_size=8),
    loss_fn=dict(type="CrossEntropyLoss"),
    metrics={"acc": dict(type="Accuracy")},
    hooks=[dict(type="EarlyStoppingHook", monitor="val/acc", patience=4)],
)
REST = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=2, seed=5, progress=False)


def _weights(trainer):
    return {k: v.clone() for k, v in trainer.module.state_dict().items()}


def test_config_dicts_train_bit_equal_to_objects_and_to_a_config_file():
    from_dicts = treadle.Trainer(**copy.deepcopy(SPECS), **REST)
    assert isinstance(from_dicts.module, TinyNet) and isinstance(from_dicts.loss_fn, nn.CrossEntropyLoss)
    assert isinstance(from_dicts.metrics["acc"], Accuracy)
    stop = [h for h in from_dicts.hooks if isinstance(h, EarlyStoppingHook)]
    assert len(stop) == 1 and stop[0].patience == 4
    result = from_dicts.fit()

    # The same run with objects built by hand after seeding, as a script would.
    seed_everything(REST["seed"])
    model = TinyNet(dropout=0.2)
    by_hand = treadle.Trainer(model, train_dataloader=DataLoader(make_data(24), batch_size=8, shuffle=True),
                              val_dataloader=DataLoader(make_data(8, seed=1), batch_size=8),
                              loss_fn=nn.CrossEntropyLoss(), metrics={"acc": Accuracy()},
                              hooks=[EarlyStoppingHook(monitor="val/acc", patience=4)], **REST)
    assert by_hand.fit() == result
    # And through a config file's path (treadle train).
    cfg = resolve_config({**copy.deepcopy(SPECS), **{k: v for k, v in REST.items() if k != "progress"}}, mode="train")
    from_file = build_trainer(cfg, progress=False)
    from_file.fit()
    for name, value in _weights(from_dicts).items():
        assert torch.equal(value, by_hand.module.state_dict()[name]), name
        assert torch.equal(value, from_file.module.state_dict()[name]), name


@pytest.mark.parametrize("changes,match", [
    (dict(model=dict(type="support.TinyNett")), r"model.type: cannot import 'support.TinyNett'"),
    (dict(model=dict(type="support.TinyNet", width=3)), r"model.width: unknown argument for TinyNet"),
    (dict(train_dataloader=dict(batch_size=8)), r"train_dataloader.dataset: missing required key"),
    (dict(val_dataloader=dict(dataset=dict(type="support.make_data"), batchsize=8)), r"val_dataloader.batchsize"),
    (dict(loss_fn=dict(type="CrossEntropy")), r"loss_fn.type: unknown loss type .*Did you mean 'CrossEntropyLoss'"),
    (dict(metrics={"acc": dict(type="Acc")}), r"metrics.acc.type: unknown metric type"),
    (dict(hooks=[dict(type="EarlyStopHook")]), r"hooks\[0\].type: unknown hook type .*Did you mean 'EarlyStoppingHook'"),
])
def test_bad_config_dicts_fail_at_construction_naming_the_key(changes, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        treadle.Trainer(**{**copy.deepcopy(SPECS), **changes}, **REST, work_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_model_of_another_type_is_refused():
    with pytest.raises(TypeError, match=r'model: wrong type list \(got \[Linear\(in_features=2, out_features=2, bias=True\)\]\); '
                                        r'expected a component spec such as \{typ'):
        treadle.Trainer([nn.Linear(2, 2)])


def test_ema_start_iter_is_another_name_for_start():
    averages = []
    for key in ("start", "start_iter"):
        seed_everything(0)
        t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(16), batch_size=4),
                            loss_fn=nn.CrossEntropyLoss(), max_iters=6, optimizer=dict(type="SGD", lr=0.1),
                            ema={"momentum": 0.5, key: 3}, progress=False)
        (hook,) = [h for h in t.hooks if isinstance(h, treadle.hooks.EMAHook)]
        assert hook.start == 3
        t.fit()
        averages.append(t.ema.state_dict())
    for name, value in averages[0].items():
        assert torch.equal(value, averages[1][name]), name


def test_ema_start_and_start_iter_together_is_an_error():
    with pytest.raises(ValueError, match="ema: give start or start_iter"):
        treadle.Trainer(TinyNet(), train_dataloader=[], loss_fn=nn.CrossEntropyLoss(), max_iters=1,
                        optimizer=dict(type="SGD", lr=0.1), ema=dict(start=1, start_iter=1))


def test_loaders_are_checked_for_iterability_only():
    from treadle.engine.spec import check_loader

    class Indexed:  # iterable through __getitem__, as Python's iter() allows
        def __getitem__(self, i):
            raise IndexError

    for ok in ([(torch.zeros(1), torch.zeros(1))], (b for b in []), Indexed(), DataLoader(make_data(4)),
               dict(dataset=dict(type="support.make_data"))):  # a dict is a config, checked when it is built
        check_loader("train_dataloader", ok)
    for bad, shown in ((5, "5 (int)"), ("data/", "'data/' (str)"), (object(), "<object object at")):
        with pytest.raises(TypeError, match=re.escape(f"train_dataloader={shown}")):
            check_loader("train_dataloader", bad)


def test_resume_accepts_bools_and_paths_only(tmp_path):
    from treadle.engine.spec import check_resume

    assert check_resume(False) is False and check_resume(True) is True
    assert check_resume(tmp_path) == tmp_path and check_resume("ckpt") == "ckpt"
    for bad in (None, "", 0, 1, ["ckpt"]):
        with pytest.raises(TypeError, match=r"resume=.*; expected False, True \(the newest checkpoint in work_dir\) or a "
                                            r"checkpoint path"):
            check_resume(bad)


def test_a_work_dir_that_is_a_file_is_refused_by_the_constructor(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(ValueError, match=r"^work_dir='.*notes.txt' is a file; expected a directory"):
        treadle.Trainer(TinyNet(), work_dir=path)
    assert path.read_text() == "mine"  # nothing on disk is touched


@pytest.mark.parametrize("load_from, says", [
    ("https://download.openmmlab.com/x/model.pth", "a URL; treadle reads local files only"),
    ("no/such/file.pth", "no such file or checkpoint")])
def test_load_from_that_is_not_a_local_file_is_one_line_before_anything_runs(tmp_path, load_from, says):
    """MMEngine configs name released weights by URL: treadle downloads nothing during a run
    and says so, with the way to fetch it."""
    with pytest.raises(FileNotFoundError, match=re.escape(says)) as e:
        treadle.Trainer(nn.Linear(2, 2), load_from=load_from, work_dir=tmp_path / "run")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()
