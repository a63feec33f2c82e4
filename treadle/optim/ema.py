"""Exponential moving average of a model's weights (basecls/timm convention).

``ema = momentum * ema + (1 - momentum) * weights`` for every floating-point
parameter and buffer (BatchNorm statistics included); integer buffers are copied.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


def momentum_from_alpha(alpha: float, total_batch_size: int, max_epochs: int, interval: int) -> float:
    """pycls-style momentum: ``max(0, 1 - alpha * total_batch_size / max_epochs * interval)``.

    Ties the averaging horizon to the run instead of the step count: alpha 1e-5 with
    batch 1024, 100 epochs and an update every 32 iterations gives 0.996723175, which
    behaves like momentum 0.9999 updated every iteration.
    """
    if alpha < 0 or total_batch_size < 1 or max_epochs < 1 or interval < 1:
        raise ValueError(f"momentum_from_alpha needs alpha >= 0 and positive batch size, epochs and interval; got "
                         f"alpha={alpha}, total_batch_size={total_batch_size}, max_epochs={max_epochs}, interval={interval}")
    return max(0.0, 1.0 - alpha * (total_batch_size / max_epochs * interval))


class ExponentialMovingAverage:
    """An averaged copy of ``module``.

    Args:
        module: the model to follow (its unwrapped module).
        momentum: weight of the running average, in [0, 1].
    """

    def __init__(self, module: nn.Module, momentum: float = 0.9998) -> None:
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"EMA momentum must be in [0, 1], got {momentum!r}")
        self.momentum = momentum
        self.module = copy.deepcopy(module)
        self.module.eval()
        self.module.requires_grad_(False)
        self.num_updates = 0

    @staticmethod
    def _tensors(module: nn.Module) -> list[torch.Tensor]:
        return [*module.parameters(), *module.buffers()]

    def _pairs(self, module: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        ema, src = self._tensors(self.module), self._tensors(module)
        if len(ema) != len(src):
            raise ValueError("the model's parameters and buffers no longer match the EMA copy")
        floats = [(e, s) for e, s in zip(ema, src) if e.is_floating_point()]
        others = [(e, s) for e, s in zip(ema, src) if not e.is_floating_point()]
        return [e for e, _ in floats], [s.detach() for _, s in floats], others

    @torch.no_grad()
    def copy_from(self, module: nn.Module) -> None:
        """Make the average equal to ``module``'s weights."""
        for e, s in zip(self._tensors(self.module), self._tensors(module)):
            e.copy_(s)

    @torch.no_grad()
    def update(self, module: nn.Module, momentum: float | None = None) -> None:
        """One averaging step towards ``module``'s current weights."""
        m = self.momentum if momentum is None else momentum
        ema, src, others = self._pairs(module)
        if ema:
            torch._foreach_mul_(ema, m)
            torch._foreach_add_(ema, src, alpha=1.0 - m)
        for e, s in others:
            e.copy_(s)
        self.num_updates += 1

    @torch.no_grad()
    def lerp(self, module: nn.Module, weight: float) -> None:
        """MMEngine's averaging step: each floating-point tensor moves ``weight`` of the way
        towards ``module``'s (``avg.lerp_(src, weight)``); integer buffers are left as they
        are (MMEngine's ``update_buffers=True`` averages floats only)."""
        ema, src, _ = self._pairs(module)
        if ema:
            torch._foreach_lerp_(ema, src, weight)
        self.num_updates += 1

    @torch.no_grad()
    def swap(self, module: nn.Module) -> None:
        """Exchange the weights of ``module`` and the average (for evaluation)."""
        for e, s in zip(self._tensors(self.module), self._tensors(module)):
            tmp = s.detach().clone()
            s.copy_(e)
            e.copy_(tmp)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "num_updates": self.num_updates, "momentum": self.momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.num_updates = int(state.get("num_updates", 0))
