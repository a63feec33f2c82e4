"""Build parameter schedulers from MMEngine-style ``param_scheduler`` configs.

``build_schedulers`` follows the rules of MMEngine's runner: a missing ``end``
defaults to the training loop's length (``max_epochs`` for ``by_epoch``
schedulers, ``max_iters`` otherwise), and ``convert_to_iter_based=True`` turns
an epoch-based config into an iteration-based scheduler via
``build_iter_from_epoch``. Every built scheduler has a boolean ``by_epoch``
telling the trainer when to call ``step()``.

torch schedulers (``torch.optim.lr_scheduler.LRScheduler`` instances) are
passed through as the same object; if they lack ``by_epoch`` the attribute is
set to ``False`` (step per iteration). Set ``sched.by_epoch = True`` before
passing one to have it stepped per epoch, or give ``by_epoch`` in a config
whose ``type`` is a torch scheduler class. torch's ``ReduceLROnPlateau`` is
rejected: it needs a scalar the trainer cannot supply; use ``ReduceOnPlateauLR``.
"""

from __future__ import annotations

import copy
import inspect
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from treadle.optim import lr_momentum, param_schedulers, plateau
from treadle.optim.scheduler_base import INF, ParamScheduler, explicit_init_params, init_arg_names
from treadle.suggest import did_you_mean

__all__ = ["SCHEDULERS", "build_scheduler_map", "build_schedulers", "is_torch_scheduler"]

#: Scheduler name -> class, for the ``type`` key of configs.
SCHEDULERS: dict[str, type[ParamScheduler]] = {name: getattr(module, name)
                                               for module in (param_schedulers, plateau, lr_momentum)
                                               for name in module.__all__}

_TorchLRScheduler = torch.optim.lr_scheduler.LRScheduler
_TorchPlateau = torch.optim.lr_scheduler.ReduceLROnPlateau


def is_torch_scheduler(obj: Any) -> bool:
    """True for an instance of a torch learning-rate scheduler."""
    return isinstance(obj, (_TorchLRScheduler, _TorchPlateau))


def _needs_finite_end(cls: type, cfg: Mapping[str, Any]) -> bool:
    """Schedules whose shape is derived from ``end`` are meaningless with an unbounded ``end``."""
    if issubclass(cls, (param_schedulers.LinearParamScheduler, param_schedulers.PolyParamScheduler)):
        return True
    if issubclass(cls, param_schedulers.CosineAnnealingParamScheduler):
        return not cfg.get("T_max")
    if issubclass(cls, param_schedulers.OneCycleParamScheduler):
        return cfg.get("total_steps") is None
    return False


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    return did_you_mean(word, choices)


def _resolve_type(where: str, kind: Any) -> type:
    """Turn the ``type`` of a config into a class."""
    if isinstance(kind, str):
        name = kind.rsplit(".", 1)[-1]  # tolerate MMEngine scope prefixes like "mmengine.LinearLR"
        if name in SCHEDULERS:
            return SCHEDULERS[name]
        raise ValueError(f"{where}: unknown scheduler type {kind!r}.{_did_you_mean(name, list(SCHEDULERS))} "
                         f"Known types: {', '.join(sorted(SCHEDULERS))}.")
    if inspect.isclass(kind):
        if issubclass(kind, _TorchPlateau):
            raise TypeError(f"{where}: torch's ReduceLROnPlateau is not supported (it needs a scalar "
                            f"metric per step); use type='ReduceOnPlateauLR' with monitor=<metric name>")
        if issubclass(kind, (ParamScheduler, _TorchLRScheduler)):
            return kind
        raise TypeError(f"{where}: `type` class {kind.__qualname__} is neither a treadle "
                        f"ParamScheduler nor a torch LRScheduler")
    raise TypeError(f"{where}: `type` must be a scheduler name (str) or class, got "
                    f"{type(kind).__name__} {kind!r}")


def _check_args(where: str, cls: type, args: Mapping[str, Any], accepted: list[str],
                required: list[str]) -> None:
    """Reject unknown and missing constructor arguments with a helpful message."""
    for name in args:
        if name not in accepted:
            hint = (" The optimizer is supplied by build_schedulers." if name == "optimizer"
                    else _did_you_mean(name, accepted))
            raise TypeError(f"{where}: unknown argument {name!r} (value {args[name]!r}) for "
                            f"{cls.__name__}.{hint} Accepted: {', '.join(accepted)}.")
    missing = [name for name in required if name not in args]
    if missing:
        raise TypeError(f"{where}: missing required argument(s) {', '.join(map(repr, missing))} "
                        f"for {cls.__name__}.")


