"""Where logged records go: the ``treadle`` logger (console, text file) and JSONL."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from numbers import Real
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from treadle.fsutil import fsync_dir, fsync_file, sync_later

LOGGER_NAME = "treadle"
TEXT_LOG_NAME = "log.txt"  # in the work_dir: every line of the console and more (LoggerHook writes it)
_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# ``logger.info(text, extra=FILE_ONLY)``: the record goes to the text log (``log.txt``)
# and other handlers, but not to treadle's console handler (see get_logger).
FILE_ONLY = {"treadle_file_only": True}
# ``extra=CONSOLE_ONLY``: the other way round (e.g. a line that points to the text log).
CONSOLE_ONLY = {"treadle_console_only": True}


def _not_file_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "treadle_file_only", False)


def _not_console_only(record: logging.LogRecord) -> bool:
    return not getattr(record, "treadle_console_only", False)


# The formatters of treadle's own two handlers, and their date formats: info_line()
# writes what they would, when a logger's handlers are exactly those.
_CONSOLE_FORMATTER = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
_FILE_FORMATTER = logging.Formatter(_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
_OWN = {id(_CONSOLE_FORMATTER): ("%H:%M:%S", _not_file_only), id(_FILE_FORMATTER): ("%Y-%m-%d %H:%M:%S", _not_console_only)}


def get_logger() -> logging.Logger:
    """The ``treadle`` logger, with a console handler unless logging is configured."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    # Respect an application's (or pytest's) own configuration of the root logger.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(_CONSOLE_FORMATTER)
        handler.set_name("treadle-console")
        handler.addFilter(_not_file_only)
        logger.addHandler(handler)
    return logger


def info_line(logger: logging.Logger, text: str) -> None:
    """``logger.info(text)``, written straight to the streams when the logger's setup is
    treadle's own (its console handler and ``log.txt``'s, nothing else in the chain):
    the same lines, without the record, caller lookup, filters and formatters that a
    line written at a log interval, in code the steps have pushed out of the caches,
    pays for several times over (the train line: about 110 us less per record on the
    development machine). Any other setup (an application's handlers, pytest's, a live
    progress bar's filter, a changed formatter) goes through ``logging`` as usual."""
    handlers = logger.handlers
    own = (not logger.filters and not logger.disabled and not (logger.propagate and logging.root.handlers)
           and logger.isEnabledFor(logging.INFO))
    if own:
        for h in handlers:
            kind = _OWN.get(id(h.formatter))
            if (kind is None or h.level > logging.INFO or h.filters != [kind[1]] or type(h) not in _DIRECT
                    or getattr(h, "failed", False) or getattr(h, "stream", None) is None):
                own = False
                break
    if not own or not handlers:
        logger.info(text)
        return
    now = time.localtime()
    for h in handlers:
        line = f"{time.strftime(_OWN[id(h.formatter)][0], now)} INFO {text}{h.terminator}"  # type: ignore[attr-defined]
        h.acquire()
        try:
            stream = h.stream  # type: ignore[attr-defined]
            stream.write(line)
            stream.flush()
        except Exception:  # as logging does: the handler says it (log.txt's once, and stops)
            h.handleError(logger.makeRecord(logger.name, logging.INFO, __file__, 0, text, (), None))
        finally:
            h.release()


