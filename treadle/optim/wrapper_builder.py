"""Optimizer wrappers for ``Strategy.prepare``: one, or several by name, and MMEngine's
``auto_scale_lr``.

    build_optim_wrappers(dict(optimizer=dict(type="AdamW", lr=1e-3)), model)
        -> {"default": OptimWrapper}
    build_optim_wrappers({"gen": dict(optimizer=...), "disc": dict(optimizer=...)}, model)
        -> {"gen": ..., "disc": ...}   # a config optimizes the model's submodule of that name

Each entry is what :func:`treadle.optim.wrapper.build_optim_wrapper` takes: an
``optim_wrapper`` dict, an Optimizer or an OptimWrapper. MMEngine's
``constructor="MultiOptimWrapperConstructor"`` key of a by-name dict is accepted.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from treadle.logging.writers import get_logger
from treadle.optim.wrapper import WRAPPER_KEYS, OptimWrapper, build_optim_wrapper

_MULTI = "MultiOptimWrapperConstructor"


def by_name(cfg: Any) -> bool:
    """``cfg`` gives several wrappers by name (not one ``optim_wrapper`` dict)."""
    if not isinstance(cfg, Mapping) or not cfg:
        return False
    entries = {k: v for k, v in cfg.items() if not (k == "constructor" and v == _MULTI)}
    return bool(entries) and not set(entries) & set(WRAPPER_KEYS) and all(
        isinstance(v, (Mapping, torch.optim.Optimizer, OptimWrapper)) for v in entries.values())


def build_optim_wrappers(cfg: Any, module: nn.Module, *, device_type: str = "cpu") -> dict[str, OptimWrapper]:
    """``{name: OptimWrapper}``: ``{"default": ...}`` for one wrapper, else one per name
    (a config entry optimizes ``module``'s submodule of that name; an Optimizer or
    OptimWrapper entry is used as it is)."""
    if not by_name(cfg):
        return {"default": build_optim_wrapper(cfg, module, device_type=device_type)}
    built = {}
    for name, entry in cfg.items():
        if name == "constructor" and entry == _MULTI:
            continue
        params: Any = module
        if isinstance(entry, Mapping):
            params = getattr(module, str(name), None)
            if not isinstance(params, nn.Module):
                raise ValueError(f"optimizer[{name!r}] is a config, so the model needs a submodule named {name!r} "
                                 "to optimize; give an Optimizer object instead")
        try:
            built[str(name)] = build_optim_wrapper(entry, params, device_type=device_type)
        except (TypeError, ValueError) as e:
            raise type(e)(f"optimizer[{name!r}]: {e}") from None
    return built


def check_optimizes(module: nn.Module, wrappers: Mapping[str, OptimWrapper]) -> None:
    """Refuse optimizers that hold none of ``module``'s trainable parameters (built over
    another model's: training would change nothing of this one), and say which
    trainable parameters no optimizer holds (they will not train)."""
    trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not trainable or not wrappers:
        return
    held = {id(p) for ow in wrappers.values() for g in ow.optimizer.param_groups for p in g["params"]}
    missing = [(name, p) for name, p in trainable if id(p) not in held]
    if len(missing) == len(trainable):
        own = {id(p) for p in module.parameters()}
        foreign = len(held - own)
        raise ValueError(f"the optimizer holds none of the model's {len(trainable)} trainable parameter tensors "
                         f"({sum(p.numel() for _, p in trainable):,} values) but {foreign} tensor(s) of another "
                         "model: training would not change this one. Build it over this model's parameters "
                         "(e.g. optimizer=dict(type='AdamW', lr=...), which the Trainer builds over the model)")
    if missing:
        names = [name for name, _ in missing]
        shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
        get_logger().warning(f"{len(missing)} of the model's {len(trainable)} trainable parameter tensors "
                             f"({sum(p.numel() for _, p in missing):,} values) are in no optimizer and will not "
                             f"train: {shown}; freeze them (requires_grad_(False)) or give them to an optimizer")


def scale_lr(cfg: Any, wrappers: Mapping[str, OptimWrapper], batch_size: Any, world_size: int) -> None:
    """MMEngine's ``auto_scale_lr``: every lr times ``world_size * batch_size /
    base_batch_size`` (``enable`` defaults to True here; MMEngine configs are translated
    with their own default). Before any scheduler is built: they record the initial lr."""
    if not isinstance(cfg, dict) or "base_batch_size" not in cfg or set(cfg) - {"base_batch_size", "enable"}:
        raise ValueError(f"auto_scale_lr={cfg!r} must be dict(base_batch_size=N[, enable=True])")
    enable = cfg.get("enable", True)
    if not isinstance(enable, bool):
        raise TypeError(f"auto_scale_lr enable must be True or False, got {enable!r}")
    if not enable:
        return
    base = cfg["base_batch_size"]
    if isinstance(base, bool) or not isinstance(base, int) or base < 1 or not batch_size:
        raise ValueError(f"auto_scale_lr needs a positive int base_batch_size (got {base!r}) and a train DataLoader "
                         f"with a batch_size (got {batch_size!r})")
    ratio = world_size * batch_size / base
    for ow in wrappers.values():
        for group in ow.param_groups:
            group["lr"] = group["lr"] * ratio
    get_logger().info(f"auto_scale_lr: lr scaled by {ratio:g} = {world_size} process(es) x batch {batch_size} / "
                      f"base {base}")


__all__ = ["build_optim_wrappers", "by_name", "scale_lr"]
