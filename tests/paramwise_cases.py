"""Small models and ``paramwise_cfg`` cases for comparing treadle's param groups with
MMEngine's ``DefaultOptimWrapperConstructor``.

Only torch is imported here, so the same cases run in treadle's tests and in
``tests/optim/make_paramwise_reference.py`` (a scratch venv with MMEngine), which wrote
``tests/optim/data/mmengine_paramwise.json``. The models are shaped like the backbones
of MMEngine-based classification projects (a ResNet with a frozen stem, a ConvNeXt
with layer-scale ``gamma``, a Swin with position tables) with the layers that the rules
tell apart: norm layers of every kind, depth-wise and single-input-channel convs,
grouped convs that are not depth-wise, 1-D parameters, tied weights, a module used twice.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1), nn.BatchNorm2d(c_out)) if c_in != c_out else None


class TinyResNet(nn.Module):
    """A stem on one input channel (groups == in_channels == 1: MMEngine's depth-wise
    rule applies), frozen like ``frozen_stages=0``; two stages; a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16))
        self.single = nn.Conv2d(1, 4, 3)  # one input channel, with a bias
        self.fc = nn.Linear(16, 10)
        for p in [*self.conv1.parameters(), *self.bn1.parameters()]:
            p.requires_grad_(False)


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pwconv1 = nn.Linear(c, 4 * c)
        self.pwconv2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))  # layer scale: 1-D, not a bias, not in a norm


class TinyConvNeXt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.GroupNorm(1, 8))
        self.stages = nn.Sequential(ConvNeXtBlock(8), ConvNeXtBlock(8))
        self.downsample = nn.Sequential(nn.GroupNorm(1, 8), nn.Conv2d(8, 16, 2, stride=2))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 10)


class WindowAttention(nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.relative_position_bias_table = nn.Parameter(torch.zeros(9, heads))
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)


class SwinBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(c)
        self.attn = WindowAttention(c, 2)
        self.norm2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 2 * c), nn.GELU(), nn.Linear(2 * c, c))


class TinySwin(nn.Module):
    """Parameters of the model itself (``absolute_pos_embed``, 3-D; ``cls_token``, 1-D)
    are named ``.absolute_pos_embed`` by MMEngine when matching custom keys."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 8, 4, stride=4)
        self.patch_norm = nn.LayerNorm(8)
        self.absolute_pos_embed = nn.Parameter(torch.zeros(1, 4, 8))
        self.cls_token = nn.Parameter(torch.zeros(8))
        self.blocks = nn.Sequential(SwinBlock(8), SwinBlock(8))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 10)


class Scale(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))  # 1-D, named weight
        self.bias = nn.Parameter(torch.zeros(c))   # a bias outside any norm or conv


class Mixed(nn.Module):
    """Every other kind of layer: InstanceNorm, BatchNorm1d, Conv1d with groups ==
    in_channels (not a Conv2d, so not depth-wise for MMEngine), a depth-wise Conv2d with
    a channel multiplier, a grouped Conv2d that is not depth-wise, a ConvTranspose2d,
    tied weights (embedding and head), a module reached along two paths, a frozen tied
    parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.bn1d = nn.BatchNorm1d(8)
        self.conv1d_dw = nn.Conv1d(8, 8, 3, groups=8)
        self.dw_mult = nn.Conv2d(4, 8, 3, groups=4)
        self.grouped = nn.Conv2d(4, 8, 3, groups=2)
        self.deconv = nn.ConvTranspose2d(4, 4, 2, groups=4)
        self.scale = Scale(8)
        self.shared = nn.Linear(8, 8)
        self.branch = nn.Sequential(self.shared, nn.ReLU())
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.frozen_again = nn.Sequential(self.frozen)
        self.head = nn.Linear(8, 10)
        self.head.weight = self.embed.weight


MODELS = {"resnet": TinyResNet, "convnext": TinyConvNeXt, "swin": TinySwin, "mixed": Mixed}