class TextLogHandler(logging.FileHandler):
    """``log.txt``'s handler. A write that fails (a full disk) is said once, in one line
    on stderr, and the text log stops there; the run and its other outputs go on. (The
    logging module would print a traceback for every record, and again at close.)"""

    failed = False

    def handleError(self, record: logging.LogRecord) -> None:  # logging's name for it
        error = sys.exc_info()[1]
        if not self.failed:
            self.failed = True
            print(f"treadle: writing {self.baseFilename} failed: {error}; the text log stops here", file=sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:  # its last flush, on a full disk
            if not self.failed:
                self.failed = True
                print(f"treadle: writing {self.baseFilename} failed: {e}; the text log stops here", file=sys.stderr)


# Handler classes info_line() writes for: their emit() is format, write, flush.
_DIRECT = (logging.StreamHandler, TextLogHandler)


def add_file_handler(path: Path) -> logging.Handler:
    """Mirror the treadle logger into a text file; remove the handler when done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = TextLogHandler(path, encoding="utf-8")
    handler.setFormatter(_FILE_FORMATTER)
    handler.addFilter(_not_console_only)
    get_logger().addHandler(handler)
    return handler


def remove_handler(handler: logging.Handler) -> None:
    get_logger().removeHandler(handler)
    handler.close()


def text_log_path() -> Path | None:
    """The text log the treadle logger writes to now (``work_dir/log.txt`` during a run
    with a work_dir), or None."""
    for h in get_logger().handlers:
        if isinstance(h, logging.FileHandler):
            return Path(h.baseFilename)
    return None


def log_details(sections: Mapping[str, str], verbose: bool = False) -> None:
    """Log long texts (e.g. ``{"environment": table, "hook order": table}``) to the text
    log, with one console line that says where they are; ``verbose``: on the console too.
    Without a text log and without ``verbose`` they go to no console at all."""
    logger = get_logger()
    for text in sections.values():
        logger.info(text, extra=None if verbose else FILE_ONLY)
    path = text_log_path()
    if not verbose and path is not None and sections:
        logger.info(f"{' and '.join(sections)}: in {shown_path(path)} (verbose prints them here)", extra=CONSOLE_ONLY)


def shown_path(path: Path) -> Path:
    """``path`` as a console line shows it: relative to the working directory when it lies
    inside it (the file handler keeps it absolute), else as it is."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def log_failure(error: BaseException, where: str) -> None:
    """The full traceback of ``error`` (raised ``where``, e.g. "in epoch 1, iteration 3")
    to the text log only; the console shows the error the way its caller does (the
    command line: a short form)."""
    get_logger().error(f"failed {where}: {type(error).__name__}: {error}", exc_info=error, extra=FILE_ONLY)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/Inf; keep them readable
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


_encode_finite = json.JSONEncoder(allow_nan=False).encode


# -- shared by the writers of backends.py and trackers.py -----------------------------------
def _step(record: dict[str, Any]) -> int:
    step = record.get("iter", 0)
    return int(step) if isinstance(step, Real) and not isinstance(step, bool) else 0


def _require(module: str, package: str, writer: str) -> Any:
    """Import an optional dependency or say which pip package provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{writer} needs the '{package}' package, which is not installed: "
                          f"pip install {package}") from e


# -- log files on resume and at a fresh run ----------------------------------------------
def written_after(record: Mapping[str, Any], iteration: int, val_due: bool) -> bool:
    """Whether a log record belongs after the position of a checkpoint taken when
    ``iteration`` iterations were done, with ``val_due`` (its ``data["val_due"]``):
    a validation of that cycle had not run yet.

    Train records count the iterations done when they were logged, so those with
    ``iter <= iteration`` came before the checkpoint (the record at the checkpoint's own
    iteration too: the resumed run goes on from its window). A val record at
    ``iteration`` came after it when a validation was still due there (the resumed run
    runs it again), before it otherwise. Test records and other modes follow the
    train rule. ``iter`` may be a string (a CSV cell); a record without a readable
    ``iter`` is kept.
    """
    try:
        step = int(float(record.get("iter")))  # type: ignore[arg-type]  # None or not a number: caught below
    except (TypeError, ValueError, OverflowError):
        return False
    if step != iteration:
        return step > iteration
    return record.get("mode") == "val" and bool(val_due)


def replace_atomically(path: Path, fill: Callable[[IO[str]], None], newline: str | None = None,
                       later: bool = False) -> None:
    """Write ``path`` anew: ``fill(f)`` writes a temporary file in the same directory,
    which is flushed, fsynced and renamed over ``path`` (``os.replace``), so a crash
    leaves the old file or the new one, never a mix or half a file.

    ``later=True``: the fsync, the rename and the directory's fsync run on the fsync
    threads while the caller goes on (:func:`treadle.fsutil.sync_later`); ``path``
    holds the new text once :func:`treadle.fsutil.settle` returns."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")

    def commit() -> None:
        try:
            fsync_file(tmp)
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
        fsync_dir(path.parent, best_effort=True)  # the file is replaced: a failed dir sync must not stop a run

    try:
        with open(tmp, "w", encoding="utf-8", newline=newline) as f:
            fill(f)
    except BaseException:
        _unlink(tmp)
        raise
    if later:
        sync_later(commit)
    else:
        commit()


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _first_free(named: Callable[[str], Path], stamp: str) -> Path:
    """``named(stamp)``, or ``named(stamp + "-2")``, ...: the first path not taken."""
    candidate, n = named(stamp), 2
    while candidate.exists():
        candidate, n = named(f"{stamp}-{n}"), n + 1
    return candidate


