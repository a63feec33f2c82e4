"""Parameter-wise options: MMEngine's ``paramwise_cfg`` rules, parameter by parameter.

Every expected value here was checked against MMEngine 0.10.7's
``DefaultOptimWrapperConstructor`` (torch 2.13.0) in a scratch venv: the hand-written
cases below, and ``data/mmengine_paramwise.json``, which
``make_paramwise_reference.py`` wrote from the models and configs of
``tests/paramwise_cases.py`` (17 cases, 396 parameters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import treadle
from paramwise_cases import CASES, build, options_by_name
from treadle.optim.builder import build_optimizer

REFERENCE = json.loads((Path(__file__).parent / "data" / "mmengine_paramwise.json").read_text())


def _close(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        got[k] == pytest.approx(v) if isinstance(v, float) else got[k] == v for k, v in want.items())


@pytest.mark.parametrize("case", sorted(CASES))
def test_param_groups_equal_mmengine(case):
    want = REFERENCE["cases"][case]
    model, optimizer, paramwise = build(case)
    if "error" in want:  # MMEngine: torch refuses a parameter in two groups
        with pytest.raises(ValueError, match="bypass_duplicate=True"):
            build_optimizer({**optimizer, "paramwise": paramwise}, model)
        return
    got = options_by_name(model, build_optimizer({**optimizer, "paramwise": paramwise}, model))
    assert got.keys() == want["params"].keys()  # frozen ones left out, a tied one once
    wrong = {name: (got[name], opts) for name, opts in want["params"].items() if not _close(got[name], opts)}
    assert not wrong, f"{len(wrong)} of {len(got)} parameters differ from MMEngine (treadle, mmengine): {wrong}"


def test_reference_covers_every_case():
    assert REFERENCE["mmengine"] == "0.10.7" and sorted(REFERENCE["cases"]) == sorted(CASES)
    assert sum(len(c.get("params", {})) for c in REFERENCE["cases"].values()) == 396


def _wd(case: str, **paramwise) -> dict[str, float]:
    model, optimizer, base = build(case)
    opt = build_optimizer({**optimizer, "paramwise": paramwise or base}, model)
    return {n: o.get("weight_decay") for n, o in options_by_name(model, opt).items()}


def test_a_rule_applies_only_when_its_multiplier_is_set():
    # Only bias_decay_mult: BatchNorm biases take it (no norm rule to stop them), weights keep full decay.
    wd = _wd("resnet-bias-0")
    assert wd["layer1.0.bn1.bias"] == 0.0 and wd["layer1.0.bn1.weight"] == 1e-4
    # Only dwconv_decay_mult: the depth-wise conv's weight and bias take it; norms and other biases keep 0.05.
    wd = _wd("convnext-dw-only")
    assert wd["stages.0.dwconv.weight"] == wd["stages.0.dwconv.bias"] == pytest.approx(0.025)
    assert wd["stages.0.norm.weight"] == wd["head.bias"] == 0.05


def test_rule_order_norm_bias_depthwise_flat():
    wd = _wd("convnext-bias-before-dw")  # bias_decay_mult=0.1, dwconv_decay_mult=0.5
    assert wd["stages.0.dwconv.bias"] == pytest.approx(0.005)   # bias before depth-wise
    assert wd["stages.0.dwconv.weight"] == pytest.approx(0.025)
    wd = _wd("convnext-norm-flat")  # norm 0.2, flat 0.3, custom .gamma 0
    assert wd["stages.0.norm.bias"] == pytest.approx(0.01)      # norm before flat
    assert wd["stages.0.pwconv1.bias"] == pytest.approx(0.015)  # a 1-D bias with no bias rule: flat
    assert wd["stages.0.gamma"] == 0.0                          # the custom key before every rule


def test_single_input_channel_conv_is_depthwise():
    wd = _wd("resnet-dw-only")  # dwconv_decay_mult=0.5
    assert wd["single.weight"] == wd["single.bias"] == pytest.approx(5e-5)  # Conv2d(1, 4): groups == in_channels
    assert wd["layer1.0.conv1.weight"] == 1e-4


def test_flat_decay_mult_covers_layer_scale_and_one_dim_params():
    wd = _wd("convnext-flat-only")
    assert wd["stages.0.gamma"] == wd["stages.0.norm.weight"] == wd["head.bias"] == 0.0
    assert wd["head.weight"] == wd["stages.0.dwconv.weight"] == 0.05


def test_custom_keys_longest_first_ties_alphabetical_and_options_copied():
    model, optimizer, paramwise = build("swin-custom-precedence")
    opt = build_optimizer({**optimizer, "paramwise": paramwise}, model)
    got = options_by_name(model, opt)
    assert got["blocks.0.attn.qkv.bias"] == {"lr": 0.00025, "weight_decay": 0.1, "lr_mult": 0.25, "decay_mult": 2.0}
    assert got["blocks.1.norm1.bias"] == {"lr": 0.0005, "weight_decay": 0.05, "lr_mult": 0.5}
    # "bias" and "norm" have 4 letters: "bias" first, alphabetically; no other rule then (not bias_lr_mult).
    assert got["patch_norm.bias"] == {"lr": pytest.approx(0.004), "weight_decay": 0.05, "lr_mult": 4.0}
    assert got["head.weight"] == {"lr": pytest.approx(0.01), "weight_decay": 0.05, "lr_mult": 10.0, "eps": 1e-6}
    assert got["patch_norm.weight"] == {"lr": 0.001, "weight_decay": 0.0, "decay_mult": 0.0}


def test_tied_weights_need_bypass_duplicate_and_frozen_ones_are_left_out():
    model, optimizer, _ = build("mixed-bypass")
    with pytest.raises(ValueError, match=r"parameter 'branch.0.weight' is the same tensor as 'shared.weight'.*bypass_dup"):
        build_optimizer({**optimizer, "paramwise": {"norm_decay_mult": 0.0}}, model)
    opt = build_optimizer({**optimizer, "paramwise": {"bypass_duplicate": True}}, model)
    optimized = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(optimized) == len(set(optimized))
    assert id(model.embed.weight) in optimized and id(model.frozen.weight) not in optimized
    # Without paramwise options (or empty ones), tied weights are simply optimized once.
    for cfg in ({**optimizer}, {**optimizer, "paramwise": {}}):
        opt = build_optimizer(cfg, model)
        assert sum(p is model.embed.weight for g in opt.param_groups for p in g["params"]) == 1


def test_equal_options_share_a_group():
    model, optimizer, paramwise = build("resnet-norm-bias-0")
    opt = build_optimizer({**optimizer, "paramwise": paramwise}, model)
    assert len(opt.param_groups) == 2  # MMEngine: one group per parameter, same values
    assert REFERENCE["cases"]["resnet-norm-bias-0"]["groups"] == len(options_by_name(model, opt))


def test_no_weight_decay_leaves_weight_decay_to_the_optimizer():
    model, optimizer, paramwise = build("mixed-no-weight-decay")
    opt = build_optimizer({**optimizer, "paramwise": paramwise}, model)
    assert {g["weight_decay"] for g in opt.param_groups} == {0}  # SGD's default
    got = options_by_name(model, opt)
    assert got["embed.weight"]["lr"] == pytest.approx(0.01) and got["scale.bias"]["lr"] == 0.2


@pytest.mark.parametrize("paramwise, match", [
    ({"norm_decay_mult": 0.0}, r"scales weight decay \(norm_decay_mult\), so the optimizer config needs an explicit"),
    ({"flat_decay_mult": 0.0}, r"\(flat_decay_mult\)"),
    ({"custom_keys": {"head": {"decay_mult": 0.0}}}, r"custom_keys\['head'\].decay_mult"),
    ({"nrom_decay_mult": 0.0}, r"unknown keys \['nrom_decay_mult'\]"),
    ({"custom_keys": ["head"]}, "custom_keys must be a dict"),
    ({"custom_keys": {"head": {"lr_mul": 0.1}}}, r"custom_keys\['head'\] has unknown keys \['lr_mul'\]; expected lr_mult"),
    ({"custom_keys": {"head": {"lr_mult": "0.1"}}}, r"custom_keys\['head'\].lr_mult must be a number"),
    ({"bias_lr_mult": None}, "bias_lr_mult must be a number"),
    ({"bypass_duplicate": 1}, "bypass_duplicate must be true or false"),
    ({"dcn_offset_lr_mult": "0.1"}, "dcn_offset_lr_mult must be a number"),
])
def test_paramwise_errors(paramwise, match):
    model, _, _ = build("convnext-flat-only")
    with pytest.raises((ValueError, TypeError), match=match):
        build_optimizer({"type": "SGD", "lr": 0.1, "paramwise": paramwise}, model)


def test_custom_key_may_set_an_optimizer_option():
    model, _, _ = build("convnext-flat-only")
    opt = build_optimizer({"type": "SGD", "lr": 0.1, "momentum": 0.9, "paramwise": {
        "custom_keys": {"head": {"momentum": 0.5}}}}, model)
    assert options_by_name(model, opt)["head.weight"]["momentum"] == 0.5


def test_trainer_accepts_mmengine_paramwise_cfg_key():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    t = treadle.Trainer(model, optimizer=dict(type="SGD", lr=0.1, weight_decay=0.01, paramwise_cfg=dict(bias_decay_mult=0.0)))
    by_param = {id(p): g["weight_decay"] for g in t.optimizer.param_groups for p in g["params"]}
    assert by_param[id(model[0].weight)] == 0.01 and by_param[id(model[1].weight)] == 0.01
    assert by_param[id(model[0].bias)] == by_param[id(model[1].bias)] == 0.0
    assert isinstance(t.optimizer, torch.optim.SGD)


class KwargsSGD(torch.optim.SGD):
    def __init__(self, params, lr=0.1, **extra):
        super().__init__(params, lr=lr, **{k: v for k, v in extra.items() if k != "my_option"})


def test_custom_key_options_are_free_for_an_optimizer_taking_any_keyword():
    model, _, _ = build("convnext-flat-only")
    opt = build_optimizer({"type": KwargsSGD, "lr": 0.1, "paramwise": {
        "custom_keys": {"head": {"my_option": 3}}}}, model)
    assert options_by_name(model, opt)["head.weight"]["my_option"] == 3


# Stand-ins for mmcv.ops' deformable convolutions: recognised by class name and package.
class DeformConv2d(nn.Module):
    __module__ = "mmcv.ops.deform_conv"

    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c, c, 3, 3))
        self.bias = nn.Parameter(torch.zeros(c))


class DeformConv2dPack(DeformConv2d):
    __module__ = "mmcv.ops.deform_conv"

    def __init__(self, c: int) -> None:
        super().__init__(c)
        self.conv_offset = nn.Conv2d(c, 18, 3)
        self.scale = nn.Parameter(torch.ones(3))
        self.norm = nn.BatchNorm2d(c)


class DeformNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.dcn = DeformConv2dPack(4)
        self.block = nn.Sequential(DeformConv2dPack(4))
        self.block[0].conv_offset.inner = nn.Sequential(nn.Conv2d(4, 4, 1))  # a grandchild: no exemption
        self.gamma = nn.Parameter(torch.ones(4))


def test_deformable_conv_rules_as_mmengine():
    """Checked against MMEngine 0.10.7 with these classes installed as mmcv.ops: the offset
    conv gets dcn_offset_lr_mult, and a deformable conv's children skip the bias and flat rules."""
    model = DeformNet()
    opt = build_optimizer({"type": "SGD", "lr": 0.01, "weight_decay": 0.9, "paramwise": dict(
        bias_lr_mult=2.0, bias_decay_mult=0.5, flat_decay_mult=0.3, norm_decay_mult=0.0, dcn_offset_lr_mult=0.1)}, model)
    got = {n: (pytest.approx(o["lr"]), pytest.approx(o["weight_decay"])) for n, o in options_by_name(model, opt).items()}
    for dcn in ("dcn", "block.0"):
        assert got[f"{dcn}.weight"] == (0.01, 0.9) and got[f"{dcn}.bias"] == (0.02, 0.45)  # its own: the usual rules
        assert got[f"{dcn}.conv_offset.weight"] == got[f"{dcn}.conv_offset.bias"] == (0.001, 0.9)
        assert got[f"{dcn}.scale"] == (0.01, 0.27) and got[f"{dcn}.norm.bias"] == (0.01, 0.0)
    assert got["block.0.conv_offset.inner.0.bias"] == (0.02, 0.45) and got["gamma"] == (0.01, 0.27)
    assert got["conv.bias"] == (0.02, 0.45)


def test_without_paramwise_frozen_parameters_are_optimized_too():
    """As MMEngine's constructor without paramwise_cfg (model.parameters()): a frozen
    parameter is in the optimizer (no gradient, no update), so unfreezing it later trains it."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model[0].requires_grad_(False)
    opt = build_optimizer({"type": "SGD", "lr": 0.1}, model)
    assert [p for g in opt.param_groups for p in g["params"]] == list(model.parameters())
    before = model[0].weight.detach().clone()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert torch.equal(model[0].weight, before)
    model[0].requires_grad_(True)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, before)
    model.requires_grad_(False)
    assert len(build_optimizer({"type": "SGD", "lr": 0.1}, model).param_groups[0]["params"]) == 4


def test_skipped_parameters_are_named_in_one_warning_each(caplog):
    model, optimizer, _ = build("mixed-bypass")
    with caplog.at_level("WARNING", logger="treadle"):
        build_optimizer({**optimizer, "paramwise": {"bypass_duplicate": True}}, model)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("treadle")]
    assert len(lines) == 2
    assert "frozen (requires_grad=False): frozen.weight" in lines[0]
    assert "bypass_duplicate=True): branch.0.weight (= shared.weight)" in lines[1]
