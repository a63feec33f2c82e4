"""model_summary counts parameters per module; ModelSummaryHook logs it once."""

from __future__ import annotations

import logging

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.hooks.summary import ModelSummaryHook, model_summary

from support import TinyNet, make_data


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))  # 40 + 72
        self.head = nn.Linear(8, 2)  # 18
        self.tied = self.head  # shared: counted once
        for p in self.backbone[0].parameters():
            p.requires_grad_(False)


def rows(text):
    return {line.split()[0]: line.split() for line in text.splitlines() if line.strip() and not line.startswith("-")}


def test_counts_per_module_and_totals():
    text = model_summary(Net(), max_depth=2)
    r = rows(text)
    assert r["backbone"][1:] == ["Sequential", "112", "72"]
    assert r["backbone.0"][1:] == ["Linear", "40", "0"] and r["backbone.2"][1:] == ["Linear", "72", "72"]
    assert r["head"][1:] == ["Linear", "18", "18"] and "backbone.1" in r and "tied" not in r
    assert "Net: 130 parameters (90 trainable, 40 frozen)" in text


def test_max_depth_limits_rows():
    assert "backbone.0" not in rows(model_summary(Net(), max_depth=1))
    only_totals = model_summary(Net(), max_depth=0)
    assert only_totals.startswith("Net: 130 parameters") and "\n" not in only_totals
    with pytest.raises(ValueError):
        model_summary(Net(), max_depth=-1)


def test_hook_logs_once(caplog):
    t = treadle.Trainer(TinyNet(), train_dataloader=DataLoader(make_data(8), batch_size=4),
                        val_dataloader=DataLoader(make_data(4), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=1, hooks=[ModelSummaryHook(max_depth=1)])
    with caplog.at_level(logging.INFO, logger="treadle"):
        t.fit()
        t.validate()
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model summary")]
    assert len(summaries) == 1
    assert "fc1" in summaries[0] and "TinyNet: 163 parameters (163 trainable, 0 frozen)" in summaries[0]
