"""IterTimerHook: data time and step time of every training iteration."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class IterTimerHook(Hook):
    """Puts ``data_time`` (waiting for the batch) and ``step_time`` (the rest of the
    iteration up to this hook) into the metric store. Host clocks only: on CUDA the
    step time is the host's view, which averages out to the device's pace over a
    log interval without a sync per step.
    """

    priority = Priority.NORMAL

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        state = trainer.state
        put = trainer.store.put
        put("data_time", state.data_time)
        put("step_time", perf_counter() - state.iter_start_time)
