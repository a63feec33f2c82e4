"""Turn the Trainer's keyword arguments into checked components.

Everything here runs inside ``Trainer.__init__``, before anything is trained or
written, so a bad argument fails with a message that names it. Internal to treadle:
the public face is the Trainer's signature (treadle/trainer.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from treadle.hints import check_metric_update
from treadle.hooks.base import Hook
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.ema import EMAHook
from treadle.hooks.nan_guard import NaNGuardHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.logging.writers import get_logger
from treadle.optim.builder import build_optimizer
from treadle.optim.scheduler_builder import build_schedulers
from treadle.optim.wrapper import OptimWrapper
from treadle.state import TrainState


def positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def progress_on(progress: Any, is_main: bool) -> bool:
    """Whether to add the progress bar: "auto" on a terminal, True always; main process only."""
    if not (isinstance(progress, bool) or progress == "auto"):
        raise ValueError(f"progress={progress!r}; expected 'auto' (a bar when stdout is a terminal), True or False")
    if not is_main or progress is False:
        return False
    isatty = getattr(sys.stdout, "isatty", None)
    return progress is True or bool(isatty and isatty())


def warn_if_unpinned(loader: Any) -> None:
    """Batches go to the GPU with non_blocking copies, which overlap with compute only
    from pinned host memory: say so when a CUDA run's DataLoader does not pin."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) and not loader.pin_memory:
        get_logger().warning("the training DataLoader has pin_memory=False: on CUDA each batch copy then blocks "
                             "the host; DataLoader(..., pin_memory=True) lets it overlap with compute")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def nan_guard_hook(cfg: Any, log_interval: int) -> NaNGuardHook | None:
    """The default checks at the log interval, when the logger syncs anyway: no sync per step.

    None for ``nan_guard=False``; values are told apart by type, so ``0`` or ``None`` is an
    error, not a quiet "off"."""
    if cfg is False:
        return None
    if cfg is True or cfg == "raise":
        return NaNGuardHook(mode="raise", check_interval=log_interval)
    if cfg == "skip":
        return NaNGuardHook(mode="skip")
    if isinstance(cfg, dict):
        unknown = set(cfg) - {"mode", "check_interval"}
        if unknown:
            raise ValueError(f"nan_guard has unknown keys {sorted(unknown)}; expected mode, check_interval")
        try:
            return NaNGuardHook(**{"check_interval": log_interval, **cfg})
        except (TypeError, ValueError) as e:
            raise ValueError(f"nan_guard={cfg!r}: {e}") from None
    raise ValueError(f"nan_guard={cfg!r}; expected 'raise', 'skip', False, True or dict(mode=..., check_interval=...)")


def check_resume(resume: Any) -> bool | str | os.PathLike[str]:
    """``resume``: False, True or a checkpoint path (told apart by type: 0, None or '' are errors)."""
    if isinstance(resume, bool):
        return resume
    if not isinstance(resume, (str, os.PathLike)) or not os.fspath(resume):
        raise TypeError(f"resume={resume!r}; expected False, True (the newest checkpoint in work_dir) or a "
                        "checkpoint path")
    return resume


def check_hook_list(hooks: Any) -> list[Any]:
    """``hooks``: a list (or tuple) of Hook objects or config dicts, not one hook on its own."""
    if isinstance(hooks, Hook):
        name = type(hooks).__name__
        raise TypeError(f"hooks={name}(...) is a single hook; expected a list of hooks, e.g. hooks=[{name}(...)]")
    if isinstance(hooks, Mapping):
        raise TypeError(f"hooks={dict(hooks)!r} is a single hook config; expected a list, e.g. hooks=[{dict(hooks)!r}]")
    if isinstance(hooks, (str, bytes)) or not isinstance(hooks, Iterable):
        raise TypeError(f"hooks={hooks!r}; expected a list of treadle.Hook objects or hook config dicts "
                        "(an empty list for none)")
    return list(hooks)


def check_loader(name: str, loader: Any) -> None:
    """A DataLoader or any iterable of batches (a config dict is built later, and checked there)."""
    if loader is None or isinstance(loader, Mapping):
        return
    iterable = isinstance(loader, Iterable) or callable(getattr(type(loader), "__getitem__", None))
    if isinstance(loader, (str, bytes)) or not iterable:
        raise TypeError(f"{name}={loader!r} ({type(loader).__name__}) is not iterable; expected a DataLoader, "
                        "another iterable of batches, or a dataloader config dict such as "
                        "dict(dataset=dict(type=...), batch_size=32)")


