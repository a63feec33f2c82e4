"""fp16 loss scaling: how ``precision="16"``'s GradScaler is configured (``loss_scale``).

* ``"dynamic"`` (default): ``torch.amp.GradScaler`` with its defaults; the scale halves
  on a step with inf/NaN gradients and doubles after 2000 clean ones.
* a number (MMEngine's ``AmpOptimWrapper(loss_scale=512.)``): a fixed scale; steps with
  inf/NaN gradients are still skipped, the scale never changes.
* a dict of GradScaler's options (``dict(init_scale=512, growth_interval=100)``): a
  dynamic scale with those settings.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: GradScaler options a ``loss_scale`` dict may set.
SCALER_KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_loss_scale(loss_scale: Any) -> str | float | dict[str, Any]:
    """``loss_scale`` checked: ``"dynamic"``, a positive number (as a float) or a dict
    of :data:`SCALER_KEYS`; anything else raises with what was expected."""
    if loss_scale == "dynamic" and isinstance(loss_scale, str):
        return loss_scale
    if isinstance(loss_scale, dict):
        unknown = sorted(set(loss_scale) - set(SCALER_KEYS))
        if unknown:
            raise ValueError(f"loss_scale has unknown keys {unknown}; expected GradScaler options among "
                             f"{', '.join(SCALER_KEYS)}")
        bounds = {"init_scale": (0.0, "a number > 0"), "growth_factor": (1.0, "a number > 1")}
        for key, (low, what) in bounds.items():
            if key in loss_scale and not (_number(loss_scale[key]) and loss_scale[key] > low):
                raise ValueError(f"loss_scale {key}={loss_scale[key]!r}; expected {what}")
        backoff = loss_scale.get("backoff_factor", 0.5)
        if not (_number(backoff) and 0.0 < backoff < 1.0):
            raise ValueError(f"loss_scale backoff_factor={backoff!r}; expected a number in (0, 1)")
        interval = loss_scale.get("growth_interval", 1)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"loss_scale growth_interval={interval!r}; expected an int >= 1")
        return dict(loss_scale)
    if _number(loss_scale) and loss_scale > 0:
        return float(loss_scale)
    raise ValueError(f"loss_scale={loss_scale!r}; expected 'dynamic', a fixed scale (a number > 0 such as 512.0) "
                     f"or a dict of GradScaler options among {', '.join(SCALER_KEYS)}")


def build_scaler(loss_scale: str | float | dict[str, Any], device_type: str) -> torch.amp.GradScaler:
    """The GradScaler for a checked ``loss_scale`` (a fixed one starts at that scale;
    :func:`fixed_scale` says what to reset it to after each step)."""
    if isinstance(loss_scale, dict):
        return torch.amp.GradScaler(device_type, **loss_scale)
    if isinstance(loss_scale, float):
        return torch.amp.GradScaler(device_type, init_scale=loss_scale)
    return torch.amp.GradScaler(device_type)


def fixed_scale(loss_scale: str | float | dict[str, Any]) -> float | None:
    """The scale to keep after every step, or None for a dynamic one."""
    return loss_scale if isinstance(loss_scale, float) else None


__all__ = ["SCALER_KEYS", "build_scaler", "check_loss_scale", "fixed_scale"]