_ADAMW = {"type": "AdamW", "lr": 1e-3, "weight_decay": 0.05}
_SGD = {"type": "SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
_POS_TABLES = {".absolute_pos_embed": {"decay_mult": 0.0}, ".relative_position_bias_table": {"decay_mult": 0.0}}

#: ``id: (model, optimizer config, paramwise_cfg)``.
CASES = {
    "resnet-norm-bias-0": ("resnet", _SGD, {"norm_decay_mult": 0.0, "bias_decay_mult": 0.0}),
    "resnet-bias-0": ("resnet", _SGD, {"bias_decay_mult": 0.0}),
    "resnet-norm-0": ("resnet", _SGD, {"norm_decay_mult": 0.0}),
    "resnet-bias-lr-dw": ("resnet", _SGD, {"bias_lr_mult": 2.0, "bias_decay_mult": 0.0, "dwconv_decay_mult": 0.0}),
    "resnet-dw-only": ("resnet", _SGD, {"dwconv_decay_mult": 0.5}),
    "resnet-custom-lr": ("resnet", _SGD, {"custom_keys": {"layer1": {"lr_mult": 0.1}, "fc": {"lr_mult": 10.0}}}),
    "convnext-norm-bias-flat-0": ("convnext", _ADAMW, {"norm_decay_mult": 0.0, "bias_decay_mult": 0.0,
                                                        "flat_decay_mult": 0.0}),
    "convnext-dw-only": ("convnext", _ADAMW, {"dwconv_decay_mult": 0.5}),
    "convnext-bias-before-dw": ("convnext", _ADAMW, {"bias_decay_mult": 0.1, "dwconv_decay_mult": 0.5}),
    "convnext-flat-only": ("convnext", _ADAMW, {"flat_decay_mult": 0.0}),
    "convnext-norm-flat": ("convnext", _ADAMW, {"norm_decay_mult": 0.2, "flat_decay_mult": 0.3,
                                                "custom_keys": {".gamma": {"decay_mult": 0.0}}}),
    "swin-pos-tables": ("swin", _ADAMW, {"norm_decay_mult": 0.0, "bias_decay_mult": 0.0, "flat_decay_mult": 0.0,
                                         "custom_keys": _POS_TABLES}),
    "swin-custom-precedence": ("swin", _ADAMW, {"bias_lr_mult": 3.0, "norm_decay_mult": 0.5, "custom_keys": {
        "blocks": {"lr_mult": 0.5}, "blocks.0": {"lr_mult": 0.25, "decay_mult": 2.0}, "attn": {"lr_mult": 0.1},
        "norm": {"decay_mult": 0.0}, "bias": {"lr_mult": 4.0}, "head": {"lr_mult": 10.0, "eps": 1e-6}}}),
    "mixed-bypass": ("mixed", _ADAMW, {"bypass_duplicate": True, "norm_decay_mult": 0.0, "dwconv_decay_mult": 0.1,
                                       "flat_decay_mult": 0.5, "bias_lr_mult": 0.5}),
    "mixed-bypass-bias": ("mixed", _SGD, {"bypass_duplicate": True, "bias_decay_mult": 0.0, "flat_decay_mult": 2.0}),
    "mixed-no-weight-decay": ("mixed", {"type": "SGD", "lr": 0.1, "momentum": 0.9},
                              {"bypass_duplicate": True, "bias_lr_mult": 2.0, "custom_keys": {"embed": {"lr_mult": 0.1}}}),
    "mixed-tied-without-bypass": ("mixed", _ADAMW, {"norm_decay_mult": 0.0}),
}


def build(case: str) -> tuple[nn.Module, dict, dict]:
    """A fresh model (seeded), the optimizer config and the paramwise config of ``case``."""
    model_name, optimizer, paramwise = CASES[case]
    torch.manual_seed(0)
    return MODELS[model_name](), dict(optimizer), paramwise


def param_names(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> name`` (its first name, as ``named_parameters`` gives it)."""
    return {id(p): n for n, p in model.named_parameters()}


def options_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict]:
    """Each optimized parameter's ``lr``, ``weight_decay`` (when set) and the options that
    differ from the optimizer's defaults (those a custom key copied), by name."""
    names = param_names(model)
    out: dict[str, dict] = {}
    for group in optimizer.param_groups:
        opts = {k: v for k, v in group.items() if k != "params" and (
            k in ("lr", "weight_decay") or k not in optimizer.defaults or v != optimizer.defaults[k])}
        for p in group["params"]:
            assert names[id(p)] not in out, f"{names[id(p)]} in two groups"
            out[names[id(p)]] = opts
    return out
