"""Building a strategy from what the Trainer or your own loop is given: a name,
``dict(type=..., **options)`` or a Strategy object."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from treadle.distributed import comm
from treadle.strategies.base import SingleDevice, Strategy

STRATEGY_NAMES = ("auto", "single", "ddp", "fsdp", "deepspeed")


def build_strategy(strategy: str | dict[str, Any] | Strategy = "auto", *, work_dir: str | Path | None = None,
                   seed: int | None = None, deterministic: bool = False) -> Strategy:
    """A ready strategy for your own loop (see treadle/strategies/api.py): resolved as
    :func:`resolve_strategy` does, then its process group started (several processes),
    its run stamped and every library seeded (``seed=None``: rank 0 draws one)."""
    built = resolve_strategy(strategy)
    built.setup_env(work_dir=work_dir, seed=seed, deterministic=deterministic)
    return built


def resolve_strategy(strategy: str | dict[str, Any] | Strategy) -> Strategy:
    """Resolve the Trainer's ``strategy``: a name, ``dict(type="ddp", ...)`` or an object.

    "auto" is "ddp" when the launcher started several processes (see
    :func:`treadle.distributed.detect_launcher`), else "single".
    """
    if isinstance(strategy, Strategy):
        return strategy
    options: dict[str, Any] = {}
    if isinstance(strategy, dict):
        options = dict(strategy)
        if "type" not in options:
            raise ValueError(f"strategy={strategy!r} has no 'type'; expected dict(type=<name>, **options) with a name "
                             f"among {', '.join(map(repr, STRATEGY_NAMES))}, e.g. "
                             "dict(type='ddp', find_unused_parameters=True)")
        strategy = options.pop("type")
    if not isinstance(strategy, str) or strategy not in STRATEGY_NAMES:
        raise ValueError(f"strategy={strategy!r} is not supported; expected one of {', '.join(map(repr, STRATEGY_NAMES))}, "
                         "dict(type=<name>, **options) or a Strategy object")
    if strategy == "auto":
        from treadle.distributed.env import detect_launcher

        strategy = "ddp" if detect_launcher().distributed or comm.get_world_size() > 1 else "single"
    if strategy == "single":
        cls: type[Strategy] = SingleDevice
    elif strategy == "ddp":
        from treadle.strategies.ddp import DDPStrategy as cls
    elif strategy == "fsdp":  # imported when asked for: torch.distributed.checkpoint is slow to import
        from treadle.strategies.fsdp import FSDPStrategy as cls
    else:  # deepspeed itself is imported by its setup() only
        from treadle.strategies.deepspeed import DeepSpeedStrategy as cls
    try:
        return cls(**options)
    except TypeError as e:
        if not _accepts(cls, options):
            raise ValueError(f"strategy {strategy!r}: bad options {sorted(options)} ({e})") from None
        raise TypeError(f"strategy {strategy!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"strategy {strategy!r}: {e}") from None


def _accepts(cls: type, options: dict[str, Any]) -> bool:
    """Whether ``cls(**options)`` matches the constructor's signature (a TypeError then
    came from a check of a value, not from an unknown or missing option)."""
    try:
        inspect.signature(cls).bind(**options)
    except TypeError:
        return False
    return True