def checkpoint_hook(cfg: Any) -> CheckpointHook:
    if isinstance(cfg, CheckpointHook):
        return cfg
    if cfg is True:
        return CheckpointHook()
    if not isinstance(cfg, dict):
        raise TypeError(f"checkpoint must be a dict such as dict(interval=1, by_epoch=True, keep=3), got {cfg!r}")
    allowed = ("interval", "by_epoch", "keep", "best", "rule", "keep_best", "save_last", "async_save")
    unknown = set(cfg) - set(allowed)
    if unknown:
        raise ValueError(f"checkpoint has unknown keys {sorted(unknown)}; expected some of {list(allowed)}")
    return CheckpointHook(**cfg)


def ema_hook(cfg: Any) -> EMAHook:
    """``ema=``: an EMAHook, or its arguments as a dict (``start_iter`` is another name for ``start``)."""
    if isinstance(cfg, EMAHook):
        return cfg
    if not isinstance(cfg, dict):
        raise TypeError(f"ema must be a dict such as dict(momentum=0.9998, interval=1, start=0), got {cfg!r}")
    allowed = ("momentum", "interval", "start", "start_iter", "alpha", "use_for_val")
    unknown = set(cfg) - set(allowed)
    if unknown:
        raise ValueError(f"ema has unknown keys {sorted(unknown)}; expected some of {list(allowed)}")
    if "momentum" in cfg and "alpha" in cfg:
        raise ValueError("ema: give momentum or alpha, not both")
    if "start" in cfg and "start_iter" in cfg:
        raise ValueError("ema: give start or start_iter (the same thing), not both")
    cfg = {("start" if k == "start_iter" else k): v for k, v in cfg.items()}
    return EMAHook(**cfg)


#: What each kind of config dict builds into, and the builder in treadle/config/build.py.
SPEC_KINDS = ("model", "dataloader", "loss", "metric", "hook")


def from_spec(value: Any, kind: str, path: str, *, safe: bool = False) -> Any:
    """``value`` itself, or, when it is a config dict, the object that dict describes.

    The dict is built exactly as the same key of a config file is (treadle/config/build.py:
    ``{type: Name, **kwargs}``, a registered name or dotted path; a dataloader is
    ``{dataset: {...}, batch_size: N, ...}``), so a Python script and a config file
    accept the same values. Errors are ConfigErrors naming ``path``. ``safe``: names
    only registered names and torch classes (treadle/config/safe.py).
    """
    if not isinstance(value, Mapping):
        return value
    # The config layer's component builders, imported only when a dict is given; that
    # module never imports the Trainer (treadle.config.assemble, which builds it, does).
    from treadle.config.build import build_component, build_dataloader, build_hook, build_model

    spec = dict(value)
    if kind == "model":
        return build_model(spec, safe=safe)
    if kind == "dataloader":
        return build_dataloader(spec, path, safe=safe)
    if kind == "hook":
        return build_hook(spec, path, safe=safe)
    if kind in ("loss", "metric"):
        return build_component(spec, kind, path, safe=safe)
    raise ValueError(f"from_spec: kind={kind!r}; expected one of {SPEC_KINDS}")


def check_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict {{name: metric}}, got {type(metrics).__name__}")
    for name, m in metrics.items():
        if isinstance(m, type):
            raise TypeError(f"metrics[{name!r}]={m.__name__} is a class, not a metric object; expected an instance "
                            f"such as {m.__name__}()")
        missing = [a for a in ("update", "compute", "reset") if not callable(getattr(m, a, None))]
        if missing:
            raise TypeError(f"metrics[{name!r}] ({type(m).__name__}) lacks {missing}; a metric needs update(outputs, targets), compute() and reset()")
        check_metric_update(name, m)
    return dict(metrics)


def check_optimizer_type(cfg: Any, where: str) -> None:
    """Safe mode: an optimizer config's ``type`` must be a torch.optim name or class,
    checked before the optimizer builder would import a dotted path."""
    if isinstance(cfg, Mapping) and isinstance(cfg.get("type"), str):
        from treadle.config.registry import check_name  # the config layer: only for config dicts

        check_name("optimizer", cfg["type"], f"{where}.type")


