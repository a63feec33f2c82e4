"""Where logged records go: the ``treadle`` logger (console, text file) and JSONL."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

LOGGER_NAME = "treadle"
_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def get_logger() -> logging.Logger:
    """The ``treadle`` logger, with a console handler unless logging is configured."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    # Respect an application's (or pytest's) own configuration of the root logger.
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler.set_name("treadle-console")
        logger.addHandler(handler)
    return logger


def add_file_handler(path: Path) -> logging.Handler:
    """Mirror the treadle logger into a text file; remove the handler when done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    get_logger().addHandler(handler)
    return handler


def remove_handler(handler: logging.Handler) -> None:
    get_logger().removeHandler(handler)
    handler.close()


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/Inf; keep them readable
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


_encode_finite = json.JSONEncoder(allow_nan=False).encode


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


def _line(record: dict[str, Any]) -> str:
    try:  # the common case, all in C: finite numbers and strings
        return _encode_finite(record) + "\n"
    except ValueError:  # a NaN or an infinity somewhere: written as a string
        return json.dumps(_jsonable(record)) + "\n"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``log.jsonl`` file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
