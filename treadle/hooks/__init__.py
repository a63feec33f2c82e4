"""Hooks: the base class, priorities, and the built-in hooks."""

from treadle.hooks.base import HOOK_POINTS, Hook, Priority
from treadle.hooks.ema import EMAHook
from treadle.hooks.logger import LoggerHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.hooks.timer import IterTimerHook

__all__ = ["EMAHook", "HOOK_POINTS", "Hook", "IterTimerHook", "LoggerHook", "ParamSchedulerHook", "Priority",
           "ProgressBarHook"]


def __getattr__(name: str) -> object:
    # ProgressBarHook imports rich: only when it is asked for, so `import treadle` stays light.
    if name == "ProgressBarHook":
        from treadle.hooks.progress import ProgressBarHook

        return ProgressBarHook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
