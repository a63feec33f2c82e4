"""Data: the position-aware feed the loops iterate through, and batches grouped by aspect ratio."""

from treadle.data.feed import DataFeed
from treadle.data.grouped import AspectRatioBatchSampler

__all__ = ["AspectRatioBatchSampler", "DataFeed"]
