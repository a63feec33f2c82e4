"""LoggerHook: console lines and ``log.jsonl`` records at the log interval."""

from __future__ import annotations

import datetime
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority, every_nth_iter
from treadle.logging.history import LogHistory
from treadle.logging.specs import build_writer, check_writers
from treadle.logging.writers import (LOGGER_NAME, TEXT_LOG_NAME, add_file_handler, get_logger, info_line,
                                     move_into_aside_dir, remove_handler)

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class LoggerHook(Hook):
    """At the log interval, reduce the metric store's windows (one host transfer) and
    write a console line and a ``log.jsonl`` record; also write one record per
    validation and test. Per iteration it costs nothing: the loop records each step's
    outputs in the store and calls this hook only at the iterations
    :meth:`next_train_iter` names.

    When a train record is written (MMEngine's LoggerHook rule, see :meth:`due`):
    epoch-based, every ``interval`` iterations counted inside the epoch, and at an
    epoch's last iteration too when the epoch has at most ``interval`` iterations (so an
    interval longer than an epoch still gives one record per epoch) or when
    ``ignore_last`` is false; iteration-based, every ``interval`` iterations of the run.
    Both also write one at the run's last iteration. A record's values are the means
    over the iterations since the previous record.

    MMEngine's ``LogProcessor`` (a translated config sets these; treadle/logging/history.py
    keeps the values on the host, read in the same one transfer per record, and checkpoints
    them per rank):

    * ``window``: each value is instead the mean of its last ``window`` values (an int, of
      any size: values from before the previous record count), since the epoch began
      (``"epoch"``), or since the run began (``"global"``).
    * ``statistics``: more values, or replacements, e.g. ``{key: loss, method: max,
      window: 100, name: loss_max}`` (methods mean, max, min, current; windows as above,
      None: ``"global"``; no ``name``: it replaces ``key``'s value).
    * ``mean_keys``: a regular expression; keys it does not match are logged with their
      last value instead of smoothed (MMEngine's ``mean_pattern``).
    * ``by_epoch``: the console line's head: true ``epoch 2/3  batch 10/100`` (the
      batch inside the epoch), false ``iter 110/300``; None (default) ``epoch 2/3  iter
      110/300``. The JSONL records are the same either way.

    With several processes each rank keeps its own values and the records' statistics are
    averaged over the ranks (times: the slowest rank's), as the means are.

    JSONL fields: ``mode``, ``epoch`` (1-based running epoch), ``iter`` (iterations
    done), ``timestamp`` (unix seconds), ``lr`` (and ``lr/<optimizer>``, ``.../pg<i>``
    for more optimizers or param groups), the window means of losses and timers,
    ``samples_per_s``, ``eta_s``, ``grad_norm`` when clipping, ``loss_scale`` and
    ``skipped_steps`` under fp16, ``max_memory_mb`` on CUDA; for val/test, the metrics
    under ``val/...`` or ``test/...``; in the first record after a resume, ``resumed_at``
    (unix seconds: when the resumed fit started training).

    ``writers``: any of "jsonl" (``log.jsonl``), "csv" (``log.csv``), "tensorboard"
    (events under ``tensorboard/``), "mlflow", "wandb" (:mod:`treadle.logging.trackers`,
    in the run directory), the same as ``{"type": name, **options}`` (the writer's
    arguments after the run directory, e.g. ``{"type": "wandb", "project": "exp"}``),
    or objects with ``write(record)``/``close()``. Only rank 0 writes.

    While a ``ProgressBarHook`` is live, the console lines are printed above the bar by
    rich (see ``treadle/hooks/progress.py``); ``log.txt`` and the writers are unchanged.

    Log files across runs (writers with ``drop_after``: the JSONL, CSV and TensorBoard
    writers; with ``move_aside``: the JSONL and CSV ones; with ``earlier_files``: the
    TensorBoard one), done at ``before_train``, so only ``fit()`` does it:

    * a run resumed from a checkpoint (``after_load_checkpoint`` notes its position)
      first drops, from ``log.jsonl`` and ``log.csv``, the records the interrupted run
      wrote after that position (rewriting each file atomically), since the resumed run
      writes them again: the files then equal the uninterrupted run's, record for record
      (timestamps, timings and ``resumed_at`` aside). TensorBoard's events after it are hidden from its
      reader instead (``TensorBoardWriter.drop_after``: a ``SessionLog.START``).
      ``log.txt`` keeps every line of both processes;
      records this trainer wrote itself (a ``validate()`` before ``fit()``) stay.
    * a fresh ``fit()`` (not resumed, iteration 0) in a ``work_dir`` whose log files hold
      an earlier run's records moves those to ``log.<time>.jsonl`` / ``log.<time>.csv``
      (``<time>``: when that run last wrote, ``%Y%m%d_%H%M%S``), so ``log.jsonl`` holds
      one run; records this trainer wrote before (a ``validate()`` before ``fit()``) stay.
      The earlier run's TensorBoard event files move to ``tensorboard/<time>/``, which
      TensorBoard shows as a run of its own. A ``fit()`` with ``resume=True`` that found no
      checkpoint is not that: what the directory holds is this run's own start, killed
      before its first save, and its records go as a resume from iteration 0 drops them.
    * ``validate()``/``test()`` alone append (e.g. an evaluation of a finished run). Of
      weights alone (no training state loaded: iteration 0), their TensorBoard events go
      to ``tensorboard/val/`` or ``tensorboard/test/`` when the directory already holds
      event files (``TensorBoardWriter.keep_apart``).
    """

    priority = Priority.BELOW_NORMAL

    def __init__(self, interval: int = 50, writers: tuple[Any, ...] = ("jsonl", "csv", "tensorboard"),
                 text_log: bool = True, ignore_last: bool = True, window: int | str | None = None,
                 statistics: list[dict[str, Any]] | tuple[()] = (), mean_keys: str | None = None,
                 by_epoch: bool | None = None) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"log interval must be an int >= 1, got {interval!r}")
        if not isinstance(statistics, (list, tuple)):
            raise TypeError(f"LoggerHook statistics={statistics!r}; expected a list of mappings")
        if mean_keys is not None and not isinstance(mean_keys, str):
            raise TypeError(f"LoggerHook mean_keys={mean_keys!r}; expected a regular expression (str) or None")
        if by_epoch is not None and not isinstance(by_epoch, bool):
            raise TypeError(f"LoggerHook by_epoch={by_epoch!r}; expected true, false or null")
        self.window = window
        self.by_epoch = by_epoch
        # Values kept beyond one record, only when a window or statistic needs them.
        self.history = (LogHistory(window, list(statistics), mean_keys)
                        if window is not None or statistics or mean_keys is not None else None)
        if not isinstance(ignore_last, bool):
            raise TypeError(f"LoggerHook ignore_last must be true or false, got {ignore_last!r}")
        check_writers("LoggerHook writers", writers)
        self.interval = interval
        self.ignore_last = ignore_last
        self.writer_specs = tuple(writers)
        self.text_log = text_log
        self._writers: list[Any] = []
        self._failed: set[int] = set()  # id() of writers whose write() raised
        self._handler: Any = None
        self._batch_size: int | None = None
        # Looked up once (getLogger takes the logging module's lock); get_logger() has
        # set its level and handler by the first record (the Trainer logs at start).
        self._logger = logging.getLogger(LOGGER_NAME)
        # add_listener / add_source: other hooks that read each train record's values (one
        # host transfer per interval for all) or add values of their own to it.
        self._listeners: list[Any] = []
        self._sources: list[Any] = []
        # Log files across runs (see the class docstring): the position of a checkpoint
        # loaded since the last fit() began, records written by this hook, the newest
        # modification time of the log files before this hook first opened them.
        self._resume_at: tuple[int, bool] | None = None
        self._records = 0
        self._earlier_mtime: float | None = None
        self._earlier_events: list[Path] = []  # an earlier run's TensorBoard event files
        self._opened = False
        self._fit_started = False
        # A resumed fit's start (unix time): its first record carries it as ``resumed_at``, so
        # that a report leaves the pause between the two processes out of the epoch's time.
        self._resumed_at: float | None = None

    def add_listener(self, fn: Any) -> None:
        """Call ``fn(trainer, values)`` with each train record's flushed, rank-reduced values,
        after the record is written (the NaN guard checks these: no read of its own)."""
        if fn not in self._listeners:
            self._listeners.append(fn)

    def add_source(self, fn: Any) -> None:
        """Call ``fn(trainer) -> {key: value}`` on every rank as each train record is built;
        its values join the record as they are (already reduced by their producer, e.g.
        train metrics' ``compute()``)."""
        if fn not in self._sources:
            self._sources.append(fn)

    def before_save_checkpoint(self, trainer: "RunView", checkpoint: dict[str, Any]) -> None:
        """Every record logged so far is written and durable before the checkpoint commits,
        so a run killed after the commit and resumed from it loses none (writers with a
        ``sync()``: the JSONL, CSV and TensorBoard files; once per save)."""
        for w in self._writers:
            sync = getattr(w, "sync", None)
            if callable(sync):
                sync()

    def after_load_checkpoint(self, trainer: "RunView", checkpoint: dict[str, Any]) -> None:
        pos = checkpoint.get("loop") or {}  # where the run goes on (treadle/engine/snapshot.py)
        self._resume_at = (int(pos.get("iter", 0)), bool(pos.get("val_due", False)))

    def before_run(self, trainer: "RunView") -> None:
        self._batch_size = getattr(trainer.train_dataloader, "batch_size", None)
        if self.history is not None:
            self.history.by_epoch = trainer.state.by_epoch
            trainer.store.attach_history(self.history)
        if trainer.work_dir is None or not trainer.is_main:
            return
        work_dir = Path(trainer.work_dir)
        if self.text_log:
            self._handler = add_file_handler(work_dir / TEXT_LOG_NAME)
        self._writers = [build_writer(w, work_dir) for w in self.writer_specs]
        if not self._opened:  # before this trainer wrote anything there: an earlier run's files
            self._opened = True
            self._earlier_events = [p for w in self._writers if callable(getattr(w, "earlier_files", None))
                                    for p in w.earlier_files()]
            files = [p for p in self._log_files() if p.is_file() and p.stat().st_size > 0] + self._earlier_events
            self._earlier_mtime = max((p.stat().st_mtime for p in files), default=None)

    def _log_files(self) -> list[Path]:
        return [Path(w.path) for w in self._writers
                if callable(getattr(w, "move_aside", None)) and getattr(w, "path", None) is not None]

    def before_train(self, trainer: "RunView") -> None:
        trainer.store.record_outputs = True  # the loop puts each step's outputs in the store
        resume, self._resume_at = self._resume_at, None
        fresh = resume is None and not self._fit_started and trainer.state.iter == 0
        if fresh and trainer.resume is True:
            # resume=True found no checkpoint: what is here is this run's own start, killed
            # before its first save, and goes as a resume from iteration 0 would take it
            resume, fresh = (0, False), False
        self._fit_started = True
        earlier_events, self._earlier_events = self._earlier_events, []
        if not self._writers:
            return
        logger = get_logger()
        if resume is not None:  # the interrupted run's records after the checkpoint are written again
            self._resumed_at = round(time.time(), 3) if resume != (0, False) else None
            iteration, val_due = resume
            for w in self._writers:
                drop = getattr(w, "drop_after", None)
                if callable(drop):
                    n = drop(iteration, val_due, keep_last=self._records)
                    if n:
                        logger.info(f"{_file_name(w)}: dropped {n} record(s) the interrupted run wrote after its "
                                    f"checkpoint at iteration {iteration}; this run writes them again")
        elif fresh and self._earlier_mtime is not None:
            stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(self._earlier_mtime))
            for w in self._writers:
                move = getattr(w, "move_aside", None)
                if callable(move):
                    dest = move(stamp, keep_last=self._records)
                    if dest is not None:
                        logger.info(f"{_file_name(w)}: an earlier run's records moved to {dest.name}")
            # Event files are never rewritten: an earlier run's go to a subdirectory, which
            # TensorBoard shows as a run of its own. This trainer's own (a validate() before
            # fit()) were made after the list was taken, and stay.
            moved = move_into_aside_dir(earlier_events, stamp)
            if moved is not None:
                logger.info(f"{moved.parent.name}/: an earlier run's event files moved to "
                            f"{moved.parent.name}/{moved.name}/")

    def after_run(self, trainer: "RunView") -> None:
        writers, self._writers = self._writers, []
        failed, self._failed = self._failed, set()
        error: BaseException | None = None
        for w in writers:  # every writer is closed (and writes what it kept), even if one fails
            try:
                w.close()
            except Exception as e:
                if id(w) in failed:  # its write() error is the one being raised: this one must not hide it
                    get_logger().error(f"log writer {type(w).__name__}: close() failed after its write() had "
                                       f"failed: {type(e).__name__}: {e}")
                    continue
                error = error or e
        if self._handler is not None:
            remove_handler(self._handler)
            self._handler = None
        if error is not None:
            raise error

    def _write(self, record: dict[str, Any]) -> None:
        if self._resumed_at is not None and record.get("mode") in ("train", "val"):
            record["resumed_at"], self._resumed_at = self._resumed_at, None
        if self._writers:
            self._records += 1
        for w in self._writers:
            try:
                w.write(record)
            except BaseException:
                self._failed.add(id(w))
                raise

    def before_train_epoch(self, trainer: "RunView") -> None:
        if self.history is not None and trainer.state.inner_iter == 0:  # not a resumed open epoch
            self.history.start_epoch()

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        # The loop calls this only at the iterations next_train_iter names (or another
        # hook's); it has put the step's outputs into the store already.
        state = trainer.state
        if self.due(state):
            self._log_train(trainer, state.iter + 1)

    def next_train_iter(self, state: Any) -> int:
        """The first iteration from ``state.iter`` whose train record is due: the class
        docstring's rule, or the run's last iteration. Epoch-based, an answer past the
        running epoch's end (its last iteration not due) is asked again in the next epoch."""
        i, n = state.iter, self.interval
        per_epoch = state.iters_per_epoch
        if not state.by_epoch or not per_epoch:
            return every_nth_iter(state, n)
        k = state.inner_iter + 1  # iteration i is the k-th of its epoch
        due = i + (-k) % n  # the next k that is a multiple of n
        last = i + per_epoch - k  # the epoch's last iteration
        if i <= last < due and (not self.ignore_last or per_epoch <= n):
            due = last
        return min(due, state.max_iters - 1) if state.max_iters else due

    def due(self, state: Any) -> bool:
        """Whether the running iteration's train record is due (:meth:`next_train_iter`)."""
        return self.next_train_iter(state) == state.iter

    def _log_train(self, trainer: "RunView", done: int) -> None:
        state = trainer.state
        record: dict[str, Any] = {"mode": "train", "epoch": state.epoch + 1, "iter": done,
                                  "timestamp": round(time.time(), 3)}
        record.update(trainer.learning_rates)
        record.update(self._optim_values(trainer))
        values = self._flush(trainer.store, state.inner_iter + 1)  # after the grad norms joined: one transfer
        values = trainer.strategy.reduce_log_values(values)  # several ranks: mean, max for times
        record.update(values)
        for source in self._sources:
            record.update(source(trainer))
        per_iter = values.get("data_time", 0.0) + values.get("step_time", 0.0)
        if per_iter and self._batch_size:
            record["samples_per_s"] = round(self._batch_size * trainer.strategy.dp_size / per_iter, 2)
        if state.max_iters and per_iter:
            record["eta_s"] = round(per_iter * (state.max_iters - done), 1)
        if trainer.strategy.device.type == "cuda":  # a host-side counter: no device sync
            import torch

            record["max_memory_mb"] = round(torch.cuda.max_memory_allocated(trainer.strategy.device) / 2**20, 1)
        self._write(record)
        logger = self._logger
        if trainer.is_main and logger.isEnabledFor(logging.INFO):
            info_line(logger, _format_train_line(record, state, self.by_epoch))
        for fn in self._listeners:
            fn(trainer, values)

    def _flush(self, store: Any, epoch_iters: int) -> dict[str, float]:
        """This record's values from the store: the interval's means, or the history's
        statistics (the store's ``latest`` then holds those, as the progress bar reads it)."""
        if self.history is None:
            return store.flush()
        raw = store.flush_values()
        fresh = {k: float(sum(v)) / len(v) for k, v in raw.items()}
        self.history.add(raw, epoch_iters)
        values = self.history.values(fresh, list(raw))
        store.latest.update(values)
        return values

    @staticmethod
    def _optim_values(trainer: "RunView") -> dict[str, Any]:
        """Grad norms (into the store, reduced with the rest) and fp16 scaler figures."""
        out: dict[str, Any] = {}
        single = len(trainer.optim_wrappers) == 1
        for name, ow in trainer.optim_wrappers.items():
            suffix = "" if single else f"/{name}"
            if ow.grad_norms:
                trainer.store.extend("grad_norm" + suffix, ow.grad_norms)
                ow.grad_norms.clear()
            if ow.scaler is not None:
                out["loss_scale" + suffix] = ow.scaler.get_scale()
                out["skipped_steps" + suffix] = ow.skipped_steps
        return out

    # At the first point that has the results, so that the lines of later hooks (the best
    # checkpoint saved from them, early stopping) come after the line that shows them.
    def after_val_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        self._log_eval(trainer, "val", metrics)

    def after_test_epoch(self, trainer: "RunView", metrics: dict[str, Any]) -> None:
        self._log_eval(trainer, "test", metrics)

    def _log_eval(self, trainer: "RunView", mode: str, metrics: dict[str, Any]) -> None:
        state = trainer.state
        # The epoch of the last training iteration, 1-based as the train lines count it: an
        # iteration-based validation comes inside an open epoch.
        loop = trainer.train_loop
        epoch = state.epoch + 1 if loop is not None and loop.epoch_open else state.epoch
        record = {"mode": mode, "epoch": epoch, "iter": state.iter, "timestamp": round(time.time(), 3), **metrics}
        if not self._fit_started and state.iter == 0:  # of weights alone: see TensorBoardWriter.keep_apart
            for w in self._writers:
                apart = getattr(w, "keep_apart", None)
                moved = apart(mode) if callable(apart) else None
                if moved is not None:
                    get_logger().info(f"{moved.parent.name}/: this {mode} run's events go to "
                                      f"{moved.parent.name}/{moved.name}/, apart from the training run's")
        self._write(record)
        if trainer.is_main:
            shown = "  ".join(f"{k} {format_value(k, v)}" for k, v in metrics.items())
            # After no training (validate() of loaded weights): no epoch 0, iter 0 to show.
            where = f" (epoch {epoch}, iter {state.iter})" if state.iter or epoch else ""
            get_logger().info(f"{mode}{where}  {shown}")


