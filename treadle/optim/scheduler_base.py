"""The base of treadle's parameter schedulers: ``ParamScheduler`` and its helpers.

Kept apart from the concrete schedulers so that they (in ``param_schedulers`` and
``plateau``) can import it without a cycle; :mod:`treadle.optim.schedulers` is
the public face and describes the stepping contract.
"""

from __future__ import annotations

import inspect
import warnings
import weakref
from typing import Any

INF = int(1e9)  # MMEngine's "unbounded" sentinel; kept so configs/checks match.

_COUNTERS: "weakref.WeakKeyDictionary[Any, list[int]]" = weakref.WeakKeyDictionary()


def _step_counter(optimizer: Any) -> list[int] | None:
    """``[steps]`` of a torch optimizer (a wrapper's: of its ``optimizer``), counted by a
    step post-hook registered once; None for objects without one (not checked)."""
    if not callable(getattr(optimizer, "register_step_post_hook", None)):
        inner = getattr(optimizer, "optimizer", None)  # a wrapper (OptimWrapper): its optimizer's steps
        return _step_counter(inner) if inner is not None and inner is not optimizer else None
    counter = _COUNTERS.get(optimizer)
    if counter is None:
        counter = _COUNTERS[optimizer] = [0]

        def count(opt: Any, args: Any, kwargs: Any, counter: list[int] = counter) -> None:
            counter[0] += 1
        optimizer.register_step_post_hook(count)
    return counter


def explicit_init_params(cls: type) -> list[inspect.Parameter]:
    """The parameters of the first ``__init__`` along the MRO with an explicit
    signature (the LR and Momentum mixins forward ``*args, **kwargs``), without
    ``self``, ``optimizer``, and ``param_name`` when the class fixes the latter."""
    drop = {"self", "optimizer"}
    if getattr(cls, "_fixed_param_name", None):
        drop.add("param_name")
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            continue
        return [p for p in params if p.name not in drop]
    return []


def init_arg_names(cls: type) -> list[str]:
    """Names of the user-facing constructor arguments of a scheduler class."""
    return [p.name for p in explicit_init_params(cls)]


def _scale(value: Any, factor: int) -> Any:
    """Multiply an epoch-unit argument (number or list of numbers) by ``factor``."""
    if isinstance(value, (list, tuple)):
        return [v * factor for v in value]
    return value * factor


