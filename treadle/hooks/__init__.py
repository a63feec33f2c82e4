"""Hooks: the base class, priorities, and the built-in hooks."""

from treadle.hooks.base import HOOK_POINTS, Hook, Priority
from treadle.hooks.logger import LoggerHook
from treadle.hooks.timer import IterTimerHook

__all__ = ["HOOK_POINTS", "Hook", "IterTimerHook", "LoggerHook", "Priority"]
