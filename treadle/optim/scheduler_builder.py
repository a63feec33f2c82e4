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

Schedulers of timm's protocol (:func:`steps_by_updates`: ``step_update(num_updates)``,
``step(epoch)``, ``state_dict()``, ``load_state_dict()``; every ``timm.scheduler`` class) are
passed through too: the Trainer steps them as timm's training script does
(treadle/hooks/scheduler.py).

Errors name the scheduler by the caller's argument: ``param_scheduler[i]`` (the
Strategy's ``prepare``), ``param_scheduler.<optimizer>[i]`` by optimizer name;
:class:`SchedulerError.renamed` gives the same error under another argument's name (the
Trainer's ``schedulers``).
"""

from __future__ import annotations

import copy
import inspect
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from treadle.optim import lr_momentum, param_schedulers, plateau
from treadle.optim.scheduler_base import INF, ParamScheduler, explicit_init_params, init_arg_names
from treadle.suggest import did_you_mean

__all__ = ["SCHEDULERS", "SchedulerError", "SchedulerTypeError", "SchedulerValueError", "build_scheduler_map",
           "build_schedulers", "is_torch_scheduler", "steps_by_updates"]

#: Scheduler name -> class, for the ``type`` key of configs.
SCHEDULERS: dict[str, type[ParamScheduler]] = {name: getattr(module, name)
                                               for module in (param_schedulers, plateau, lr_momentum)
                                               for name in module.__all__}

_TorchLRScheduler = torch.optim.lr_scheduler.LRScheduler
_TorchPlateau = torch.optim.lr_scheduler.ReduceLROnPlateau


def is_torch_scheduler(obj: Any) -> bool:
    """True for an instance of a torch learning-rate scheduler."""
    return isinstance(obj, (_TorchLRScheduler, _TorchPlateau))


#: The methods of timm's scheduler protocol.
UPDATE_PROTOCOL = ("step_update", "step", "state_dict", "load_state_dict")


def steps_by_updates(obj: Any) -> bool:
    """True for a scheduler of timm's protocol: ``step_update(num_updates)`` after each
    optimizer update, ``step(epoch)`` after each epoch (the scheduler decides which of the
    two moves its value: timm's ``t_in_epochs``), and ``state_dict()`` /
    ``load_state_dict()``. treadle's and torch's schedulers have no ``step_update``."""
    return not isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in UPDATE_PROTOCOL)


@dataclass(frozen=True)
class Where:
    """Which scheduler an error is about: the caller's argument (``key``), the optimizer's
    name for schedulers given by name (``group``), the position and the type (``label``)."""

    key: str
    group: str | None
    index: int
    label: str = ""

    def __str__(self) -> str:
        group = f".{self.group}" if self.group else ""
        label = f" ({self.label})" if self.label else ""
        return f"{self.key}{group}[{self.index}]{label}"

    def error(self, kind: type[Exception], detail: str) -> "SchedulerError":
        """A TypeError or ValueError (``kind``) about this scheduler, saying ``detail``."""
        cls = SchedulerTypeError if issubclass(kind, TypeError) else SchedulerValueError
        return cls(self, detail)


class SchedulerError(Exception):
    """An error of :func:`build_schedulers` about one scheduler: ``str()`` reads
    ``<where>: <detail>``, e.g. ``param_scheduler[0] (StepLR): missing required argument(s)
    'step_size' for StepLR.`` Raised as :class:`SchedulerTypeError` or
    :class:`SchedulerValueError`, so that ``except TypeError`` / ``except ValueError`` see it."""

    def __init__(self, where: Where, detail: str) -> None:
        self.where, self.detail = where, detail
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (e.g. from another process) as it was built
        return type(self), (self.where, self.detail)

    def renamed(self, key: str) -> "SchedulerError":
        """The same error, the scheduler named under the argument ``key`` (``schedulers``)."""
        return type(self)(replace(self.where, key=key), self.detail)


class SchedulerTypeError(SchedulerError, TypeError):
    """A scheduler of the wrong kind, or an argument of the wrong type."""


class SchedulerValueError(SchedulerError, ValueError):
    """A scheduler argument with a value that does not fit."""


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


def _resolve_type(where: Where, kind: Any) -> type:
    """Turn the ``type`` of a config into a class."""
    if isinstance(kind, str):
        name = kind.rsplit(".", 1)[-1]  # tolerate MMEngine scope prefixes like "mmengine.LinearLR"
        if name in SCHEDULERS:
            return SCHEDULERS[name]
        raise where.error(ValueError, f"unknown scheduler type {kind!r}.{_did_you_mean(name, list(SCHEDULERS))} "
                                      f"Known types: {', '.join(sorted(SCHEDULERS))}.")
    if inspect.isclass(kind):
        if issubclass(kind, _TorchPlateau):
            raise where.error(TypeError, "torch's ReduceLROnPlateau is not supported (it needs a scalar metric per "
                                         "step); use type='ReduceOnPlateauLR' with monitor=<metric name>")
        if issubclass(kind, (ParamScheduler, _TorchLRScheduler)):
            return kind
        raise where.error(TypeError, f"`type` class {kind.__qualname__} is neither a treadle ParamScheduler nor a "
                                     "torch LRScheduler (a scheduler of timm's protocol is passed built, not as a "
                                     "config)")
    raise where.error(TypeError, f"`type` must be a scheduler name (str) or class, got {type(kind).__name__} {kind!r}")


def _check_args(where: Where, cls: type, args: Mapping[str, Any], accepted: list[str],
                required: list[str]) -> None:
    """Reject unknown and missing constructor arguments with a helpful message."""
    for name in args:
        if name not in accepted:
            hint = (" The optimizer is supplied by build_schedulers." if name == "optimizer"
                    else _did_you_mean(name, accepted))
            raise where.error(TypeError, f"unknown argument {name!r} (value {args[name]!r}) for "
                                         f"{cls.__name__}.{hint} Accepted: {', '.join(accepted)}.")
    missing = [name for name in required if name not in args]
    if missing:
        raise where.error(TypeError, f"missing required argument(s) {', '.join(map(repr, missing))} "
                                     f"for {cls.__name__}.")


# Annotations (as written in the constructors) whose values are checked by type here, so
# that e.g. step_size="2" (a string from a config) is named instead of failing inside.
_SCALAR_TYPES = {"int": "a number", "float": "a number", "bool": "True or False", "str": "a string"}


def _check_types(where: Where, cls: type, args: Mapping[str, Any]) -> None:
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
            raise where.error(TypeError, f"`{p.name}`={value!r} has the wrong type ({type(value).__name__}); "
                                         f"expected {expected}")


def _required_args(cls: type) -> list[str]:
    return [p.name for p in explicit_init_params(cls) if p.default is p.empty]


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _build_torch(where: Where, cls: type, cfg: dict[str, Any], optimizer: Any) -> Any:
    """Build a torch LRScheduler class from a config and tag it with ``by_epoch``."""
    by_epoch = cfg.pop("by_epoch", False)
    if cfg.pop("convert_to_iter_based", False):
        raise where.error(ValueError, f"convert_to_iter_based is only supported for treadle schedulers, "
                                      f"not torch's {cls.__name__}")
    if not isinstance(by_epoch, bool):
        raise where.error(TypeError, f"`by_epoch` must be a bool, got {by_epoch!r}")
    accepted = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "optimizer")]
    _check_args(where, cls, cfg, accepted, [])
    raw = getattr(optimizer, "optimizer", optimizer)  # torch needs the bare optimizer
    try:
        sched = cls(raw, **cfg)
    except (TypeError, ValueError) as exc:
        raise where.error(type(exc), str(exc)) from exc
    sched.by_epoch = by_epoch
    return sched


def build_schedulers(cfgs: Any, optimizer: Any, *, epoch_length: int | None,
                     max_epochs: int | None, max_iters: int | None, key: str = "param_scheduler",
                     group: str | None = None) -> list[Any]:
    """Build the schedulers for ``optimizer`` from MMEngine-style configs.

    Args:
        cfgs: a config dict, a scheduler object, or a list of them (``None`` -> ``[]``).
            A dict has ``type`` (a name from :data:`SCHEDULERS` or a class), the
            constructor arguments, and optionally ``convert_to_iter_based``. An object
            is a treadle ParamScheduler, a torch LRScheduler or one of timm's protocol
            (:func:`steps_by_updates`), passed through.
        optimizer: the optimizer (or wrapper with ``param_groups``) to schedule.
        epoch_length: iterations per epoch; needed by ``convert_to_iter_based``.
        max_epochs, max_iters: loop length, used as the default ``end``.
        key, group: how errors name the schedulers: ``key[i]``, or ``key.group[i]`` for
            the schedulers of the optimizer named ``group``.

    Returns:
        The schedulers in config order (they compose in this order); each treadle or
        torch scheduler has a boolean ``by_epoch``.

    Raises:
        SchedulerTypeError / SchedulerValueError (TypeError / ValueError) naming the
        offending ``param_scheduler[i]``.
    """
    if cfgs is None:
        return []
    single = isinstance(cfgs, (Mapping, str)) or not isinstance(cfgs, Sequence)
    items = [cfgs] if single else list(cfgs)
    built: list[Any] = []
    for index, item in enumerate(items):
        where = Where(key, group, index)
        if isinstance(item, ParamScheduler):
            built.append(item)
            continue
        if is_torch_scheduler(item):
            if isinstance(item, _TorchPlateau):
                raise where.error(TypeError, "torch's ReduceLROnPlateau is not supported (it needs a scalar metric "
                                             "per step); use ReduceOnPlateauLR")
            if not isinstance(getattr(item, "by_epoch", False), bool):
                raise replace(where, label=type(item).__name__).error(
                    TypeError, f"`by_epoch` must be a bool, got {item.by_epoch!r}")
            if not hasattr(item, "by_epoch"):
                item.by_epoch = False  # torch schedulers are stepped per iteration unless told otherwise
            built.append(item)
            continue
        if steps_by_updates(item):
            _check_update_scheduler(replace(where, label=type(item).__name__), item)
            built.append(item)
            continue
        if not isinstance(item, Mapping):
            raise where.error(TypeError, f"expected a config dict, a treadle ParamScheduler, a torch LRScheduler or "
                                         f"a scheduler of timm's protocol ({', '.join(UPDATE_PROTOCOL)}), got "
                                         f"{type(item).__name__} {item!r}")
        built.append(_build_one(where, dict(item), optimizer, epoch_length, max_epochs, max_iters))
    return built


def _check_update_scheduler(where: Where, sched: Any) -> None:
    """timm's PlateauLRScheduler follows the protocol but steps on a metric, and its state
    (best value, patience and cooldown counters) is not in its state_dict: refused."""
    if type(sched).__name__ == "PlateauLRScheduler" and type(sched).__module__.startswith("timm."):
        raise where.error(TypeError, "timm's PlateauLRScheduler steps on a metric and leaves its counters out of "
                                     "its state_dict, so a resumed run would differ; use treadle's "
                                     "dict(type='ReduceOnPlateauLR', monitor='val/loss')")


def _build_one(where: Where, cfg: dict[str, Any], optimizer: Any, epoch_length: int | None,
               max_epochs: int | None, max_iters: int | None) -> Any:
    cfg = copy.deepcopy(cfg)
    if "type" not in cfg:
        raise where.error(ValueError, f"config has no `type` key (got keys {sorted(cfg)})")
    kind = cfg.pop("type")
    where = replace(where, label=str(kind if isinstance(kind, str) else getattr(kind, "__name__", kind)))
    cls = _resolve_type(where, kind)
    cfg.pop("_scope_", None)
    if not issubclass(cls, ParamScheduler):
        return _build_torch(where, cls, cfg, optimizer)

    convert = cfg.pop("convert_to_iter_based", False)
    epoch_length = cfg.pop("epoch_length", epoch_length)  # a value in the config wins, as in MMEngine
    if not isinstance(convert, bool):
        raise where.error(TypeError, f"`convert_to_iter_based` must be a bool, got {convert!r}")
    by_epoch = cfg.get("by_epoch", True)
    if not isinstance(by_epoch, bool):
        raise where.error(TypeError, f"`by_epoch` must be a bool, got {by_epoch!r}")
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
            raise where.error(ValueError, f"`end` is not set and {unit} is unknown; {cls.__name__} needs a "
                                          f"finite `end` to shape its schedule")
    begin, end = cfg.get("begin", 0), cfg.get("end", INF)
    for name, value in (("begin", begin), ("end", end)):
        if not _is_number(value) or value < 0:
            raise where.error(ValueError, f"`{name}` must be a non-negative number, got {value!r}")
    if begin >= end:
        raise where.error(ValueError, f"`begin` must be smaller than `end`, got begin={begin}, end={end}")

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
        raise where.error(TypeError if isinstance(exc, TypeError) else ValueError, message) from exc


def build_scheduler_map(schedulers: Any, optimizers: Mapping[str, torch.optim.Optimizer], *,
                        epoch_length: int | None = None, max_epochs: int | None = None,
                        max_iters: int | None = None) -> dict[str, list[Any]]:
    """``{optimizer name: [schedulers]}`` from a list (one optimizer) or a dict of lists
    by optimizer name (several, whose errors name ``param_scheduler.<name>[i]``); the
    arguments after ``*`` as :func:`build_schedulers`."""
    by_name = isinstance(schedulers, Mapping) and set(schedulers) <= set(optimizers) and "type" not in schedulers
    if by_name:
        per_name = dict(schedulers)
    elif isinstance(schedulers, Mapping) and "type" not in schedulers:
        raise ValueError(f"schedulers keys {sorted(schedulers)} must name optimizers {sorted(optimizers)}")
    else:
        if len(optimizers) != 1:
            raise ValueError(f"with several optimizers {sorted(optimizers)}, give schedulers as a dict by optimizer name")
        per_name = {next(iter(optimizers)): schedulers}
    return {name: build_schedulers(cfgs, optimizers[name], epoch_length=epoch_length, max_epochs=max_epochs,
                                   max_iters=max_iters, group=name if by_name else None)
            for name, cfgs in per_name.items()}
