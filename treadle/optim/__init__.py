"""Optimization: the OptimWrapper (AMP, accumulation, clipping), optimizers by name
with paramwise options, MMEngine-compatible parameter schedulers, and EMA."""

from typing import Any

from treadle.lazy import import_submodule
from treadle.optim.builder import build_optimizer
from treadle.optim.ema import ExponentialMovingAverage, momentum_from_alpha
from treadle.optim.scheduler_builder import SCHEDULERS, build_schedulers
from treadle.optim.wrapper import OptimWrapper

__all__ = ["SCHEDULERS", "ExponentialMovingAverage", "OptimWrapper", "build_optimizer", "build_schedulers",
           "momentum_from_alpha"]


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.optim.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
