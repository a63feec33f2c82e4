"""Logging: the metric store and the writers."""

from treadle.logging.store import MetricStore
from treadle.logging.writers import JsonlWriter, get_logger, read_jsonl

__all__ = ["JsonlWriter", "MetricStore", "get_logger", "read_jsonl"]
