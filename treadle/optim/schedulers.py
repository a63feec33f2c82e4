"""Parameter schedulers compatible with MMEngine's ``param_scheduler`` configs.

Every scheduler here takes MMEngine's class name and constructor arguments and
produces the same value at every step, so configs migrate unchanged. The
values are computed with the same *chainable* update rules (each step scales
the value currently in the param group), which is what lets several schedulers
on one optimizer compose in list order, e.g. a ``LinearLR`` warmup followed by
``CosineAnnealingLR``.

Stepping contract (same as MMEngine's runner): a scheduler applies its step-0
value when it is constructed; afterwards the trainer calls ``step()`` after
every training epoch when ``scheduler.by_epoch`` is true, otherwise after
every training iteration. ``ReduceOnPlateau*`` schedulers additionally have
``need_val_args = True`` and must be given ``step(metrics)`` after each
validation run.

The config builder lives in :mod:`treadle.optim.scheduler_builder`;
``build_schedulers`` is re-exported here lazily.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Sequence
from typing import Any

INF = int(1e9)  # MMEngine's "unbounded" sentinel; kept so configs/checks match.

__all__ = [
    "INF", "ParamScheduler", "current_lrs",
    "ConstantParamScheduler", "StepParamScheduler", "MultiStepParamScheduler",
    "ExponentialParamScheduler", "LinearParamScheduler", "CosineAnnealingParamScheduler",
    "PolyParamScheduler", "OneCycleParamScheduler", "CosineRestartParamScheduler",
    "ReduceOnPlateauParamScheduler",
    "ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR",
    "PolyLR", "OneCycleLR", "CosineRestartLR", "ReduceOnPlateauLR",
    "ConstantMomentum", "StepMomentum", "MultiStepMomentum", "ExponentialMomentum",
    "LinearMomentum", "CosineAnnealingMomentum", "PolyMomentum", "CosineRestartMomentum",
    "ReduceOnPlateauMomentum",
]


def current_lrs(optimizer: Any) -> list[float]:
    """Return the learning rate of every param group of ``optimizer`` as floats."""
    return [float(group["lr"]) for group in optimizer.param_groups]


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


class StepParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` every ``step_size`` steps."""

    _epoch_unit_args = ("step_size",)

    def __init__(self, optimizer: Any, param_name: str, step_size: int, gamma: float = 0.1,
                 begin: int = 0, end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        if step_size <= 0:
            raise ValueError(f"`step_size` must be positive, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        if self.last_step == 0 or self.last_step % self.step_size != 0:
            return self._current()
        return [v * self.gamma for v in self._current()]


class MultiStepParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` at each milestone step (repeats multiply again)."""

    _epoch_unit_args = ("milestones",)

    def __init__(self, optimizer: Any, param_name: str, milestones: Sequence[int], gamma: float = 0.1,
                 last_step: int = -1, begin: int = 0, end: int = INF, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        # A plain dict (not Counter) so the state dict loads with weights_only=True.
        self.milestones: dict[Any, int] = {}
        for m in milestones:
            self.milestones[m] = self.milestones.get(m, 0) + 1
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        count = self.milestones.get(self.last_step, 0)
        if not count:
            return self._current()
        return [v * self.gamma ** count for v in self._current()]


class ConstantParamScheduler(ParamScheduler):
    """Multiply the value by ``factor`` from ``begin`` and restore it at the last step before ``end``."""

    def __init__(self, optimizer: Any, param_name: str, factor: float = 1.0 / 3, begin: int = 0,
                 end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        if not 0 <= factor <= 1:
            raise ValueError(f"`factor` must be between 0 and 1, got {factor!r}")
        self.factor = factor
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        if self.last_step == 0:
            return [v * self.factor for v in self._current()]
        if self.last_step == self.total_iters:
            return [v * (1.0 / self.factor) for v in self._current()]
        return self._current()


class ExponentialParamScheduler(ParamScheduler):
    """Multiply the value by ``gamma`` every step."""

    def __init__(self, optimizer: Any, param_name: str, gamma: float, begin: int = 0,
                 end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        if self.last_step == 0:
            return self._current()
        return [v * self.gamma for v in self._current()]


class CosineAnnealingParamScheduler(ParamScheduler):
    """Cosine-anneal from the base value to ``eta_min`` (or ``base * eta_min_ratio``) over ``T_max``.

    ``T_max`` defaults to ``end - begin``; ``eta_min`` defaults to 0 when neither
    ``eta_min`` nor ``eta_min_ratio`` is given.
    """

    _epoch_unit_args = ("T_max",)

    def __init__(self, optimizer: Any, param_name: str, T_max: int | None = None,
                 eta_min: float | None = None, begin: int = 0, end: int = INF,
                 last_step: int = -1, by_epoch: bool = True, verbose: bool = False,
                 eta_min_ratio: float | None = None) -> None:
        if eta_min is None and eta_min_ratio is None:
            eta_min = 0.0
        if eta_min is not None and eta_min_ratio is not None:
            raise ValueError(f"give either `eta_min` or `eta_min_ratio`, not both "
                             f"(got eta_min={eta_min!r}, eta_min_ratio={eta_min_ratio!r})")
        self.T_max = T_max or (end - begin)
        self.eta_min = eta_min
        self.eta_min_ratio = eta_min_ratio
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _eta_min(self, base: Any) -> Any:
        return self.eta_min if self.eta_min_ratio is None else base * self.eta_min_ratio

    def _get_value(self) -> list[Any]:
        t, T = self.last_step, self.T_max
        cur = self._current()
        if t == 0:
            return cur
        out = []
        for base, v in zip(self.base_values, cur):
            lo = self._eta_min(base)
            if (t - 1 - T) % (2 * T) == 0:  # the cosine's trough: the ratio form would divide by 0
                out.append(v + (base - lo) * (1 - math.cos(math.pi / T)) / 2)
            else:
                out.append((1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                           * (v - lo) + lo)
        return out


class LinearParamScheduler(ParamScheduler):
    """Scale the value by a factor moving linearly from ``start_factor`` to ``end_factor`` over the window."""

    def __init__(self, optimizer: Any, param_name: str, start_factor: float = 1.0 / 3,
                 end_factor: float = 1.0, begin: int = 0, end: int = INF, last_step: int = -1,
                 by_epoch: bool = True, verbose: bool = False) -> None:
        # start_factor=0 is rejected (MMEngine accepts it, then divides by zero at step 1).
        if not 0 < start_factor <= 1:
            raise ValueError(f"`start_factor` must be in (0, 1], got {start_factor!r}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"`end_factor` must be in [0, 1], got {end_factor!r}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        if self.last_step == 0:
            return [v * self.start_factor for v in self._current()]
        delta = self.end_factor - self.start_factor
        ratio = 1.0 + delta / (self.total_iters * self.start_factor + (self.last_step - 1) * delta)
        return [v * ratio for v in self._current()]


class PolyParamScheduler(ParamScheduler):
    """Polynomial decay (exponent ``power``) to ``eta_min`` at the last step of the window."""

    def __init__(self, optimizer: Any, param_name: str, eta_min: float = 0, power: float = 1.0,
                 begin: int = 0, end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        self.eta_min = eta_min
        self.power = power
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        if self.last_step == 0:
            return self._current()
        ratio = (1 - 1 / (self.total_iters - self.last_step + 1)) ** self.power
        return [(v - self.eta_min) * ratio + self.eta_min for v in self._current()]


class OneCycleParamScheduler(ParamScheduler):
    """1cycle policy (lr only): warm up to ``eta_max`` then anneal far below the start.

    Not chainable: it overwrites ``initial_lr`` and adds ``max_lr``/``min_lr``
    to the param groups. ``total_steps`` defaults to ``end - begin``.
    """

    _epoch_unit_args = ("total_steps",)

    def __init__(self, optimizer: Any, param_name: str, eta_max: float | Sequence[float] = 0,
                 total_steps: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False, begin: int = 0,
                 end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        if param_name != "lr":
            raise ValueError(f"OneCycle only schedules 'lr', got param_name={param_name!r}")
        if total_steps is None:
            total_steps = end - begin
        elif isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"`total_steps` must be a positive int, got {total_steps!r}")
        if isinstance(pct_start, bool) or not isinstance(pct_start, (int, float)) \
                or not 0 <= pct_start <= 1:
            raise ValueError(f"`pct_start` must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"`anneal_strategy` must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        if isinstance(eta_max, (list, tuple)):
            if len(eta_max) != len(groups):
                raise ValueError(f"`eta_max` has {len(eta_max)} values but the optimizer has "
                                 f"{len(groups)} param groups")
            max_values = list(eta_max)
        else:
            max_values = [eta_max] * len(groups)
        self.eta_max = eta_max
        self.total_steps = total_steps
        self.div_factor = div_factor
        self.final_div_factor = final_div_factor
        self.anneal_strategy = anneal_strategy  # a string, not a function: keeps state_dict plain
        # Phase boundaries (step index at which each phase ends) and the
        # param-group keys holding its start/end values.
        ini, top, low = "initial_lr", "max_lr", "min_lr"
        first_end = float(pct_start * total_steps) - 1
        if three_phase:
            self._schedule_phases = [
                {"end_step": first_end, "start_lr": ini, "end_lr": top},
                {"end_step": float(2 * pct_start * total_steps) - 2, "start_lr": top, "end_lr": ini},
                {"end_step": total_steps - 1, "start_lr": ini, "end_lr": low},
            ]
        else:
            self._schedule_phases = [
                {"end_step": first_end, "start_lr": ini, "end_lr": top},
                {"end_step": total_steps - 1, "start_lr": top, "end_lr": low},
            ]
        if last_step == -1:
            for group, peak in zip(groups, max_values):
                group[ini] = peak / div_factor
                group[top] = peak
                group[low] = group[ini] / final_div_factor
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_value(self) -> list[Any]:
        t = self.last_step
        if t > self.total_steps:
            raise ValueError(f"OneCycle stepped {t + 1} times but total_steps={self.total_steps}")
        out = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start_step = 0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if t <= end_step or i == last:
                    pct = (t - start_step) / (end_step - start_step)
                    out.append(self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
                    break
                start_step = end_step
        return out


class CosineRestartParamScheduler(ParamScheduler):
    """Cosine annealing with warm restarts: one cosine per entry of ``periods``.

    Each period restarts from ``base * restart_weights[i]``. Exactly one of
    ``eta_min`` and ``eta_min_ratio`` must be given. After the last period the
    value is left unchanged.
    """

    _epoch_unit_args = ("periods",)

    def __init__(self, optimizer: Any, param_name: str, periods: Sequence[int],
                 restart_weights: Sequence[float] = (1,), eta_min: float | None = None,
                 eta_min_ratio: float | None = None, begin: int = 0, end: int = INF,
                 last_step: int = -1, by_epoch: bool = True, verbose: bool = False) -> None:
        if (eta_min is None) == (eta_min_ratio is None):
            raise ValueError(f"give exactly one of `eta_min` and `eta_min_ratio`, got "
                             f"eta_min={eta_min!r}, eta_min_ratio={eta_min_ratio!r}")
        if len(periods) != len(restart_weights):
            raise ValueError(f"`periods` ({len(periods)} values) and `restart_weights` "
                             f"({len(restart_weights)} values) must have the same length")
        self.periods = list(periods)
        self.restart_weights = list(restart_weights)
        self.eta_min = eta_min
        self.eta_min_ratio = eta_min_ratio
        self.cumulative_periods = [sum(self.periods[:i + 1]) for i in range(len(self.periods))]
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        idx = next((i for i, c in enumerate(self.cumulative_periods) if self.last_step < c), None)
        if idx is None:
            return self._current()
        weight = self.restart_weights[idx]
        t = self.last_step - (self.cumulative_periods[idx - 1] if idx else 0)
        T = self.periods[idx]
        out = []
        for base, v in zip(self.base_values, self._current()):
            lo = self.eta_min if self.eta_min_ratio is None else base * self.eta_min_ratio
            if t == 0:
                out.append(base * weight)
            else:
                out.append((1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                           * (v - lo) + lo)
        return out


class ReduceOnPlateauParamScheduler(ParamScheduler):
    """Multiply the value by ``factor`` when ``metrics[monitor]`` stops improving.

    Epoch-based only. ``step()`` without metrics just counts a training epoch
    (for the ``begin``/``end`` window); ``step(metrics)`` with the validation
    metrics dict does the plateau check. Nothing is applied at construction.
    """

    need_val_args = True

    def __init__(self, optimizer: Any, param_name: str, monitor: str = "loss", rule: str = "less",
                 factor: float = 0.1, patience: int = 10, threshold: float = 1e-4,
                 threshold_rule: str = "rel", cooldown: int = 0,
                 min_value: float | Sequence[float] = 0.0, eps: float = 1e-8, begin: int = 0,
                 end: int = INF, last_step: int = -1, by_epoch: bool = True,
                 verbose: bool = False) -> None:
        if not by_epoch:
            raise ValueError(f"{type(self).__name__} only supports by_epoch=True, got by_epoch={by_epoch!r}")
        if factor >= 1.0:
            raise ValueError(f"`factor` must be < 1.0, got {factor!r}")
        if threshold < 0:
            raise ValueError(f"`threshold` must be >= 0, got {threshold!r}")
        if rule not in ("less", "greater"):
            raise ValueError(f"`rule` must be 'less' or 'greater', got {rule!r}")
        if threshold_rule not in ("rel", "abs"):
            raise ValueError(f"`threshold_rule` must be 'rel' or 'abs', got {threshold_rule!r}")
        self._attach(optimizer, param_name, begin, end, last_step, by_epoch, verbose)
        n = len(optimizer.param_groups)
        if isinstance(min_value, (list, tuple)):
            if len(min_value) != n:
                raise ValueError(f"`min_value` has {len(min_value)} values but the optimizer has "
                                 f"{n} param groups")
            self.min_values = list(min_value)
        else:
            self.min_values = [min_value] * n
        self.monitor = monitor
        self.rule = rule
        self.factor = factor
        self.patience = patience
        self.threshold = threshold
        self.threshold_rule = threshold_rule
        self.cooldown = cooldown
        self.eps = eps
        self.cooldown_counter = 0
        self.num_bad_epochs = 0
        self.best = math.inf if rule == "less" else -math.inf
        self._global_step = 0  # counts training epochs; no step at construction
        self._last_value = self._current()

    @classmethod
    def build_iter_from_epoch(cls, optimizer: Any, *args: Any, **kwargs: Any) -> ParamScheduler:
        """Not supported: plateau detection runs after validation epochs only."""
        raise ValueError(f"{cls.__name__} is epoch-based only and cannot be converted to "
                         f"iteration-based (remove convert_to_iter_based)")

    def _is_better(self, value: float) -> bool:
        if self.rule == "less":
            if self.threshold_rule == "rel":
                return value < self.best * (1.0 - self.threshold)
            return value < self.best - self.threshold
        if self.threshold_rule == "rel":
            return value > self.best * (self.threshold + 1.0)
        return value > self.best + self.threshold

    def _get_value(self) -> list[Any]:
        return [max(float(v) * self.factor, lo) for v, lo in zip(self._current(), self.min_values)]

    def step(self, metrics: dict[str, Any] | None = None) -> None:  # type: ignore[override]
        """Count an epoch (``metrics=None``) or check ``metrics[monitor]`` for a plateau."""
        if metrics is None:
            self._global_step += 1
            return
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict of validation metrics, got {type(metrics).__name__}")
        if self.begin <= self._global_step < self.end:
            self.last_step += 1
            if self.monitor not in metrics:
                raise KeyError(f"monitored metric {self.monitor!r} not in metrics {sorted(metrics)}")
            value = float(metrics[self.monitor])  # 0-dim tensors become floats
            if self._is_better(value):
                self.best = value
                self.num_bad_epochs = 0
            else:
                self.num_bad_epochs += 1
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
                self.num_bad_epochs = 0  # bad epochs during cooldown do not count
            if self.num_bad_epochs > self.patience:
                for i, (group, new) in enumerate(zip(self.optimizer.param_groups, self._get_value())):
                    if group[self.param_name] - new > self.eps:
                        self._set(i, group, new)
                self.cooldown_counter = self.cooldown
                self.num_bad_epochs = 0
        self._last_value = self._current()


# ---------------------------------------------------------------------------
# LR and momentum flavours (MMEngine's names)
# ---------------------------------------------------------------------------

class _LRMixin:
    """Fixes ``param_name='lr'``."""

    _fixed_param_name = "lr"

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, "lr", *args, **kwargs)  # type: ignore[call-arg]


class _MomentumMixin:
    """Fixes ``param_name='momentum'``; for Adam-style optimizers drives ``betas[0]``.

    Like MMEngine, Adam's groups get a ``momentum`` key mirroring ``betas[0]``,
    which is written back into ``betas`` after every step.
    """

    _fixed_param_name = "momentum"

    def __init__(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        raw = getattr(optimizer, "optimizer", optimizer)  # unwrap an OptimWrapper
        defaults = getattr(raw, "defaults", None)
        if defaults is None:
            defaults = optimizer.param_groups[0] if optimizer.param_groups else {}
        self.use_betas = False
        if "momentum" not in defaults:
            if "betas" not in defaults:
                raise ValueError(f"{type(self).__name__} needs an optimizer with `momentum` or "
                                 f"`betas`, got {type(raw).__name__}")
            self.use_betas = True
            for group in optimizer.param_groups:
                group["momentum"] = group["betas"][0]
        super().__init__(optimizer, "momentum", *args, **kwargs)  # type: ignore[call-arg]

    def step(self, *args: Any, **kwargs: Any) -> None:
        super().step(*args, **kwargs)  # type: ignore[misc]
        if self.use_betas:
            for group in self.optimizer.param_groups:  # type: ignore[attr-defined]
                group["betas"] = (group["momentum"], group["betas"][1])


class ConstantLR(_LRMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on ``lr``."""


class StepLR(_LRMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on ``lr``."""


class MultiStepLR(_LRMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on ``lr``."""


class ExponentialLR(_LRMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on ``lr``."""


class LinearLR(_LRMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on ``lr`` (the usual warmup)."""


class CosineAnnealingLR(_LRMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on ``lr``."""


class PolyLR(_LRMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on ``lr``."""


class OneCycleLR(_LRMixin, OneCycleParamScheduler):
    """:class:`OneCycleParamScheduler` on ``lr``."""


class CosineRestartLR(_LRMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on ``lr``."""


class ReduceOnPlateauLR(_LRMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on ``lr``."""


class ConstantMomentum(_MomentumMixin, ConstantParamScheduler):
    """:class:`ConstantParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class StepMomentum(_MomentumMixin, StepParamScheduler):
    """:class:`StepParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class MultiStepMomentum(_MomentumMixin, MultiStepParamScheduler):
    """:class:`MultiStepParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class ExponentialMomentum(_MomentumMixin, ExponentialParamScheduler):
    """:class:`ExponentialParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class LinearMomentum(_MomentumMixin, LinearParamScheduler):
    """:class:`LinearParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class CosineAnnealingMomentum(_MomentumMixin, CosineAnnealingParamScheduler):
    """:class:`CosineAnnealingParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class PolyMomentum(_MomentumMixin, PolyParamScheduler):
    """:class:`PolyParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class CosineRestartMomentum(_MomentumMixin, CosineRestartParamScheduler):
    """:class:`CosineRestartParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


class ReduceOnPlateauMomentum(_MomentumMixin, ReduceOnPlateauParamScheduler):
    """:class:`ReduceOnPlateauParamScheduler` on momentum (SGD ``momentum`` / Adam ``betas[0]``)."""


def __getattr__(name: str) -> Any:
    # Lazy re-export: the builder imports this module, so a top-level import would be circular.
    if name in ("build_schedulers", "SCHEDULERS"):
        from treadle.optim import scheduler_builder
        return getattr(scheduler_builder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
