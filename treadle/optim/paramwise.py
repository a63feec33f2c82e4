"""Parameter-wise optimizer options, with MMEngine's ``paramwise_cfg`` rules.

``optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.05, paramwise=dict(
norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={"backbone": dict(lr_mult=0.1)}))``

For each parameter, named ``<module path>.<name>``:
* the longest ``custom_keys`` key contained in the name (ties: alphabetical) sets
  ``lr = lr * lr_mult`` and ``weight_decay = weight_decay * decay_mult``; any other
  entry of that key is copied into the group; no other rule applies then;
* otherwise a ``bias`` outside norm layers gets ``bias_lr_mult``; the weight decay of
  norm layers (BatchNorm, InstanceNorm, GroupNorm, LayerNorm) is scaled by
  ``norm_decay_mult``, of depth-wise convolutions by ``dwconv_decay_mult``, and of
  other biases by ``bias_decay_mult``.
Parameters that end with the same options share one group (MMEngine makes one group
per parameter; the values are identical, the optimizer just runs fewer groups).
Frozen parameters (``requires_grad=False``) are left out.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

PARAMWISE_KEYS = ("custom_keys", "bias_lr_mult", "bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult", "bypass_duplicate")
_NORMS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)


def check_paramwise(cfg: Any, base_wd: float | None, where: str = "optimizer.paramwise") -> dict[str, Any]:
    """Validate a paramwise dict, naming the bad key."""
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} must be a dict, got {type(cfg).__name__}")
    unknown = set(cfg) - set(PARAMWISE_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}; expected some of {list(PARAMWISE_KEYS)}")
    custom = cfg.get("custom_keys", {})
    if not isinstance(custom, dict) or not all(isinstance(v, dict) for v in custom.values()):
        raise TypeError(f"{where}.custom_keys must be a dict of dicts such as {{'backbone': dict(lr_mult=0.1)}}, got {custom!r}")
    wants_wd = any(k in cfg for k in ("bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult")) or any(
        "decay_mult" in v for v in custom.values())
    if wants_wd and base_wd is None:
        raise ValueError(f"{where} scales weight decay, so the optimizer config needs an explicit weight_decay")
    return cfg


def build_param_groups(module: nn.Module, lr: float, weight_decay: float | None, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Param groups for ``module`` following the rules in this module's docstring."""
    custom = cfg.get("custom_keys", {})
    keys = sorted(sorted(custom), key=len, reverse=True)
    bias_lr = cfg.get("bias_lr_mult", 1.0)
    bias_wd = cfg.get("bias_decay_mult", 1.0)
    norm_wd = cfg.get("norm_decay_mult", 1.0)
    dw_wd = cfg.get("dwconv_decay_mult", 1.0)
    groups: dict[tuple, dict[str, Any]] = {}
    seen: set[int] = set()
    for prefix, mod in module.named_modules():
        is_norm = isinstance(mod, _NORMS)
        is_dw = isinstance(mod, nn.Conv2d) and mod.in_channels == mod.groups
        for name, p in mod.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:  # shared parameters are optimized once
                continue
            seen.add(id(p))
            opts: dict[str, Any] = {"lr": lr}
            if weight_decay is not None:
                opts["weight_decay"] = weight_decay
            full = f"{prefix}.{name}"
            key = next((k for k in keys if k in full), None)
            if key is not None:
                rule = custom[key]
                opts["lr"] = lr * rule.get("lr_mult", 1.0)
                if weight_decay is not None:
                    opts["weight_decay"] = weight_decay * rule.get("decay_mult", 1.0)
                opts.update({k: v for k, v in rule.items() if k not in ("lr_mult", "decay_mult", "requires_grad")})
            else:
                if name == "bias" and not is_norm:
                    opts["lr"] = lr * bias_lr
                if weight_decay is not None:
                    if is_norm:
                        opts["weight_decay"] = weight_decay * norm_wd
                    elif is_dw:
                        opts["weight_decay"] = weight_decay * dw_wd
                    elif name == "bias":
                        opts["weight_decay"] = weight_decay * bias_wd
            sig = tuple(sorted((k, repr(v)) for k, v in opts.items()))
            groups.setdefault(sig, {"params": [], **opts})["params"].append(p)
    return list(groups.values())