def _file_name(writer: Any) -> str:
    path = getattr(writer, "path", None)
    return Path(path).name if path is not None else type(writer).__name__


def format_value(key: str, v: Any) -> str:
    """A logged value as the console shows it: one format per kind of value, whatever
    its size. Learning rates ``2.00e-03``; times (``*_time``, ``time/*``, in seconds)
    as milliseconds ``12.3ms``; rates (``*_per_s``) ``1234.5``; memory (``*_mb``)
    ``512.0``; the fp16 loss scale ``65536``; anything else (losses, metrics, norms) 4
    significant digits: ``0.04982``, ``2.102``, ``1.046e+04``. Integers as they are.
    (``log.jsonl`` keeps the values as they are.)"""
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    head, tail = key.split("/", 1)[0], key.rsplit("/", 1)[-1]
    if head == "lr":
        return f"{v:.2e}"
    if head == "time" or tail.endswith("_time"):
        return f"{v * 1000:.1f}ms"
    if tail.endswith(("_per_s", "_mb")):
        return f"{v:.1f}"
    if head == "loss_scale":
        return f"{v:.0f}"
    return _four_digits(v)


def _four_digits(v: float) -> str:
    """4 significant digits, trailing zeros kept (``1.120``, ``0.04982``, ``7075``);
    scientific outside [1e-4, 1e4) (``1.046e+04``)."""
    if not math.isfinite(v) or v == 0:
        return str(v) if v != 0 else "0.000"
    magnitude = math.floor(math.log10(abs(v)))
    if not -4 <= magnitude < 4:
        return f"{v:.3e}"
    text = f"{v:.{max(0, 3 - magnitude)}f}"
    return text if len(text.lstrip("-").replace(".", "").lstrip("0")) <= 4 else f"{float(text):.{max(0, 2 - magnitude)}f}"


def _format_train_line(record: dict[str, Any], state: Any, by_epoch: bool | None = None) -> str:
    head = ""
    if by_epoch is not False:
        head = f"epoch {record['epoch']}" + (f"/{state.max_epochs}" if state.max_epochs else "") + "  "
    if by_epoch:  # the batch inside the epoch (MMEngine's ``[epoch][batch/length]``)
        head += f"batch {state.inner_iter + 1}" + (f"/{state.iters_per_epoch}" if state.iters_per_epoch else "")
    else:
        head += f"iter {record['iter']}" + (f"/{state.max_iters}" if state.max_iters else "")
    skip = {"mode", "epoch", "iter", "eta_s", "timestamp", "resumed_at"}
    parts = [f"{k} {format_value(k, v)}" for k, v in record.items() if k not in skip]
    if "eta_s" in record:
        parts.append(f"eta {datetime.timedelta(seconds=int(record['eta_s']))}")
    return head + "  " + "  ".join(parts)
