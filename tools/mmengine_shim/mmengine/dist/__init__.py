"""Rank helper the optimizer tests import."""

from treadle.distributed import get_rank  # noqa: F401
