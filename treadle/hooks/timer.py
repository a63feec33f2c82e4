"""IterTimerHook: data time and step time of every training iteration."""

from __future__ import annotations

from typing import TYPE_CHECKING

from treadle.hooks.base import Hook, Priority

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class IterTimerHook(Hook):
    """Has the train loop record ``data_time`` (waiting for the batch) and
    ``step_time`` (the rest of the iteration: the step and every ``after_train_iter``
    hook) of each iteration in the metric store, which the logger averages over its
    interval. An iteration's times join the store when it ends, so a record holds those
    of the iterations completed since the previous one (the running iteration's, whose
    hooks are still running, go to the next record).

    Host clocks only, read by the loop (two ``perf_counter`` calls per iteration, which
    it reads anyway): on CUDA the step time is the host's view, which averages out to
    the device's pace over a log interval without a sync per step. Nothing is called per
    iteration.
    """

    priority = Priority.NORMAL

    def before_train(self, trainer: "RunView") -> None:
        trainer.store.record_times = True
