"""``ReduceOnPlateauParamScheduler``: lowers a value when a validation metric stops improving.

Its own module because it differs in kind from the curves: it is driven by
``step(metrics)`` after validation rather than by a step count. Public imports
are in :mod:`treadle.optim.schedulers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from treadle.optim.scheduler_base import INF, ParamScheduler

__all__ = ["ReduceOnPlateauParamScheduler"]


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
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"`monitor` must be the name of a validation result such as 'val/loss', got {monitor!r}")
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

    def step(self, metrics: dict[str, Any] | None = None) -> None:
        """Count an epoch (``metrics=None``) or check ``metrics[monitor]`` for a plateau."""
        if metrics is None:
            self._global_step += 1
            return
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict of validation metrics, got {type(metrics).__name__}")
        if self.begin <= self._global_step < self.end:
            self.last_step += 1
            if self.monitor not in metrics:
                raise KeyError(f"{type(self).__name__} monitor={self.monitor!r} is not among the validation results "
                               f"{sorted(metrics)}")
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