def aside_path(path: Path, stamp: str) -> Path:
    """``log.<stamp>.jsonl`` beside ``log.jsonl`` (``log.<stamp>-2.jsonl``, ... if taken)."""
    return _first_free(lambda s: path.with_name(f"{path.stem}.{s}{path.suffix}"), stamp)


def move_whole_aside(path: Path, stamp: str) -> Path | None:
    """Rename a non-empty log file to its :func:`aside_path` (one durable rename); None
    when there is nothing to move."""
    if not (path.exists() and path.stat().st_size > 0):
        return None
    dest = aside_path(path, stamp)
    os.replace(path, dest)
    fsync_dir(path.parent, best_effort=True)  # as in replace_atomically
    return dest


def move_into_aside_dir(files: list[Path], stamp: str) -> Path | None:
    """Move ``files`` (of one directory) into its new subdirectory ``<stamp>`` (``<stamp>-2``,
    ... if taken), where TensorBoard shows them as a run of their own. Returns the
    subdirectory, or None when none of the files is there any more."""
    present = [f for f in files if f.is_file()]
    if not present:
        return None
    parent = present[0].parent
    dest = _first_free(lambda s: parent / s, stamp)
    dest.mkdir()
    for f in present:
        os.replace(f, dest / f.name)
    fsync_dir(dest, best_effort=True)
    fsync_dir(parent, best_effort=True)
    return dest


class BatchedWriter:
    """Base of the file writers that keep records and write them in batches.

    :meth:`write` keeps a copy of the record (the caller may reuse its dict) and calls
    :meth:`flush` when the last flush is ``flush_secs`` or more ago; :meth:`flush` hands
    the kept records to ``_write_batch``; :meth:`close` flushes, then closes ``_file``.
    Why batches: a system call and an encoder run at each log interval, in code the
    training steps have pushed out of the caches, cost the training thread far more than
    the same work done for several records in one go.
    """

    path: Path
    _file: Any

    def _start_batching(self, flush_secs: float, first_at_once: bool) -> None:
        self.flush_secs = flush_secs
        self._pending: list[Any] = []
        self._flushed_at = -math.inf if first_at_once else time.monotonic()

    def _keep(self, record: dict[str, Any]) -> Any:
        """What is kept of a record until the next flush."""
        return dict(record)

    def _write_batch(self, kept: list[Any]) -> None:
        raise NotImplementedError

    def write(self, record: dict[str, Any]) -> None:
        if self._file.closed:
            raise ValueError(f"{self.path}: write() after close()")
        self._pending.append(self._keep(record))
        if time.monotonic() - self._flushed_at >= self.flush_secs:
            self.flush()

    def flush(self) -> None:
        """Write the records kept so far."""
        self._flushed_at = time.monotonic()
        kept, self._pending = self._pending, []
        if kept:
            self._write_batch(kept)

    def sync(self) -> None:
        """Write every kept record and make the file durable (fsync): what a checkpoint
        about to commit needs, so that a resume from it finds every record logged before
        it (LoggerHook calls it in ``before_save_checkpoint``)."""
        if self._file.closed:
            return
        try:
            self.flush()
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:  # a full disk: the error names the file
            if e.errno is None or e.filename is not None:
                raise
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def close(self) -> None:
        """Write every kept record, then close the file (idempotent)."""
        if not self._file.closed:
            try:
                self.flush()
            finally:
                self._file.close()


