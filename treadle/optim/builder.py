"""Build optimizers from objects or ``dict(type="AdamW", lr=...)`` configs."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Iterable

import torch
from torch import nn

from treadle.optim.paramwise import build_param_groups, check_paramwise


def optimizer_names() -> list[str]:
    """Every optimizer class that ``torch.optim`` exports."""
    return sorted(n for n, obj in vars(torch.optim).items()
                  if inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer)


def _resolve_type(name: Any, where: str) -> type[torch.optim.Optimizer]:
    if inspect.isclass(name) and issubclass(name, torch.optim.Optimizer):
        return name
    if not isinstance(name, str):
        raise TypeError(f"{where}: 'type' must be an optimizer name or class, got {name!r}")
    cls = getattr(torch.optim, name, None)
    if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer):
        return cls
    if "." in name:  # a dotted import path, e.g. "my_pkg.optim.Lion"
        import importlib

        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{where}: cannot import optimizer {name!r}: {e}") from None
        if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer):
            return cls
        raise TypeError(f"{where}: {name!r} is not a torch.optim.Optimizer subclass")
    close = difflib.get_close_matches(name, optimizer_names(), n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"{where}: unknown optimizer type {name!r}; expected a torch.optim class name "
                     f"such as 'SGD', 'Adam', 'AdamW', or a dotted import path.{hint}")


def build_optimizer(cfg: torch.optim.Optimizer | dict[str, Any], params: Iterable[nn.Parameter] | nn.Module,
                    where: str = "optimizer") -> torch.optim.Optimizer:
    """An optimizer as given, or built from ``dict(type=..., **kwargs)`` over ``params``.

    A ``paramwise`` (or MMEngine's ``paramwise_cfg``) entry sets per-parameter lr and
    weight decay multipliers, see :mod:`treadle.optim.paramwise`.
    """
    if isinstance(cfg, torch.optim.Optimizer):
        return cfg
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} must be a torch.optim.Optimizer or a dict(type=..., lr=...), got {type(cfg).__name__}")
    if "type" not in cfg:
        raise ValueError(f"{where}={cfg!r} has no 'type'; expected e.g. dict(type='AdamW', lr=1e-3)")
    kwargs = dict(cfg)
    cls = _resolve_type(kwargs.pop("type"), where)
    paramwise = kwargs.pop("paramwise", kwargs.pop("paramwise_cfg", None))
    if paramwise is not None:
        if not isinstance(params, nn.Module):
            raise TypeError(f"{where}: paramwise options need the model, not a list of parameters")
        check_paramwise(paramwise, kwargs.get("weight_decay"), where=f"{where}.paramwise")
        if "lr" not in kwargs:
            raise ValueError(f"{where}: paramwise options need an explicit lr")
        params = build_param_groups(params, kwargs["lr"], kwargs.get("weight_decay"), paramwise)
    elif isinstance(params, nn.Module):
        params = [p for p in params.parameters() if p.requires_grad]
    try:
        return cls(params, **kwargs)
    except TypeError as e:
        sig = inspect.signature(cls.__init__)
        accepted = [p for p in sig.parameters if p not in ("self", "params")]
        raise TypeError(f"{where}: {cls.__name__} rejected arguments {sorted(kwargs)}: {e}. Accepted: {accepted}") from None