# Annotations (as written in the constructors) whose values are checked by type here, so
# that e.g. step_size="2" (a string from a config) is named instead of failing inside.
_SCALAR_TYPES = {"int": "a number", "float": "a number", "bool": "True or False", "str": "a string"}


def _check_types(where: str, cls: type, args: Mapping[str, Any]) -> None:
    """Reject arguments of the wrong type for scalar parameters (int, float, bool, str)."""
    for p in explicit_init_params(cls):
        if p.name not in args or not isinstance(p.annotation, str):
            continue
        kinds = [k.strip() for k in p.annotation.split("|")]
        optional = "None" in kinds
        kinds = [k for k in kinds if k != "None"]
        if len(kinds) != 1 or kinds[0] not in _SCALAR_TYPES:
            continue  # sequences, unions of several types: the constructor checks them
        value, kind = args[p.name], kinds[0]
        if value is None and optional:
            continue
        ok = {"int": _is_number, "float": _is_number, "bool": lambda v: isinstance(v, bool),
              "str": lambda v: isinstance(v, str)}[kind](value)
        if not ok:
            expected = _SCALAR_TYPES[kind] + (" or None" if optional else "")
            raise TypeError(f"{where}: `{p.name}`={value!r} has the wrong type ({type(value).__name__}); "
                            f"expected {expected}")


def _required_args(cls: type) -> list[str]:
    return [p.name for p in explicit_init_params(cls) if p.default is p.empty]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _build_torch(where: str, cls: type, cfg: dict[str, Any], optimizer: Any) -> Any:
    """Build a torch LRScheduler class from a config and tag it with ``by_epoch``."""
    by_epoch = cfg.pop("by_epoch", False)
    if cfg.pop("convert_to_iter_based", False):
        raise ValueError(f"{where}: convert_to_iter_based is only supported for treadle schedulers, "
                         f"not torch's {cls.__name__}")
    if not isinstance(by_epoch, bool):
        raise TypeError(f"{where}: `by_epoch` must be a bool, got {by_epoch!r}")
    accepted = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "optimizer")]
    _check_args(where, cls, cfg, accepted, [])
    raw = getattr(optimizer, "optimizer", optimizer)  # torch needs the bare optimizer
    try:
        sched = cls(raw, **cfg)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    sched.by_epoch = by_epoch
    return sched


def build_schedulers(cfgs: Any, optimizer: Any, *, epoch_length: int | None,
                     max_epochs: int | None, max_iters: int | None) -> list[Any]:
    """Build the schedulers for ``optimizer`` from MMEngine-style configs.

    Args:
        cfgs: a config dict, a scheduler object, or a list of them (``None`` -> ``[]``).
            A dict has ``type`` (a name from :data:`SCHEDULERS` or a class), the
            constructor arguments, and optionally ``convert_to_iter_based``.
        optimizer: the optimizer (or wrapper with ``param_groups``) to schedule.
        epoch_length: iterations per epoch; needed by ``convert_to_iter_based``.
        max_epochs, max_iters: loop length, used as the default ``end``.

    Returns:
        The schedulers in config order (they compose in this order); each has
        a boolean ``by_epoch``.

    Raises:
        ValueError/TypeError naming the offending ``param_scheduler[i]``.
    """
    if cfgs is None:
        return []
    single = isinstance(cfgs, (Mapping, str)) or not isinstance(cfgs, Sequence)
    items = [cfgs] if single else list(cfgs)
    built: list[Any] = []
    for index, item in enumerate(items):
        if isinstance(item, ParamScheduler):
            built.append(item)
            continue
        if is_torch_scheduler(item):
            if isinstance(item, _TorchPlateau):
                raise TypeError(f"param_scheduler[{index}]: torch's ReduceLROnPlateau is not supported "
                                f"(it needs a scalar metric per step); use ReduceOnPlateauLR")
            if not isinstance(getattr(item, "by_epoch", False), bool):
                raise TypeError(f"param_scheduler[{index}] ({type(item).__name__}): `by_epoch` must be "
                                f"a bool, got {item.by_epoch!r}")
            if not hasattr(item, "by_epoch"):
                item.by_epoch = False  # torch schedulers are stepped per iteration unless told otherwise
            built.append(item)
            continue
        if not isinstance(item, Mapping):
            raise TypeError(f"param_scheduler[{index}]: expected a config dict, a ParamScheduler or a "
                            f"torch LRScheduler, got {type(item).__name__} {item!r}")
        built.append(_build_one(index, dict(item), optimizer, epoch_length, max_epochs, max_iters))
    return built


