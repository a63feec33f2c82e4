"""Parameter-wise options (MMEngine's paramwise_cfg rules) and optimizers by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import treadle
from treadle.optim.builder import build_optimizer


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, groups=4))
        self.head = nn.Linear(4, 2)
        self.norm = nn.LayerNorm(2)


def options_by_param(opt, model):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


def test_norm_and_bias_decay_and_custom_keys():
    model = Net()
    opt = build_optimizer(dict(type="SGD", lr=0.1, weight_decay=0.01, paramwise=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0, bias_lr_mult=2.0, dwconv_decay_mult=0.5,
        custom_keys={"head": dict(lr_mult=0.1, decay_mult=3.0)})), model)
    got = options_by_param(opt, model)
    assert got == {
        "backbone.0.weight": (0.1, 0.01),
        "backbone.0.bias": (0.2, 0.0),          # bias: bias_lr_mult and bias_decay_mult
        "backbone.1.weight": (0.1, 0.0),        # BatchNorm: norm_decay_mult
        "backbone.1.bias": (0.1, 0.0),          # norm bias: no bias_lr_mult
        "backbone.2.weight": (0.1, 0.005),      # depth-wise conv
        "backbone.2.bias": (0.2, 0.005),
        "head.weight": (pytest.approx(0.01), pytest.approx(0.03)),  # custom key wins over every other rule
        "head.bias": (pytest.approx(0.01), pytest.approx(0.03)),
        "norm.weight": (0.1, 0.0),
        "norm.bias": (0.1, 0.0),
    }
    # equal options share a group
    assert len(opt.param_groups) == 6


def test_longest_custom_key_wins_and_extra_keys_are_copied():
    model = Net()
    opt = build_optimizer(dict(type="SGD", lr=1.0, weight_decay=0.0, paramwise=dict(custom_keys={
        "backbone": dict(lr_mult=0.5), "backbone.1": dict(lr_mult=0.25, momentum=0.5)})), model)
    groups = {id(p): g for g in opt.param_groups for p in g["params"]}
    assert groups[id(model.backbone[1].weight)]["lr"] == 0.25 and groups[id(model.backbone[1].weight)]["momentum"] == 0.5
    assert groups[id(model.backbone[0].weight)]["lr"] == 0.5
    assert groups[id(model.head.weight)]["lr"] == 1.0


def test_frozen_parameters_are_left_out():
    model = Net()
    model.head.requires_grad_(False)
    opt = build_optimizer(dict(type="AdamW", lr=1e-3, weight_decay=0.1, paramwise=dict(norm_decay_mult=0.0)), model)
    params = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.head.weight) not in params and id(model.backbone[0].weight) in params


@pytest.mark.parametrize("cfg,match", [
    (dict(type="SGD", lr=0.1, paramwise=dict(norm_decay_mult=0.0)), "needs an explicit weight_decay"),
    (dict(type="SGD", lr=0.1, weight_decay=0.1, paramwise=dict(nrom_decay_mult=0.0)), r"unknown keys \['nrom_decay_mult'\]"),
    (dict(type="SGD", lr=0.1, weight_decay=0.1, paramwise=dict(custom_keys=["head"])), "custom_keys must be a dict"),
])
def test_paramwise_errors(cfg, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build_optimizer(cfg, Net())


def test_trainer_accepts_mmengine_paramwise_cfg_key():
    t = treadle.Trainer(Net(), optimizer=dict(type="SGD", lr=0.1, weight_decay=0.01, paramwise_cfg=dict(bias_decay_mult=0.0)))
    wds = sorted({g["weight_decay"] for g in t.optimizer.param_groups})
    assert wds == [0.0, 0.01]
