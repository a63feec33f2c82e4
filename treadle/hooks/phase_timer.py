"""Per-phase times of the default train step: ``Trainer(timer_breakdown=True)``.

VISSL's PerfTimer idea, without a sync per step. The timed step (see
``treadle/engine/step.py``) takes five marks per iteration::

    begin   | move + forward | mark | loss_fn + parse_losses | mark | backward | mark
            | after_backward hooks, clip, before_optimizer_step hooks, step, zero_grad | end

On CPU a mark is ``perf_counter()``; on CUDA it is a ``torch.cuda.Event`` recorded in
the current stream, so the marks time the device's work and nothing waits for it.
:class:`PhaseTimerHook` turns the marks of a log window into durations when the
logger is about to flush (one sync on CUDA, at the log interval only) and puts them
in the metric store as ``time/forward``, ``time/loss``, ``time/backward``,
``time/optimizer`` and ``time/hooks``: the rest of ``step_time`` (before_train_iter
and after_train_iter hooks, the loop's bookkeeping), over the same iterations (those
completed since the previous record). So
``data_time + step_time == data_time + sum of time/*`` over a window (on CUDA the
phases are device times and ``step_time`` is the host's, so ``time/hooks`` is
clamped at 0).
"""

from __future__ import annotations

from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch

from treadle.hooks.base import Hook
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.logging.store import MetricStore
    from treadle.hooks.view import RunView

#: The timed phases, in the order of the marks between them.
PHASES = ("forward", "loss", "backward", "optimizer")


class PhaseTimer:
    """The marks of each iteration, turned into durations only in :meth:`drain`.

    Args:
        device: the training device; "cuda" uses CUDA events, anything else the host clock.
        max_rows: iterations kept between drains (older ones are dropped).
    """

    def __init__(self, device: torch.device | str = "cpu", max_rows: int = 10_000) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._marks: list[Any] = []
        self._rows: deque[list[Any]] = deque(maxlen=max_rows)
        self._free: list[Any] = []  # CUDA events whose times were read: recorded again
        # Chosen once, so a mark is one call with no branch.
        self.mark = self._event_mark if self.cuda else self._host_mark

    def _host_mark(self) -> None:
        self._marks.append(perf_counter())

    def _event_mark(self) -> None:
        ev = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        ev.record()
        self._marks.append(ev)

    def begin(self) -> None:
        """First mark of an iteration (drops an unfinished one)."""
        self._marks = []
        self.mark()

    def end(self) -> None:
        """Last mark of an iteration; keeps it if every phase was marked."""
        self.mark()
        marks, self._marks = self._marks, []
        if len(marks) == len(PHASES) + 1:
            self._rows.append(marks)
        elif self.cuda:
            self._free.extend(marks)

    def drain(self, keep_last: int = 0) -> dict[str, list[float]]:
        """Seconds of each phase for every iteration since the last drain, but the last
        ``keep_last`` (they go to the next drain).

        On CUDA this waits for the last event it reads: call it at the log interval.
        """
        rows = list(self._rows)
        self._rows.clear()
        if keep_last:
            self._rows.extend(rows[-keep_last:])
            rows = rows[:-keep_last]
        out: dict[str, list[float]] = {p: [] for p in PHASES}
        if not rows:
            return out
        if self.cuda:
            rows[-1][-1].synchronize()  # same stream: every earlier event is done too
            for marks in rows:
                for p, a, b in zip(PHASES, marks, marks[1:]):
                    out[p].append(a.elapsed_time(b) / 1e3)  # milliseconds -> seconds
                self._free.extend(marks)
        else:
            for marks in rows:
                for p, a, b in zip(PHASES, marks, marks[1:]):
                    out[p].append(b - a)
        return out

    def reset(self) -> None:
        """Forget marks not yet drained."""
        self._rows.clear()
        self._marks = []


class PhaseTimerHook(Hook):
    """Puts the phase times of each log window into the metric store, just before
    LoggerHook flushes it (so they are logged with the window they belong to).

    Runs after IterTimerHook (it needs this window's ``step_time``) and before
    LoggerHook; flushes on the same iterations as the logger.
    """

    priority = 55  # between IterTimerHook (NORMAL, 50) and LoggerHook (BELOW_NORMAL, 60)

    def __init__(self, timer: PhaseTimer) -> None:
        self.timer = timer
        self.interval = 50
        self._warned = False

    def before_run(self, trainer: "RunView") -> None:
        from treadle.hooks.logger import LoggerHook

        loggers = [h for h in trainer.hooks if isinstance(h, LoggerHook)]
        self.interval = loggers[0].interval if loggers else trainer.log_interval
        self.timer.reset()

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        state = trainer.state
        done = state.iter + 1
        if done % self.interval == 0 or done == state.max_iters:
            # The running iteration's phases wait for the next record, as its step_time
            # does (the loop records an iteration's times when it ends): the windows match.
            if not put_phase_times(self.timer.drain(keep_last=1), trainer.store) and not self._warned:
                self._warned = True
                get_logger().warning("timer_breakdown: the train step took no phase marks; only the default "
                                     "step is timed (not model.train_step or a Trainer.train_step override)")


def put_phase_times(durations: dict[str, list[float]], store: "MetricStore") -> bool:
    """``time/<phase>`` windows, and ``time/hooks``: mean step_time minus the phases.
    Returns False when there was nothing to put."""
    if not durations[PHASES[0]]:
        return False
    phases = 0.0
    for name, values in durations.items():
        store.extend(f"time/{name}", values)
        phases += sum(values) / len(values)
    step = store.window("step_time")
    if step:
        store.put("time/hooks", max(0.0, sum(step) / len(step) - phases))
    return True