class JsonlWriter(BatchedWriter):
    """Append one JSON object per line (``log.jsonl``), strict JSON (NaN and infinities
    are written as strings).

    An existing file is appended to. :meth:`drop_after` (a resumed run) and
    :meth:`move_aside` (a fresh run) rewrite it first; ``LoggerHook`` calls them.

    A record is written at once when the previous write is ``flush_secs`` or more ago
    -- always, at the pace of real training, where log intervals are seconds apart.
    Records that come faster are kept and written together with the next one due, at
    :meth:`flush` or at :meth:`close` (see :class:`BatchedWriter` for why). So a
    process killed outright loses at most the records of its last ``flush_secs``; an
    exception or a preemption closes the writer (the Trainer runs ``after_run`` in any
    case), which writes them all. ``flush_secs=0`` writes each record as it comes.
    """

    def __init__(self, path: str | Path, flush_secs: float = 1.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._start_batching(flush_secs, first_at_once=True)

    def _write_batch(self, kept: list[dict[str, Any]]) -> None:
        lines: list[str] = []
        error: TypeError | None = None
        for record in kept:
            try:
                lines.append(_line(record))
            except TypeError as e:  # the others are still written
                error = error or TypeError(f"{self.path}: a record is not JSON-serializable ({e}): {record!r}")
        if lines:
            self._file.write("".join(lines))  # one system call
            self._file.flush()
        if error is not None:
            raise error

    def _read_lines(self) -> tuple[list[str], bool]:
        """Write what is kept, close the file and return its complete lines, and whether
        they are the file as it is (a last line cut short by a killed process is
        completed, or left out when it is no JSON)."""
        self.flush()
        self._file.close()
        if not self.path.exists():
            return [], True
        with open(self.path, encoding="utf-8") as f:
            lines = f.readlines()
        if lines and not lines[-1].endswith("\n"):
            try:
                json.loads(lines[-1])
                lines[-1] += "\n"
            except ValueError:
                lines.pop()
            return lines, False
        return lines, True

    def _reopen(self) -> None:
        self._file.close()  # already closed unless reading it failed
        self._file = open(self.path, "a", encoding="utf-8")

    def drop_after(self, iteration: int, val_due: bool = False, keep_last: int = 0) -> int:
        """Resuming from a checkpoint taken at ``iteration`` (``val_due``: a validation
        was still due there): rewrite the file atomically without the records written
        after that position (see :func:`written_after`), which the resumed run writes
        again. The last ``keep_last`` records (this run's own, e.g. of a ``validate()``
        before ``fit()``) stay. Returns how many were dropped."""
        try:
            lines, intact = self._read_lines()
            older = max(len(lines) - keep_last, 0)
            kept = [line for line in lines[:older] if not _line_after(line, iteration, val_due)] + lines[older:]
            if len(kept) != len(lines) or not intact:
                replace_atomically(self.path, lambda f: f.write("".join(kept)))
            return len(lines) - len(kept)
        finally:
            self._reopen()

    def move_aside(self, stamp: str, keep_last: int = 0) -> Path | None:
        """A fresh run starts: move the records of earlier runs to ``log.<stamp>.jsonl``
        (see :func:`aside_path`) and leave this run's last ``keep_last`` records (e.g. of
        a ``validate()`` before ``fit()``) in ``log.jsonl``. Returns the new file, or None
        when there was nothing earlier."""
        try:
            lines, _ = self._read_lines()
            if keep_last <= 0:  # the whole file, as it is: one rename
                return move_whole_aside(self.path, stamp)
            older = len(lines) - keep_last
            if older <= 0:
                return None
            dest = aside_path(self.path, stamp)
            replace_atomically(dest, lambda f: f.write("".join(lines[:older])))
            replace_atomically(self.path, lambda f: f.write("".join(lines[older:])))
            return dest
        finally:
            self._reopen()


def _line_after(line: str, iteration: int, val_due: bool) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False  # not a record of ours: left as it is
    return isinstance(record, dict) and written_after(record, iteration, val_due)


def _line(record: dict[str, Any]) -> str:
    try:  # the common case, all in C: finite numbers and strings
        return _encode_finite(record) + "\n"
    except ValueError:  # a NaN or an infinity somewhere: written as a string
        return json.dumps(_jsonable(record)) + "\n"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``log.jsonl`` file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
