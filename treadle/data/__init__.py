"""Data: the position-aware feed the loops iterate through, and batches grouped by aspect ratio."""

from typing import Any

from treadle.lazy import import_submodule
from treadle.data.feed import DataFeed
from treadle.data.grouped import AspectRatioBatchSampler

__all__ = ["AspectRatioBatchSampler", "DataFeed"]


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.data.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
