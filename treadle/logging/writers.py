"""Where logged records go: the ``treadle`` logger (console, text file) and JSONL."""

from __future__ import annotations

import json
import logging
import math
import sys
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


class JsonlWriter:
    """Append one JSON object per line, flushed so a crash loses nothing written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        try:  # the common case, all in C: finite numbers and strings
            line = _encode_finite(record)
        except ValueError:  # a NaN or an infinity somewhere: written as a string
            line = json.dumps(_jsonable(record))
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``log.jsonl`` file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
