"""Hooks: the base class, priorities, the view of the run they get, and every built-in hook.

``from treadle.hooks import CheckpointHook`` works for each of them; the ones the
Trainer does not import itself are loaded on first use, so ``import treadle`` stays light
(ProgressBarHook imports rich).
"""

from treadle.hooks.base import HOOK_POINTS, Hook, Priority
from treadle.hooks.ema import EMAHook
from treadle.hooks.logger import LoggerHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.hooks.state import TrainState
from treadle.hooks.timer import IterTimerHook
from treadle.hooks.view import RunView

# Loaded on first use: name -> module.
_LAZY = {
    "CheckpointHook": "treadle.hooks.checkpoint",
    "EarlyStoppingHook": "treadle.hooks.early_stopping",
    "ModelSummaryHook": "treadle.hooks.summary",
    "NaNGuardHook": "treadle.hooks.nan_guard",
    "PhaseTimerHook": "treadle.hooks.phase_timer",
    "PreciseBNHook": "treadle.hooks.precise_bn",
    "ProfilerHook": "treadle.hooks.profiler",
    "ProgressBarHook": "treadle.hooks.progress",
    "RuntimeEnvHook": "treadle.hooks.runtime_env",
    "SyncBuffersHook": "treadle.hooks.sync_buffers",
    "TrainMetricsHook": "treadle.hooks.train_metrics",
}

__all__ = ["EMAHook", "HOOK_POINTS", "Hook", "IterTimerHook", "LoggerHook", "ParamSchedulerHook", "Priority",  # noqa: PLE0604 - _LAZY's keys are names
           "RunView", "TrainState", *_LAZY]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    from treadle.lazy import import_submodule  # a submodule (treadle.hooks.progress), imported on first use

    return import_submodule(__name__, name)
