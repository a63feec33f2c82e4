"""More files for log records to go to: CSV and TensorBoard (trackers: trackers.py).

Every writer has the interface of :class:`treadle.logging.writers.JsonlWriter`::

    writer.write(record)   # one log.jsonl object: {"mode", "epoch", "iter", ...}
    writer.close()

They are called only at the log interval (records are plain Python values by
then), so none of them touches the device. The optional packages (tensorboard,
mlflow, wandb) are imported when a writer is built, never when treadle is.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import socket
import time
from numbers import Real
from pathlib import Path
from typing import Any

from treadle.logging.event_files import ShownEvent, event_file_names, frame, shown_events
from treadle.logging.events import file_version_event, scalars_event, session_start_event
from treadle.logging.writers import (BatchedWriter, _step, aside_path, move_whole_aside, replace_atomically,
                                     written_after)

# Record keys that say where a record belongs rather than what was measured.
_META_KEYS = ("mode", "iter", "resumed_at")  # (resumed_at: a resumed fit's start, for reports)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric values of ``record`` keyed ``"{mode}/{key}"``.

    Keys that already start with the mode (``"val/acc"`` in a val record) keep their
    name, so the prefix is never doubled. ``mode`` and ``iter`` (the step) are left
    out, as are booleans, strings (including the ``"nan"`` strings of log.jsonl) and
    any other non-numeric value.
    """
    mode = str(record.get("mode", "train"))
    prefix = mode + "/"
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _META_KEYS or isinstance(value, bool) or not isinstance(value, Real):
            continue
        tag = key if key.startswith(prefix) else prefix + key
        out[tag] = float(value)
    return out


# -- CSV ----------------------------------------------------------------------------
class CsvWriter(BatchedWriter):
    """One CSV file, one row per record, readable with ``csv.DictReader``.

    Design: a single file with the union of all columns (train and val rows share
    it; the ``mode`` column tells them apart, a value a record lacks is empty). When
    a record brings a key not yet in the header -- in practice only the first train
    and the first val record -- the file is rewritten once with the wider header
    (to a temporary file, then renamed, so a crash never leaves half a file);
    otherwise rows are appended. An existing file is appended to, its header adopted
    (the JSONL writer appends too). :meth:`drop_after` (a resumed run) and
    :meth:`move_aside` (a fresh run) rewrite it first, as ``JsonlWriter``'s do.

    Rows are kept in memory and written every ``flush_secs`` seconds, at :meth:`flush`
    and at :meth:`close` (see :class:`~treadle.logging.writers.BatchedWriter` for why:
    a row formatted and written at each log interval cost the training thread hundreds
    of microseconds, a batch a few per row). A crash loses at most the last
    ``flush_secs`` of rows; log.jsonl is at most a second behind.

    Lists and dicts are written as JSON; NaN/inf as ``nan``/``inf`` (``float()``
    reads them back).
    """

    def __init__(self, path: str | Path, flush_secs: float = 10.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fields: list[str] = []
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, newline="", encoding="utf-8") as f:
                self.fields = next(csv.reader(f), [])
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=self.fields)
        self._start_batching(flush_secs, first_at_once=False)

    def _write_batch(self, rows: list[dict[str, Any]]) -> None:
        cells = [{k: _cell(v) for k, v in r.items()} for r in rows]
        known = set(self.fields)
        new = list(dict.fromkeys(k for row in cells for k in row if k not in known))
        if new:
            self._widen(self.fields + new)
        self._writer.writerows(cells)
        self._file.flush()

    def _widen(self, fields: list[str]) -> None:
        """Rewrite the file under a header with more columns (old rows keep their values)."""
        if not self.fields:  # an empty file: the header is simply its first line
            self.fields = fields
            self._writer = csv.DictWriter(self._file, fieldnames=fields)
            self._writer.writeheader()
            return
        self._file.close()
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))

        def fill(f: Any) -> None:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        replace_atomically(self.path, fill, newline="")
        self.fields = fields
        self._reopen()

    def _reopen(self) -> None:
        self._file.close()  # already closed unless reading it failed
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=self.fields)

    def _read_rows(self) -> tuple[list[str], list[list[str]], bool]:
        """Write what is kept, close the file and return its header, its complete rows,
        and whether they are the file as it is (a last row cut short by a killed process
        is left out)."""
        self.flush()
        self._file.close()
        if not self.path.exists():
            return [], [], True
        with open(self.path, newline="", encoding="utf-8") as f:
            text = f.read()
        rows = list(csv.reader(io.StringIO(text, newline="")))
        intact = not text or text.endswith("\n")
        if not intact and len(rows) > 1:
            rows.pop()
        header = rows[0] if rows else []
        return header, rows[1:], intact

    def _write_rows(self, path: Path, header: list[str], rows: list[list[str]]) -> None:
        def fill(f: Any) -> None:
            w = csv.writer(f)
            if header:
                w.writerow(header)
            w.writerows(rows)
        replace_atomically(path, fill, newline="")

    def drop_after(self, iteration: int, val_due: bool = False, keep_last: int = 0) -> int:
        """Resuming from a checkpoint taken at ``iteration`` (``val_due``: a validation
        was still due there): rewrite the file atomically without the rows written after
        that position (see :func:`treadle.logging.writers.written_after`) but the last
        ``keep_last`` (this run's own); the header is kept. Returns how many rows were
        dropped."""
        try:
            header, rows, intact = self._read_rows()
            older = max(len(rows) - keep_last, 0)
            kept = [r for r in rows[:older] if not written_after(dict(zip(header, r)), iteration, val_due)]
            kept += rows[older:]
            if len(kept) != len(rows) or not intact:
                self._write_rows(self.path, header, kept)
            self.fields = header
            return len(rows) - len(kept)
        finally:
            self._reopen()

    def move_aside(self, stamp: str, keep_last: int = 0) -> Path | None:
        """A fresh run starts: move the rows of earlier runs to ``log.<stamp>.csv`` and
        leave this run's last ``keep_last`` rows under the same header. Returns the new
        file, or None when there was nothing earlier."""
        try:
            header, rows, _ = self._read_rows()
            if keep_last <= 0:  # the whole file, as it is: one rename
                moved = move_whole_aside(self.path, stamp)
                if moved is not None:
                    self.fields = []  # the next batch writes a header
                return moved
            older = len(rows) - keep_last
            if older <= 0:
                return None
            dest = aside_path(self.path, stamp)
            self._write_rows(dest, header, rows[:older])
            self._write_rows(self.path, header, rows[older:])
            return dest
        finally:
            self._reopen()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": float() parses them
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


