"""Data: the position-aware feed the loops iterate through."""

from treadle.data.feed import DataFeed

__all__ = ["DataFeed"]
