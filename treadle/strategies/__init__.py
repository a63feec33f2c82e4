"""Strategies: device placement and wrapping for one or many processes."""

from treadle.strategies.base import SingleDevice, Strategy, build_strategy, move_to, pick_device

__all__ = ["SingleDevice", "Strategy", "build_strategy", "move_to", "pick_device"]
