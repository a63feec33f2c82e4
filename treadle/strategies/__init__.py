"""Strategies: where the model lives and how its state is saved, for the Trainer and
for your own loop (``treadle.build_strategy``; see treadle/strategies/api.py)."""

from typing import Any

from treadle.lazy import import_submodule
from treadle.strategies.base import SingleDevice, Strategy, move_to, pick_device
from treadle.strategies.build import build_strategy, resolve_strategy

__all__ = ["SingleDevice", "Strategy", "build_strategy", "move_to", "pick_device", "resolve_strategy"]


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.strategies.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
