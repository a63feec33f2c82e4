"""A non-finite or negative optimizer argument, or an empty work_dir, is refused when the
Trainer is built, in one line naming the key as it was written; metrics= with nothing to
compute them on is said in one warning."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.optim.builder import build_optimizer

from support import TinyNet, make_data


def _trainer(**kw):
    args = dict(train_dataloader=DataLoader(make_data(16), batch_size=8), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_iters=2, progress=False, log_writers=[])
    return treadle.Trainer(TinyNet(), **{**args, **kw})


@pytest.mark.parametrize("optimizer, message", [
    (dict(type="SGD", lr=math.nan), "optimizer.lr=nan; expected a finite number >= 0"),
    (dict(type="SGD", lr=-0.1), "optimizer.lr=-0.1; expected a finite number >= 0"),
    (dict(type="AdamW", lr=math.inf), "optimizer.lr=inf; expected a finite number >= 0"),
    (dict(type="SGD", lr=0.1, weight_decay=math.nan), "optimizer.weight_decay=nan; expected a finite number >= 0"),
    (dict(type="SGD", lr=0.1, momentum=math.nan), "optimizer.momentum=nan; expected a finite number >= 0"),
    (dict(type="Adam", lr=0.1, betas=(0.9, math.nan)), "optimizer.betas=(0.9, nan); expected finite numbers"),
    ({"net": dict(type="SGD", lr=math.nan)}, "optimizer.net.lr=nan; expected a finite number >= 0"),
])
def test_a_non_finite_or_negative_optimizer_argument_is_refused_at_build_naming_it(optimizer, message):
    with pytest.raises(ValueError) as e:
        _trainer(optimizer=optimizer)
    assert str(e.value) == message


def test_the_optimizer_builder_refuses_nan_naming_where():
    with pytest.raises(ValueError, match=r"^optim_wrapper.optimizer.lr=nan; expected a finite number >= 0$"):
        build_optimizer(dict(type="SGD", lr=math.nan), nn.Linear(2, 2), where="optim_wrapper.optimizer")
    opt = build_optimizer(dict(type="SGD", lr=0.0, momentum=0.9), nn.Linear(2, 2))  # zero is a valid lr
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["lr"] == 0.0


@pytest.mark.parametrize("work_dir", ["", "  "])
def test_an_empty_work_dir_is_refused_in_one_line(tmp_path, monkeypatch, work_dir):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        _trainer(work_dir=work_dir).fit()
    assert str(e.value).splitlines() == [f"work_dir={work_dir!r}; expected a directory path for the run's logs and "
                                         "checkpoints (None: log to the console only)"]
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


def test_metrics_without_a_val_or_test_loader_warn_once_at_build(caplog):
    with caplog.at_level("WARNING", logger="treadle"):
        _trainer(metrics={"acc": treadle.Accuracy()})
    said = [r.getMessage() for r in caplog.records if "will not be computed" in r.getMessage()]
    assert said == ["metrics= ['acc'] will not be computed: there is no val_dataloader or test_dataloader "
                    "(metrics are computed on those; train_metrics= on the training batches)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="treadle"):
        _trainer(metrics={"acc": treadle.Accuracy()}, val_dataloader=DataLoader(make_data(8), batch_size=8))
    assert not [r for r in caplog.records if "will not be computed" in r.getMessage()]
