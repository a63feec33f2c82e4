"""Logging: the metric store and the writers."""

from typing import Any

from treadle.lazy import import_submodule
from treadle.logging.store import MetricStore
from treadle.logging.writers import JsonlWriter, get_logger, read_jsonl

__all__ = ["JsonlWriter", "MetricStore", "get_logger", "read_jsonl"]


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.logging.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