class ParamScheduler:
    """Base class: schedules one key (``param_name``) of every optimizer param group.

    The value is only touched while ``begin <= step < end`` (steps counted from
    construction, which is step 0). ``initial_<param_name>`` is recorded in each
    param group the first time any scheduler sees it, and serves as the base
    value. Subclasses implement :meth:`_get_value` in chainable form.

    Args:
        optimizer: a ``torch.optim.Optimizer`` or any wrapper exposing ``param_groups``.
        param_name: param-group key to schedule, e.g. ``"lr"``, ``"weight_decay"``.
        begin, end: step window in which the scheduler acts (``end`` exclusive).
        last_step: index of the last step, for resuming without a state dict.
        by_epoch: whether ``step()`` is called per epoch (True) or per iteration.
        verbose: accepted for MMEngine compatibility; prints each update.
    """

    #: Constructor arguments expressed in epochs, scaled by ``build_iter_from_epoch``.
    _epoch_unit_args: tuple[str, ...] = ()
    #: Set by the LR/Momentum mixins; such classes do not take ``param_name``.
    _fixed_param_name: str | None = None
    #: Warn once when the first ``step()`` comes before any ``optimizer.step()`` (torch's
    #: and MMEngine's check, for hand-written loops). The Trainer's ParamSchedulerHook
    #: turns it off: it orders the calls itself, and accumulation windows or steps the
    #: fp16 GradScaler skips would warn for nothing.
    check_order: bool = True

    def __init__(self, optimizer: Any, param_name: str, begin: int = 0, end: int = INF,
                 last_step: int = -1, by_epoch: bool = True, verbose: bool = False) -> None:
        self._attach(optimizer, param_name, begin, end, last_step, by_epoch, verbose)
        self._global_step = -1
        self.step()  # applies the step-0 value, exactly like MMEngine

    def _attach(self, optimizer: Any, param_name: str, begin: int, end: int,
                last_step: int, by_epoch: bool, verbose: bool) -> None:
        """Validate the common arguments and record ``initial_<param_name>``."""
        if not isinstance(getattr(optimizer, "param_groups", None), list):
            raise TypeError(f"optimizer must be a torch Optimizer (or expose a `param_groups` list), "
                            f"got {type(optimizer).__name__}")
        if end <= begin:
            raise ValueError(f"`end` must be larger than `begin`, got begin={begin}, end={end}")
        if not isinstance(last_step, int) or last_step < -1:
            raise ValueError(f"`last_step` must be an int >= -1, got {last_step!r}")
        self.optimizer = optimizer
        self.param_name = param_name
        self.begin = begin
        self.end = end
        self.by_epoch = bool(by_epoch)
        self.verbose = verbose
        key = f"initial_{param_name}"
        for i, group in enumerate(optimizer.param_groups):
            if param_name not in group:
                raise ValueError(f"param_groups[{i}] has no key {param_name!r} to schedule "
                                 f"(available: {sorted(k for k in group if k != 'params')})")
            if last_step == -1:
                group.setdefault(key, group[param_name])
            elif key not in group:
                raise ValueError(f"param_groups[{i}] lacks {key!r}, which is required when "
                                 f"resuming with last_step={last_step}")
        self.base_values = [group[key] for group in optimizer.param_groups]
        self.last_step = last_step
        self._optimizer_steps = _step_counter(optimizer)
        self._steps_at_start = self._optimizer_steps[0] if self._optimizer_steps is not None else 0

    @classmethod
    def build_iter_from_epoch(cls, optimizer: Any, *args: Any, begin: float = 0, end: float = INF,
                              by_epoch: bool = True, epoch_length: int | None = None,
                              **kwargs: Any) -> ParamScheduler:
        """Build an iteration-based scheduler from arguments given in epochs.

        ``begin``/``end`` and the class's epoch-unit arguments (``step_size``,
        ``milestones``, ``T_max``, ``total_steps``, ``periods``) are multiplied
        by ``epoch_length``; the result has ``by_epoch=False``.
        """
        # Bind positional arguments to names so epoch-unit ones get scaled too.
        names = init_arg_names(cls)
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__} takes at most {len(names)} positional arguments "
                            f"after the optimizer, got {len(args)}")
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__} got multiple values for argument {name!r}")
            kwargs[name] = value
        begin = kwargs.pop("begin", begin)
        end = kwargs.pop("end", end)
        by_epoch = kwargs.pop("by_epoch", by_epoch)
        if not by_epoch:
            raise ValueError(f"{cls.__name__}: only by_epoch=True arguments can be converted to "
                             f"iteration-based, got by_epoch={by_epoch!r}")
        if isinstance(epoch_length, bool) or not isinstance(epoch_length, int) or epoch_length <= 0:
            raise ValueError(f"{cls.__name__}: `epoch_length` must be a positive int to convert "
                             f"epochs to iterations, got {epoch_length!r}")
        for name in cls._epoch_unit_args:
            if kwargs.get(name) is not None:
                kwargs[name] = _scale(kwargs[name], epoch_length)
        begin = int(begin * epoch_length)
        if end != INF:
            end = int(end * epoch_length)
        return cls(optimizer, begin=begin, end=end, by_epoch=False, **kwargs)

    def _get_value(self) -> list[Any]:
        """Return the new value of every param group (chainable form)."""
        raise NotImplementedError

    def _current(self) -> list[Any]:
        return [group[self.param_name] for group in self.optimizer.param_groups]

    def _set(self, index: int, group: dict, value: Any) -> None:
        group[self.param_name] = value
        if self.verbose:
            print(f"Adjusting {self.param_name} of group {index} to {float(value):.4e}.")

    def step(self) -> None:
        """Advance one step; update the param groups if the step is inside ``[begin, end)``."""
        self._global_step += 1
        steps = self._optimizer_steps
        if self._global_step == 1 and self.check_order and steps is not None and steps[0] == self._steps_at_start:
            warnings.warn(
                f"{type(self).__name__}.step() was called before the optimizer's step(), so the schedule's first "
                "value is skipped; call optimizer.step() first (also if optimizer.step was replaced after the "
                "scheduler was built: its steps are then not seen). See "
                "https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate", UserWarning, stacklevel=2)
        if self.begin <= self._global_step < self.end:
            self.last_step += 1
            for i, (group, value) in enumerate(zip(self.optimizer.param_groups, self._get_value())):
                self._set(i, group, value)
        self._last_value = self._current()

    def get_last_value(self) -> list[Any]:
        """Return the values of every param group after the latest step."""
        return self._last_value

    def state_dict(self) -> dict[str, Any]:
        """Return the scheduler state (plain python data; safe for ``weights_only`` loading)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`; unknown keys are ignored with a warning."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        own = self.state_dict()
        unknown = sorted(k for k in state_dict if k not in own)
        if unknown:
            warnings.warn(f"{type(self).__name__}.load_state_dict ignores unknown keys {unknown}",
                          stacklevel=2)
        for key, value in state_dict.items():
            if key in own:
                setattr(self, key, value)
        if "milestones" in state_dict:
            # MMEngine stores a Counter; normalise to a plain dict.
            self.milestones = {int(k): int(v) for k, v in dict(self.milestones).items()}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(param_name={self.param_name!r}, begin={self.begin}, "
                f"end={self.end}, by_epoch={self.by_epoch})")
