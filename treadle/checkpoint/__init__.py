"""Checkpoints: the one checkpointer, its files and manifests, sharded and asynchronous saves, weights."""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.checkpoint.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
