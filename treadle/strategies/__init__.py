"""Strategies: where the model lives and how its state is saved, for the Trainer and
for your own loop (``treadle.build_strategy``; see treadle/strategies/api.py)."""

from treadle.strategies.base import SingleDevice, Strategy, move_to, pick_device
from treadle.strategies.build import build_strategy, resolve_strategy

__all__ = ["SingleDevice", "Strategy", "build_strategy", "move_to", "pick_device", "resolve_strategy"]
