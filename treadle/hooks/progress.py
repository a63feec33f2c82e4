"""ProgressBarHook: a live rich progress bar for training, validation and test.

``Trainer(progress="auto")`` (the default) adds it when stdout is a terminal and this
is the main process; ``progress=True`` forces it (ANSI output even when stdout is not
a terminal), ``False`` turns it off. Without the bar, LoggerHook's plain lines are the
progress report, as before.

Per iteration the hook only advances the bar's counter (``Progress.advance``: about a
microsecond, no device access); rich redraws from its own thread a few times a second.
The loss shown is the one LoggerHook already averaged and read at its interval
(``trainer.store.latest``), so the bar never reads a device value itself.

While the bar is live, log records that would go to the terminal (the treadle
console handler, and any terminal StreamHandler of the treadle or root logger) are
printed through the bar's console, above the bar, instead of by their handler, so
the per-interval lines stay and the bar is not torn; ``log.txt`` and the other
writers are untouched. ``print()`` is redirected above the bar the same way (rich's
``redirect_stdout``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class _RateColumn(ProgressColumn):
    """Iterations per second (seconds per iteration when slower than 1 it/s)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text("? it/s", style="progress.data.speed")
        text = f"{speed:.2f} it/s" if speed >= 1 else f"{1 / speed:.2f} s/it"
        return Text(text, style="progress.data.speed")


class _ToConsole(logging.Filter):
    """Prints a handler's records through the live console and stops the handler
    from writing them itself."""

    def __init__(self, handler: logging.Handler, console: Console) -> None:
        super().__init__()
        self.handler = handler
        self.console = console

    def filter(self, record: logging.LogRecord) -> bool:
        self.console.print(self.handler.format(record), markup=False, highlight=False, emoji=False, soft_wrap=True)
        return False


class ProgressBarHook(Hook):
    """A live progress bar: epoch, iterations done/total, it/s, elapsed, ETA and the
    latest logged loss; a short task for each validation or test pass.

    Args:
        console: the rich Console to draw on (default: a new one on stdout).
        force_terminal: passed to the default Console; True draws even when stdout
            is not a terminal (``Trainer(progress=True)``).
        refresh_per_second: redraws per second (done by rich's own thread).
        show_eval: also show validation and test passes.

    Only the main process draws (``trainer.is_main``).
    """

    priority = Priority.LOW  # after LoggerHook: the loss of this interval is in store.latest

    def __init__(self, console: Console | None = None, force_terminal: bool | None = None,
                 refresh_per_second: float = 4.0, show_eval: bool = True) -> None:
        if refresh_per_second <= 0:
            raise ValueError(f"refresh_per_second must be > 0, got {refresh_per_second!r}")
        self.console = console
        self.force_terminal = force_terminal
        self.refresh_per_second = refresh_per_second
        self.show_eval = show_eval
        self.interval = 50
        self.progress: Progress | None = None
        self._train: TaskID | None = None
        self._eval: TaskID | None = None
        self._filters: list[tuple[logging.Handler, logging.Filter]] = []

    # -- lifetime of the live display ---------------------------------------------
    def before_run(self, trainer: "RunView") -> None:
        if not trainer.is_main:
            return
        from treadle.hooks.logger import LoggerHook

        loggers = [h for h in trainer.hooks if isinstance(h, LoggerHook)]
        self.interval = loggers[0].interval if loggers else trainer.log_interval
        console = self.console or Console(force_terminal=self.force_terminal)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"), console=console,
                                 refresh_per_second=self.refresh_per_second)
        self._divert_logging(console)
        self.progress.start()

    def after_run(self, trainer: "RunView") -> None:
        if self.progress is None:
            return
        try:
            self.progress.stop()  # a last refresh: the final counts stay on screen
        finally:
            for handler, f in self._filters:
                handler.removeFilter(f)
            self._filters = []
            self.progress = None
            self._train = self._eval = None

    def _divert_logging(self, console: Console) -> None:
        for logger in (get_logger(), logging.getLogger()):
            for h in logger.handlers:
                if _writes_to_terminal(h, console):
                    f = _ToConsole(h, console)
                    h.addFilter(f)
                    self._filters.append((h, f))

    # -- training ---------------------------------------------------------------------
    def before_train(self, trainer: "RunView") -> None:
        if self.progress is None:
            return
        s = trainer.state
        self._train = self.progress.add_task(_epoch_text(s), total=s.max_iters, completed=s.iter, info="")

    def before_train_epoch(self, trainer: "RunView") -> None:
        if self.progress is not None and self._train is not None:
            self.progress.update(self._train, description=_epoch_text(trainer.state))

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        progress = self.progress
        if progress is None or self._train is None:
            return
        progress.advance(self._train)
        state = trainer.state
        done = state.iter + 1
        if done % self.interval == 0 or done == state.max_iters:  # LoggerHook just flushed
            loss = trainer.store.latest.get("loss")
            if loss is not None:
                progress.update(self._train, info=f"loss {loss:.4g}")

    # -- validation and test ------------------------------------------------------------
    def before_val(self, trainer: "RunView") -> None:
        self._start_eval(trainer, "val")

    def after_val_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        if self._eval is not None:
            self.progress.advance(self._eval)  # type: ignore[union-attr]  # _eval is set only with a progress

    def after_val(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        self._end_eval()

    def before_test(self, trainer: "RunView") -> None:
        self._start_eval(trainer, "test")

    # A test pass advances and closes its bar exactly as a validation pass does.
    after_test_iter = after_val_iter
    after_test = after_val

    def _start_eval(self, trainer: "RunView", mode: str) -> None:
        if self.progress is None or not self.show_eval:
            return
        self._eval = self.progress.add_task(mode, total=_eval_total(trainer, mode, self._train is not None), info="")

    def _end_eval(self) -> None:
        if self._eval is None:
            return
        if self._train is not None:  # inside fit: draw the final count, then make room for training
            self.progress.refresh()  # type: ignore[union-attr]  # _eval is set only with a progress
            self.progress.remove_task(self._eval)  # type: ignore[union-attr]  # as above; the logged line stays
        self._eval = None  # validate()/test(): the finished task is the last thing shown


def _epoch_text(state: Any) -> str:
    epoch = f"epoch {state.epoch + 1}"
    return f"{epoch}/{state.max_epochs}" if state.max_epochs else epoch


def _eval_total(trainer: "RunView", mode: str, in_fit: bool) -> int | None:
    """Batches in this pass: the loader's length, or the count of an iteration
    workflow's ``("val", k)`` phase during fit; None when unknown."""
    loop = trainer.train_loop
    if mode == "val" and in_fit and loop is not None and not loop.by_epoch:
        counts = [k for m, k in loop.workflow if m == "val" and k is not None]
        if counts:
            return counts[0]
    loader = trainer.val_dataloader if mode == "val" else trainer.test_dataloader
    try:
        if isinstance(loader, Mapping):  # several sets by name: a pass runs each
            return sum(len(one) for one in loader.values())
        return len(loader)
    except TypeError:
        return None


def _writes_to_terminal(handler: logging.Handler, console: Console) -> bool:
    """The console handlers whose lines would tear the bar (not files, not captures)."""
    if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
        return False
    if handler.get_name() == "treadle-console":
        return True
    stream = getattr(handler, "stream", None)
    if stream is console.file:
        return True
    try:
        return bool(stream.isatty())  # type: ignore[union-attr]  # None or no isatty: caught below
    except (AttributeError, ValueError):
        return False
