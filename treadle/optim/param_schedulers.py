"""The curve schedulers: ``*ParamScheduler`` classes that schedule any param-group key.

Each computes its value in chainable form from the base class in
:mod:`treadle.optim.scheduler_base`; the ``*LR``/``*Momentum`` flavours and the
public imports are in :mod:`treadle.optim.schedulers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from treadle.optim.scheduler_base import INF, ParamScheduler

# In the order of treadle.optim.scheduler_builder.SCHEDULERS (and of their LR flavours).
__all__ = ["ConstantParamScheduler", "StepParamScheduler", "MultiStepParamScheduler",
           "ExponentialParamScheduler", "LinearParamScheduler", "CosineAnnealingParamScheduler",
           "PolyParamScheduler", "OneCycleParamScheduler", "CosineRestartParamScheduler"]


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
