"""Strategy: where the model lives and how batches reach it.

A strategy owns device placement, model wrapping and (later) distributed reductions
and state dicts. ``SingleDevice`` is the one-process case; DDP and FSDP build on the
same interface.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def pick_device() -> torch.device:
    """CUDA if available, then MPS, then CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def move_to(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor inside nested tuples, lists and dicts to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move_to(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [move_to(v, device, non_blocking) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*moved)
        return type(obj)(moved)
    return obj


class Strategy:
    """Base class. Subclasses set ``device``, ``rank`` and ``world_size``."""

    name = "base"
    device: torch.device = torch.device("cpu")
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs and checkpoints."""
        return self.rank == 0

    def setup_model(self, model: nn.Module) -> nn.Module:
        """Place (and wrap) the model; returns what the loop should call."""
        raise NotImplementedError

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module under any wrapper."""
        return model

    def batch_mover(self) -> Callable[[Any], Any] | None:
        """A function moving a batch to the device, or None when none is needed (CPU)."""
        if self.device.type == "cpu":
            return None
        device = self.device
        non_blocking = device.type == "cuda"  # overlaps with compute when the loader pins memory
        return lambda batch: move_to(batch, device, non_blocking)


class SingleDevice(Strategy):
    """One process, one device (picked automatically when not given)."""

    name = "single"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device) if device is not None else pick_device()

    def setup_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)


STRATEGY_NAMES = ("auto", "single", "ddp", "fsdp")


def build_strategy(strategy: str | Strategy) -> Strategy:
    """Resolve the ``strategy`` argument of the Trainer."""
    if isinstance(strategy, Strategy):
        return strategy
    if not isinstance(strategy, str) or strategy not in STRATEGY_NAMES:
        raise ValueError(f"strategy={strategy!r} is not supported; expected one of {', '.join(map(repr, STRATEGY_NAMES))} or a Strategy object")
    if strategy in ("auto", "single"):
        return SingleDevice()
    raise NotImplementedError(f"strategy={strategy!r} is not available yet in this version of treadle; "
                              "use 'single' or 'auto' (multi-process strategies are being built)")
