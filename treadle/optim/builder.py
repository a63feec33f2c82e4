"""Build optimizers from objects or ``dict(type="AdamW", lr=...)`` configs."""

from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
from torch import nn

from treadle.optim.paramwise import build_param_groups, check_paramwise
from treadle.suggest import did_you_mean


def optimizer_names() -> list[str]:
    """Every optimizer class that ``torch.optim`` exports."""
    return sorted(n for n, obj in vars(torch.optim).items()
                  if inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer)


def resolve_optimizer_type(name: Any, where: str) -> type[torch.optim.Optimizer]:
    """The optimizer class ``name`` gives (a torch.optim name, a dotted import path, or the
    class); a ValueError or TypeError naming ``where`` and the close names otherwise."""
    return _resolve_type(name, where)


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
    hint = did_you_mean(name, optimizer_names())
    raise ValueError(f"{where}: unknown optimizer type {name!r}; expected a torch.optim class name "
                     f"such as 'SGD', 'Adam', 'AdamW', or a dotted import path.{hint}")


# Optimizers with a fused CUDA kernel (one launch for every parameter's update, instead
# of torch's default foreach kernels per step phase): turned on when a config leaves the choice open.
FUSED_BY_DEFAULT: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def wants_fused(cls: type[torch.optim.Optimizer], kwargs: dict[str, Any], params: Any, module: nn.Module | None) -> bool:
    """Whether to add ``fused=True``: Adam, AdamW or SGD; neither ``fused`` nor
    ``foreach`` given (nor ``differentiable``); every parameter a floating-point CUDA
    tensor; and no sparse embedding in ``module`` (fused kernels take no sparse grads).
    CPU runs keep torch's own default."""
    if cls not in FUSED_BY_DEFAULT or "fused" in kwargs or "foreach" in kwargs or kwargs.get("differentiable"):
        return False
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    if not tensors or not all(p.device.type == "cuda" and p.is_floating_point() for p in tensors):
        return False
    if module is not None and any(getattr(m, "sparse", False) for m in module.modules()
                                  if isinstance(m, (nn.Embedding, nn.EmbeddingBag))):
        return False
    return True


# Arguments of torch's optimizers that are rates, decays or small constants: a number >= 0.
NON_NEGATIVE = ("lr", "weight_decay", "momentum", "dampening", "eps", "lr_decay", "alpha", "rho")


def check_optimizer_args(kwargs: dict[str, Any], where: str) -> None:
    """Refuse, in one line naming ``where.key``, a NaN or infinite number among an
    optimizer config's arguments (a tuple such as ``betas`` included), and a negative
    one of :data:`NON_NEGATIVE`: torch accepts ``lr=nan`` and training fails later with a
    loss that does not name it."""
    import math

    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        numbers = value if isinstance(value, (tuple, list)) else (value,)
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
            continue
        several = numbers is value
        negative = key in NON_NEGATIVE and not several and value < 0
        if negative or not all(math.isfinite(n) for n in numbers):
            expected = ("finite numbers" if several else
                        "a finite number >= 0" if key in NON_NEGATIVE else "a finite number")
            raise ValueError(f"{where}.{key}={value!r}; expected {expected}")


def build_optimizer(cfg: torch.optim.Optimizer | dict[str, Any], params: Iterable[nn.Parameter] | nn.Module,
                    where: str = "optimizer") -> torch.optim.Optimizer:
    """An optimizer as given, or built from ``dict(type=..., **kwargs)`` over ``params``.

    Over a module, every parameter is optimized (frozen ones too: they get no gradient,
    and one unfrozen later is trained). A ``paramwise`` (or MMEngine's ``paramwise_cfg``)
    entry sets per-parameter lr and weight decay multipliers and leaves frozen parameters
    out, see :mod:`treadle.optim.paramwise`. On CUDA, Adam, AdamW
    and SGD configs that set neither ``fused`` nor ``foreach`` get ``fused=True`` (see
    :func:`wants_fused`; give ``fused=False`` or ``foreach=True`` to choose otherwise).
    """
    if isinstance(cfg, torch.optim.Optimizer):
        return cfg
    if not isinstance(cfg, dict):
        raise TypeError(f"{where} must be a torch.optim.Optimizer or a dict(type=..., lr=...), got {type(cfg).__name__}")
    if "type" not in cfg:
        raise ValueError(f"{where}={cfg!r} has no 'type'; expected e.g. dict(type='AdamW', lr=1e-3)")
    kwargs = dict(cfg)
    cls = _resolve_type(kwargs.pop("type"), where)
    check_optimizer_args(kwargs, where)
    paramwise = kwargs.pop("paramwise", kwargs.pop("paramwise_cfg", None))
    module = params if isinstance(params, nn.Module) else None
    if paramwise == {}:  # as MMEngine: empty options build no groups (a tied weight is then simply optimized once)
        paramwise = None
    if paramwise is not None:
        if not isinstance(params, nn.Module):
            raise TypeError(f"{where}: paramwise options need the model, not a list of parameters")
        sig = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values())
        options = None if takes_any else [p for p in sig if p not in ("self", "params")]
        check_paramwise(paramwise, kwargs.get("weight_decay"), where=f"{where}.paramwise", options=options)
        if "lr" not in kwargs:
            raise ValueError(f"{where}: paramwise options need an explicit lr")
        params = build_param_groups(params, kwargs["lr"], kwargs.get("weight_decay"), paramwise,
                                    where=f"{where}.paramwise")
    elif module is not None:
        # Every parameter, frozen ones included, as MMEngine and torch.optim(model.parameters()) do: a frozen
        # parameter has no gradient and so is not updated, and one unfrozen later is trained.
        params = list(module.parameters())
    params = list(params)  # type: ignore[arg-type]  # a Module became its parameters or groups above
    if wants_fused(cls, kwargs, params, module):
        try:
            return cls(params, **kwargs, fused=True)
        except (RuntimeError, ValueError, TypeError):  # this torch or these params: no fused kernel
            pass
    try:
        return cls(params, **kwargs)
    except TypeError as e:
        sig = inspect.signature(cls.__init__)
        accepted = [p for p in sig.parameters if p not in ("self", "params")]
        raise TypeError(f"{where}: {cls.__name__} rejected arguments {sorted(kwargs)}: {e}. Accepted: {accepted}") from None
