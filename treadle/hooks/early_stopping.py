"""EarlyStoppingHook: stop training when a validation metric stops improving."""

from __future__ import annotations

import math
import warnings
from numbers import Real
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger
from treadle.metrics import higher_is_better

if TYPE_CHECKING:
    from treadle.hooks.view import RunView

RULES = ("less", "greater")


class EarlyStoppingHook(Hook):
    """Request a stop after ``patience`` validations without improvement.

    Args:
        monitor: key of the validation metrics, e.g. "val/loss" or "val/acc".
        rule: "less" (lower is better), "greater", or None: inferred from the name
            (losses and errors "less", scores such as accuracy "greater", see
            treadle.metrics.higher_is_better); an error when the name does not say.
        patience: validations without improvement before stopping (>= 1).
        min_delta: an improvement must beat the best by more than this (>= 0).
        stop_on_nonfinite: a NaN/inf monitored value stops training at once.
        strict: a missing ``monitor`` key raises ``KeyError``; otherwise a warning
            is given once and the validation is ignored.

    The check runs in ``after_val_epoch``; training stops at the next iteration
    boundary (after the validation, in practice), with ``trainer.state.stop_reason``
    saying why. ``best`` and ``wait`` are kept in checkpoints.
    """

    # After the default priority, so hooks that save "the best" checkpoint of this
    # validation run before training is asked to stop.
    priority = Priority.LOW

    def __init__(self, monitor: str = "val/loss", rule: str | None = None, patience: int = 5,
                 min_delta: float = 0.0, stop_on_nonfinite: bool = True, strict: bool = False) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must be a metric name such as 'val/loss', got {monitor!r}")
        if rule is None:
            higher = higher_is_better(monitor)
            if higher is None:
                raise ValueError(f"EarlyStoppingHook monitor={monitor!r}: its name does not say whether higher or "
                                 "lower is better; give rule='greater' or rule='less'")
            rule = "greater" if higher else "less"
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES} or None (inferred from the name), got {rule!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {patience!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, Real) or not min_delta >= 0:
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        self.monitor = monitor
        self.rule = rule
        self.patience = patience
        self.min_delta = float(min_delta)
        self.stop_on_nonfinite = stop_on_nonfinite
        self.strict = strict
        self.best: float | None = None
        self.best_iter: int | None = None
        self.wait = 0  # validations since the last improvement
        self._warned = False

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta``."""
        if self.best is None:
            return True
        if self.rule == "less":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def after_val_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        if self.monitor not in metrics:
            self._missing(metrics)
            return
        value = float(metrics[self.monitor])
        state = trainer.state
        if not math.isfinite(value):
            if self.stop_on_nonfinite:
                self._stop(trainer, f"early stopping: {self.monitor} is {value} at iteration {state.iter}")
            return
        if self.improves(value):
            self.best, self.best_iter, self.wait = value, state.iter, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self._stop(trainer, f"early stopping: {self.monitor} did not improve by more than {self.min_delta:g} "
                                f"for {self.wait} validations (best {self.best:.6g} at iteration {self.best_iter})")

    def _missing(self, metrics: dict[str, Any]) -> None:
        msg = f"EarlyStoppingHook: monitored key {self.monitor!r} is not in the validation metrics {sorted(metrics)}"
        if self.strict:
            raise KeyError(msg)
        if not self._warned:
            self._warned = True
            warnings.warn(msg + "; early stopping is inactive", RuntimeWarning, stacklevel=2)

    def _stop(self, trainer: "RunView", reason: str) -> None:
        trainer.state.request_stop(reason)
        if trainer.is_main:
            get_logger().info(reason)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_iter": self.best_iter, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")
        self.best_iter = state.get("best_iter")
        self.wait = int(state.get("wait", 0))

    def __repr__(self) -> str:
        return (f"EarlyStoppingHook(monitor={self.monitor!r}, rule={self.rule!r}, patience={self.patience}, "
                f"min_delta={self.min_delta})")


__all__ = ["EarlyStoppingHook"]
