"""Parameter-wise optimizer options, with MMEngine's ``paramwise_cfg`` rules.

``optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.05, paramwise=dict(
norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={"backbone": dict(lr_mult=0.1)}))``

The model is walked as MMEngine's ``DefaultOptimWrapperConstructor`` walks it: a
module's own parameters, then each child's, depth first. Each parameter is matched by
``<module path>.<name>`` (``.weight`` for a parameter of the model itself), and:

* a frozen one (``requires_grad=False``) is left out;
* one met before (tied weights, a module used twice) is an error, unless
  ``bypass_duplicate`` is true: it is then optimized once, with the options of the
  first name it was met under;
* if a ``custom_keys`` key is contained in the name (the longest key first, ties in
  alphabetical order), ``lr = lr * lr_mult`` and ``weight_decay = weight_decay *
  decay_mult`` (each 1 when not given), and every entry of that key, the multipliers
  included, is copied into the parameter's options; no other rule applies then;
* otherwise each rule below applies only when its multiplier is given (a rule whose
  multiplier is absent is skipped, and the next one is tried):

  - learning rate: a ``bias`` outside norm layers gets ``lr * bias_lr_mult``; a
    parameter of a ``Conv2d`` whose path contains ``conv_offset`` and whose parent is
    one of mmcv's deformable convolutions gets ``lr * dcn_offset_lr_mult``;
  - weight decay, the first rule that applies, in this order: a parameter of a norm
    layer (BatchNorm, InstanceNorm, GroupNorm, LayerNorm) ``norm_decay_mult``; a
    ``bias`` ``bias_decay_mult``; a parameter of a depth-wise ``Conv2d`` (``groups ==
    in_channels``, which includes a conv with one input channel)
    ``dwconv_decay_mult``; a one-dimensional parameter (a layer-scale ``gamma``, a
    position or class token of shape ``(d,)``) ``flat_decay_mult``.

  The direct children of a deformable convolution (mmcv's ``DeformConv2d``,
  ``ModulatedDeformConv2d`` and their subclasses such as ``DeformConv2dPack``, known by
  class name so that mmcv need not be installed) are exempt from ``bias_lr_mult``,
  ``bias_decay_mult`` and ``flat_decay_mult``, as in MMEngine.

Skipped parameters (frozen ones, and duplicates under ``bypass_duplicate``) are named in
one warning each on the ``treadle`` logger.

Weight-decay multipliers need the optimizer's ``weight_decay`` (an error otherwise;
MMEngine ignores ``flat_decay_mult`` then). Parameters that end with the same options
share one group (MMEngine makes one group per parameter; every parameter's values are
the same, the optimizer just runs fewer groups).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

MULTIPLIERS = ("bias_lr_mult", "bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult", "flat_decay_mult",
               "dcn_offset_lr_mult")
PARAMWISE_KEYS = ("custom_keys", *MULTIPLIERS, "bypass_duplicate")
DECAY_MULTIPLIERS = ("bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult", "flat_decay_mult")
_NORMS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)
_DCN_CLASSES = ("DeformConv2d", "ModulatedDeformConv2d")  # mmcv.ops' deformable convolutions
_SHOWN = 8  # names listed in a skip warning

logger = logging.getLogger(__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_paramwise(cfg: Any, base_wd: float | None, where: str = "optimizer.paramwise",
                    options: Iterable[str] | None = None) -> dict[str, Any]:
    """Validate a paramwise dict, naming the bad key. ``options``: the optimizer's own
    argument names, which a ``custom_keys`` entry may set besides ``lr_mult`` and
    ``decay_mult`` (None: any name)."""
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} must be a dict, got {type(cfg).__name__}")
    unknown = set(cfg) - set(PARAMWISE_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}; expected some of {list(PARAMWISE_KEYS)}")
    for key in MULTIPLIERS:
        if key in cfg and not _is_number(cfg[key]):
            raise TypeError(f"{where}.{key} must be a number, got {cfg[key]!r}")
    if "bypass_duplicate" in cfg and not isinstance(cfg["bypass_duplicate"], bool):
        raise TypeError(f"{where}.bypass_duplicate must be true or false, got {cfg['bypass_duplicate']!r}")
    custom = cfg.get("custom_keys", {})
    if not isinstance(custom, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in custom.items()):
        raise TypeError(f"{where}.custom_keys must be a dict of dicts such as {{'backbone': dict(lr_mult=0.1)}}, got {custom!r}")
    allowed = None if options is None else {"lr_mult", "decay_mult", *options}
    for name, rule in custom.items():
        for key in ("lr_mult", "decay_mult"):
            if key in rule and not _is_number(rule[key]):
                raise TypeError(f"{where}.custom_keys[{name!r}].{key} must be a number, got {rule[key]!r}")
        bad = sorted(set(rule) - allowed) if allowed is not None else []
        if bad:
            raise ValueError(f"{where}.custom_keys[{name!r}] has unknown keys {bad}; expected lr_mult, decay_mult "
                             f"or the optimizer's options {sorted(allowed - {'lr_mult', 'decay_mult', 'params'})}")
    wants_wd = [k for k in DECAY_MULTIPLIERS if k in cfg] + [f"custom_keys[{k!r}].decay_mult"
                                                            for k, v in custom.items() if "decay_mult" in v]
    if wants_wd and base_wd is None:
        raise ValueError(f"{where} scales weight decay ({', '.join(wants_wd)}), so the optimizer config needs an "
                         "explicit weight_decay")
    return cfg


def is_deformable_conv(module: nn.Module) -> bool:
    """Whether ``module`` is one of mmcv's deformable convolutions (or a subclass), by class
    name and package, without importing mmcv."""
    return any(c.__name__ in _DCN_CLASSES and c.__module__.split(".")[0] == "mmcv" for c in type(module).__mro__)


def _walk(module: nn.Module, prefix: str = "", in_dcn: bool = False) -> Iterator[tuple[str, nn.Module, bool]]:
    """``(path, module, parent is deformable)`` in MMEngine's order: the module, then each
    child's walk. A module reached along two paths is walked twice (its parameters are
    then met twice)."""
    yield prefix, module, in_dcn
    dcn = is_deformable_conv(module)
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}.{name}" if prefix else name, dcn)


def _options(name: str, p: nn.Parameter, mod: nn.Module, prefix: str, in_dcn: bool, key: str | None, lr: float,
             weight_decay: float | None, cfg: dict[str, Any]) -> dict[str, Any]:
    """One trainable parameter's options (see the module's docstring)."""
    opts: dict[str, Any] = {"lr": lr}
    if weight_decay is not None:
        opts["weight_decay"] = weight_decay
    if key is not None:
        rule = cfg["custom_keys"][key]
        opts["lr"] = lr * rule.get("lr_mult", 1.0)
        if weight_decay is not None:
            opts["weight_decay"] = weight_decay * rule.get("decay_mult", 1.0)
        opts.update(rule)
        return opts
    is_norm = isinstance(mod, _NORMS)
    is_bias = name == "bias"
    if is_bias and not (is_norm or in_dcn) and cfg.get("bias_lr_mult") is not None:
        opts["lr"] = lr * cfg["bias_lr_mult"]
    if in_dcn and "conv_offset" in prefix and isinstance(mod, nn.Conv2d) and cfg.get("dcn_offset_lr_mult") is not None:
        opts["lr"] = lr * cfg["dcn_offset_lr_mult"]
    if weight_decay is None:
        return opts
    is_dw = isinstance(mod, nn.Conv2d) and mod.in_channels == mod.groups
    for applies, mult in ((is_norm, "norm_decay_mult"), (is_bias and not in_dcn, "bias_decay_mult"),
                          (is_dw, "dwconv_decay_mult"), (p.ndim == 1 and not in_dcn, "flat_decay_mult")):
        if applies and cfg.get(mult) is not None:
            opts["weight_decay"] = weight_decay * cfg[mult]
            break
    return opts


def _warn_skipped(where: str, names: list[str], why: str) -> None:
    if names:
        shown = ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
        logger.warning("%s: %d parameter(s) left out of the optimizer, %s: %s", where, len(names), why, shown)


def build_param_groups(module: nn.Module, lr: float, weight_decay: float | None, cfg: dict[str, Any],
                       where: str = "optimizer.paramwise") -> list[dict[str, Any]]:
    """Param groups for ``module`` following the rules in this module's docstring."""
    custom = cfg.get("custom_keys", {})
    keys = sorted(sorted(custom), key=len, reverse=True)
    groups: dict[tuple, dict[str, Any]] = {}
    first_name: dict[int, str] = {}
    frozen: list[str] = []
    duplicates: list[str] = []
    for prefix, mod, in_dcn in _walk(module):
        for name, p in mod.named_parameters(recurse=False):
            full = f"{prefix}.{name}"  # as MMEngine matches custom keys: ".weight" for the model's own
            shown = full if prefix else name
            if not p.requires_grad:
                frozen.append(shown)
                continue
            if id(p) in first_name:
                if cfg.get("bypass_duplicate", False):
                    duplicates.append(f"{shown} (= {first_name[id(p)]})")
                    continue
                raise ValueError(f"{where}: parameter {shown!r} is the same tensor as {first_name[id(p)]!r} (tied "
                                 "weights or a module used twice); set bypass_duplicate=True to optimize it once, "
                                 "with the options of its first name")
            first_name[id(p)] = shown
            key = next((k for k in keys if k in full), None)
            opts = _options(name, p, mod, prefix, in_dcn, key, lr, weight_decay, cfg)
            sig = tuple(sorted((k, repr(v)) for k, v in opts.items()))
            groups.setdefault(sig, {"params": [], **opts})["params"].append(p)
    _warn_skipped(where, frozen, "frozen (requires_grad=False)")
    _warn_skipped(where, duplicates, "already optimized under another name (bypass_duplicate=True)")
    return list(groups.values())