# -- TensorBoard --------------------------------------------------------------------
def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # e.g. sys.modules[package] is None: as if not installed
        return False


_file_counter = itertools.count()


class TensorBoardWriter(BatchedWriter):
    """Scalars into a TensorBoard event file under ``log_dir``.

    Each numeric value becomes the scalar ``"{mode}/{key}"`` (see :func:`scalars`)
    at global step ``record["iter"]``, one event per record. The file is the standard
    ``events.out.tfevents.*`` record format that TensorBoard and its ``EventAccumulator``
    read; the events' bytes come from :mod:`treadle.logging.events`, equal to protobuf's
    own serialization without importing it (about 20 ms at a run's start). The
    ``tensorboard`` package, which reads the files, is required all the same.

    Records are kept in memory and written every ``flush_secs`` seconds, at
    :meth:`flush` and at :meth:`close` (``torch.utils.tensorboard`` flushes every 120 s).
    Why: ``SummaryWriter`` built and serialized a protobuf per record on the caller's
    thread and framed it on its own thread with a pure-Python CRC32C (about 50 us for
    a 300-byte event) that held the GIL. Measured here, an event per log interval,
    encoded in code gone cold since the last interval (inline, or on a writer thread
    that then trades the GIL with the training thread), cost the training thread 0.2
    to 0.5 ms. Now :meth:`write` keeps a copy of the record (a microsecond); a batch is
    encoded in one go, framed (CRC-32C in google-crc32c's C code) and written with one
    system call. A crash loses
    at most the last ``flush_secs`` of events (log.jsonl, at most the last second).

    One event per record, also for a record without numbers (an empty summary, which
    TensorBoard passes over), so that records and events count alike (:meth:`drop_after`).

    A resumed run: event files are never rewritten. :meth:`drop_after` hides the events
    the interrupted run wrote after its checkpoint the way TensorBoard itself provides,
    a ``SessionLog.START`` event (what ``SummaryWriter(purge_step=)`` writes), so that
    TensorBoard shows the uninterrupted run's events, record for record.
    """

    def __init__(self, log_dir: str | Path, filename_suffix: str = "", flush_secs: float = 10.0) -> None:
        if not _installed("tensorboard"):  # the files are for TensorBoard: say so at construction
            raise ImportError("TensorBoardWriter needs the 'tensorboard' package, which is not installed: "
                              "pip install tensorboard")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # TensorBoard's naming; the counter keeps two writers of one process apart, and is
        # zero-padded so that name order (TensorBoard's reading order) is creation order:
        # unpadded, a process's tenth file of a second sorted before its ninth.
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_file_counter):06d}{filename_suffix}")
        self.path = self.log_dir / name
        self._file = open(self.path, "wb")
        self._file.write(frame(file_version_event(time.time())))
        self._file.flush()
        self._start_batching(flush_secs, first_at_once=False)

    def _keep(self, record: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return time.time(), dict(record)  # the event's wall time is the record's

    def _write_batch(self, kept: list[tuple[float, dict[str, Any]]]) -> None:
        frames = []
        for wall_time, record in kept:
            frames.append(frame(scalars_event(wall_time, _step(record), scalars(record).items())))
        if frames:
            self._file.write(b"".join(frames))  # one system call
            self._file.flush()

    def drop_after(self, iteration: int, val_due: bool = False, keep_last: int = 0) -> int:
        """Resuming from a checkpoint taken at ``iteration`` (``val_due``: a validation was
        still due there): hide from TensorBoard the events written after that position
        (see :func:`treadle.logging.writers.written_after`), which the resumed run writes
        again, but the last ``keep_last`` (this run's own, e.g. of a ``validate()`` before
        ``fit()``). Returns how many were hidden.

        How: this writer's file, renamed if need be to sort after every other event file
        of ``log_dir`` (TensorBoard reads them in name order), gets a ``SessionLog.START``
        at step ``s``, the checkpoint's iteration + 1, or its iteration when a validation
        was due there; TensorBoard's reader then drops every event read before with a
        step ``>= s``. The events at steps ``>= s`` that belong before the position (the
        train record at the checkpoint's iteration when a validation was due there, and
        the ``keep_last``) follow it, their bytes unchanged. Nothing is written when no
        event shown lies after the position. A later resume reads the files the same way,
        earlier purges included (:mod:`treadle.logging.event_files`).
        """
        self.flush()
        self._file.flush()
        self._sort_last()  # what it writes next is read after the interrupted run's events, purge or not
        start = iteration if val_due else iteration + 1
        shown = shown_events(self.log_dir)
        older = max(len(shown) - max(keep_last, 0), 0)
        later = [e for e in shown[:older] if e.step >= start]
        after = [e for e in later if _event_after(e, iteration, val_due)]
        if not after:
            return 0
        again = [e for e in later if not _event_after(e, iteration, val_due)]
        again += [e for e in shown[older:] if e.step >= start]
        frames = [frame(session_start_event(time.time(), start))] + [frame(e.data) for e in again]
        self._file.write(b"".join(frames))
        self._file.flush()
        return len(after)

    def earlier_files(self) -> list[Path]:
        """The event files of ``log_dir`` that are not this writer's: earlier runs' (or
        this run's earlier writers'), which TensorBoard would show as one run with this
        one's. A fresh run moves an earlier run's aside (``LoggerHook``)."""
        return [self.log_dir / name for name in event_file_names(self.log_dir) if name != self.path.name]

    def keep_apart(self, name: str) -> Path | None:
        """Write into ``log_dir/name/`` (a run of its own in TensorBoard) from now on, when
        ``log_dir`` holds other event files; returns that directory, or None.

        For a ``validate()`` or ``test()`` of weights alone, outside ``fit()``
        (``LoggerHook``): its record lies at iteration 0, below a finished run's steps.
        TensorBoard's default reader, its Rust data server, lets an event at step ``s``
        preempt the same tag's events at steps ``>= s`` read before it (the preempted-job
        rule), so the run's ``val/`` curves would show that one point."""
        if not self.earlier_files() or self.path.parent.name == name:
            return None
        self.flush()
        dest = self.log_dir / name
        dest.mkdir(exist_ok=True)
        self._move_file(dest / self.path.name)
        self.log_dir = dest
        return dest

    def _sort_last(self) -> None:
        """Rename this writer's file, if need be, so that TensorBoard reads it after every
        other event file of ``log_dir`` (an earlier one made in the same second)."""
        names = event_file_names(self.log_dir)
        if not names or names[-1] == self.path.name:
            return
        last = names[-1].split(".")
        if len(last) > 3 and last[3].isdigit() and len(last[3]) == 10 and last[3] != "9" * 10:  # treadle's naming
            ours = self.path.name.split(".")
            name = ".".join([*ours[:3], f"{int(last[3]) + 1:010d}", *ours[4:]])
        else:
            name = f"{names[-1]}.{os.getpid()}"
        self._move_file(self.log_dir / name)

    def _move_file(self, dest: Path) -> None:
        """Go on writing this writer's file under the path ``dest``."""
        self._file.close()
        self.path = self.path.rename(dest)
        self._file = open(self.path, "ab")



def _event_after(event: ShownEvent, iteration: int, val_due: bool) -> bool:
    """:func:`treadle.logging.writers.written_after` for an event: a validation's
    events are the ones whose tags all start with ``val/`` (see :func:`scalars`)."""
    if event.step != iteration:
        return event.step > iteration
    return val_due and bool(event.tags) and all(t.startswith("val/") for t in event.tags)


def __getattr__(name: str) -> Any:
    # MlflowWriter and WandbWriter moved to trackers.py; this import path keeps working
    # without importing that module for every run that has a work_dir.
    if name in ("MlflowWriter", "WandbWriter"):
        from treadle.logging import trackers

        return getattr(trackers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CsvWriter", "TensorBoardWriter", "scalars"]