def build_optim_wrappers(optimizer: Any, module: nn.Module, *, precision: str, device_type: str, accumulate: int,
                         clip_grad: dict[str, Any] | None, safe: bool = False) -> dict[str, OptimWrapper]:
    """``{name: OptimWrapper}`` from an Optimizer, a config dict, or a dict of those by name
    (``safe``: see :func:`check_optimizer_type`)."""
    if isinstance(optimizer, Mapping) and optimizer and all(isinstance(v, (Mapping, torch.optim.Optimizer)) for v in optimizer.values()):
        built = {}
        for name, cfg in optimizer.items():
            params: Any = module
            if safe:
                check_optimizer_type(cfg, f"optimizer.{name}")
            if not isinstance(cfg, torch.optim.Optimizer):
                params = getattr(module, str(name), None)
                if not isinstance(params, nn.Module):
                    raise ValueError(f"optimizer[{name!r}] is a config, so the model needs a submodule named "
                                     f"{name!r} to optimize; give an Optimizer object instead")
            built[str(name)] = build_optimizer(cfg, params, where=f"optimizer[{name!r}]")
    else:
        if safe:
            check_optimizer_type(optimizer, "optimizer")
        built = {"default": build_optimizer(optimizer, module)}
    return {name: OptimWrapper(opt, precision=precision, device_type=device_type, accumulate=accumulate,
                               clip_grad=clip_grad) for name, opt in built.items()}


def build_scheduler_map(schedulers: Any, optim_wrappers: Mapping[str, OptimWrapper],
                        state: TrainState) -> dict[str, list[Any]]:
    """``{optimizer name: [schedulers]}`` from a list (one optimizer) or a dict by name."""
    if isinstance(schedulers, Mapping) and set(schedulers) <= set(optim_wrappers) and "type" not in schedulers:
        per_name = dict(schedulers)
    elif isinstance(schedulers, Mapping) and "type" not in schedulers:
        raise ValueError(f"schedulers keys {sorted(schedulers)} must name optimizers {sorted(optim_wrappers)}")
    else:
        if len(optim_wrappers) != 1:
            raise ValueError(f"with several optimizers {sorted(optim_wrappers)}, give schedulers as a dict by optimizer name")
        per_name = {next(iter(optim_wrappers)): schedulers}
    s = state
    return {name: build_schedulers(cfgs, optim_wrappers[name].optimizer, epoch_length=s.iters_per_epoch,
                                   max_epochs=s.max_epochs, max_iters=s.max_iters)
            for name, cfgs in per_name.items()}


def scale_lr(cfg: Any, optim_wrappers: Mapping[str, OptimWrapper], loader: Any, world_size: int) -> None:
    """MMEngine's auto_scale_lr: lr *= world_size * batch_size / base_batch_size."""
    if not isinstance(cfg, dict) or "base_batch_size" not in cfg or set(cfg) - {"base_batch_size", "enable"}:
        raise ValueError(f"auto_scale_lr={cfg!r} must be dict(base_batch_size=N[, enable=True])")
    if not check_bool("auto_scale_lr enable", cfg.get("enable", True)):
        return
    base = cfg["base_batch_size"]
    batch = getattr(loader, "batch_size", None)
    if isinstance(base, bool) or not isinstance(base, int) or base < 1 or not batch:
        raise ValueError(f"auto_scale_lr needs a positive int base_batch_size (got {base!r}) and a train DataLoader with a batch_size (got {batch!r})")
    ratio = world_size * batch / base
    for ow in optim_wrappers.values():
        for group in ow.param_groups:
            group["lr"] = group["lr"] * ratio
    get_logger().info(f"auto_scale_lr: lr scaled by {ratio:g} = {world_size} process(es) x batch {batch} / base {base}")


def warn_without_validation(hooks: list[Hook]) -> None:
    """Say so when something waits for validation results that no validation will produce."""
    waiting = []
    for h in hooks:
        if isinstance(h, CheckpointHook) and h.best is not None:
            waiting.append(f"checkpoint best={h.best!r}")
        elif isinstance(h, EarlyStoppingHook):
            waiting.append(f"EarlyStoppingHook monitor={h.monitor!r}")
        elif isinstance(h, ParamSchedulerHook):
            waiting += [f"{type(sch).__name__} monitor={getattr(sch, 'monitor', None)!r}"
                        for scheds in h.schedulers.values() for sch in scheds
                        if getattr(sch, "need_val_args", False)]
    if waiting:
        needs, it, them = ("needs", "it", "it") if len(waiting) == 1 else ("need", "they", "them")
        get_logger().warning(f"{', '.join(waiting)} {needs} validation results, but there is no val_dataloader, "
                             f"so {it} will never act; give a val_dataloader (or leave {them} out)")