def _build_one(index: int, cfg: dict[str, Any], optimizer: Any, epoch_length: int | None,
               max_epochs: int | None, max_iters: int | None) -> Any:
    cfg = copy.deepcopy(cfg)
    if "type" not in cfg:
        raise ValueError(f"param_scheduler[{index}]: config has no `type` key (got keys {sorted(cfg)})")
    kind = cfg.pop("type")
    where = f"param_scheduler[{index}] ({kind if isinstance(kind, str) else getattr(kind, '__name__', kind)})"
    cls = _resolve_type(where, kind)
    cfg.pop("_scope_", None)
    if not issubclass(cls, ParamScheduler):
        return _build_torch(where, cls, cfg, optimizer)

    convert = cfg.pop("convert_to_iter_based", False)
    epoch_length = cfg.pop("epoch_length", epoch_length)  # a value in the config wins, as in MMEngine
    if not isinstance(convert, bool):
        raise TypeError(f"{where}: `convert_to_iter_based` must be a bool, got {convert!r}")
    by_epoch = cfg.get("by_epoch", True)
    if not isinstance(by_epoch, bool):
        raise TypeError(f"{where}: `by_epoch` must be a bool, got {by_epoch!r}")
    _check_args(where, cls, cfg, init_arg_names(cls), _required_args(cls))
    _check_types(where, cls, cfg)

    # MMEngine's rule: a missing `end` is the loop length in the scheduler's own unit
    # (decided before any epoch->iteration conversion).
    if "end" not in cfg:
        default_end = max_epochs if by_epoch else max_iters
        if default_end is not None:
            cfg["end"] = default_end
        elif _needs_finite_end(cls, cfg):
            unit = "max_epochs" if by_epoch else "max_iters"
            raise ValueError(f"{where}: `end` is not set and {unit} is unknown; {cls.__name__} needs a "
                             f"finite `end` to shape its schedule")
    begin, end = cfg.get("begin", 0), cfg.get("end", INF)
    for name, value in (("begin", begin), ("end", end)):
        if not _is_number(value) or value < 0:
            raise ValueError(f"{where}: `{name}` must be a non-negative number, got {value!r}")
    if begin >= end:
        raise ValueError(f"{where}: `begin` must be smaller than `end`, got begin={begin}, end={end}")

    try:
        if convert:
            if not by_epoch:
                raise ValueError("convert_to_iter_based=True needs an epoch-based config "
                                 "(by_epoch=True), got by_epoch=False")
            if epoch_length is None:
                raise ValueError("convert_to_iter_based=True needs `epoch_length` (iterations per "
                                 "epoch), got None")
            return cls.build_iter_from_epoch(optimizer, epoch_length=epoch_length, **cfg)
        return cls(optimizer, **cfg)
    except (TypeError, ValueError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        new_type = ValueError if isinstance(exc, KeyError) else type(exc)
        raise new_type(f"{where}: {message}") from exc


def build_scheduler_map(schedulers: Any, optimizers: Mapping[str, torch.optim.Optimizer], *,
                        epoch_length: int | None = None, max_epochs: int | None = None,
                        max_iters: int | None = None) -> dict[str, list[Any]]:
    """``{optimizer name: [schedulers]}`` from a list (one optimizer) or a dict of lists
    by optimizer name (several); the arguments after ``*`` as :func:`build_schedulers`."""
    if isinstance(schedulers, Mapping) and set(schedulers) <= set(optimizers) and "type" not in schedulers:
        per_name = dict(schedulers)
    elif isinstance(schedulers, Mapping) and "type" not in schedulers:
        raise ValueError(f"schedulers keys {sorted(schedulers)} must name optimizers {sorted(optimizers)}")
    else:
        if len(optimizers) != 1:
            raise ValueError(f"with several optimizers {sorted(optimizers)}, give schedulers as a dict by optimizer name")
        per_name = {next(iter(optimizers)): schedulers}
    return {name: build_schedulers(cfgs, optimizers[name], epoch_length=epoch_length, max_epochs=max_epochs,
                                   max_iters=max_iters)
            for name, cfgs in per_name.items()}
