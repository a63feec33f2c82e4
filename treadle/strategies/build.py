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
    :func:`treadle.distributed.detect_launcher`), else "single"; ``dict(type="auto", ...)``
    takes ddp's options, which apply when it is "ddp".
    """
    if isinstance(strategy, Strategy):
        return strategy
    name, cls, options = _class_and_options(strategy)
    try:
        return cls(**options)
    except TypeError as e:
        raise TypeError(f"strategy {name!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"strategy {name!r}: {e}") from None


def check_strategy(strategy: str | dict[str, Any] | Strategy) -> None:
    """What :func:`resolve_strategy` checks before it builds: the name, and that the
    options are ones the strategy's class takes (a config file's check: nothing is built,
    the values are checked once, by the one object the Trainer builds)."""
    if not isinstance(strategy, Strategy):
        _class_and_options(strategy)


def _class_and_options(strategy: str | dict[str, Any]) -> tuple[str, type[Strategy], dict[str, Any]]:
    """The strategy's name ("auto" resolved), class and options, the options' names
    checked against the class's signature."""
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
        if strategy == "single":  # ddp's options (an MMEngine config's wrapper) mean nothing on one process
            from treadle.strategies.ddp import DDPStrategy

            ddp_only = set(inspect.signature(DDPStrategy).parameters) - set(inspect.signature(SingleDevice).parameters)
            options = {k: v for k, v in options.items() if k not in ddp_only}
    if strategy == "single":
        cls: type[Strategy] = SingleDevice
    elif strategy == "ddp":
        from treadle.strategies.ddp import DDPStrategy as cls
    elif strategy == "fsdp":  # imported when asked for: torch.distributed.checkpoint is slow to import
        from treadle.strategies.fsdp import FSDPStrategy as cls
    else:  # deepspeed itself is imported by its setup() only
        from treadle.strategies.deepspeed import DeepSpeedStrategy as cls
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as e:
        raise ValueError(_bad_options(strategy, cls, options, e)) from None
    return strategy, cls, options


#: Options of the FSDP strategy's device mesh and tensor parallelism, which no other strategy has.
MESH_OPTIONS = ("dp_replicate", "dp_shard", "tp", "tp_plan")


def _bad_options(name: str, cls: type, options: dict[str, Any], error: TypeError) -> str:
    """The line for options ``cls`` does not take: only those named (the others are its
    own), and that the mesh's and tensor parallelism's need ``type: fsdp``."""
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(k for k in options if k not in params) if not takes_any else []
    if not unknown:
        return f"strategy {name!r}: bad options {sorted(options)} ({error})"
    mesh = [k for k in unknown if k in MESH_OPTIONS]
    line = f"strategy {name!r}: bad options {unknown}"
    if mesh:
        line += (f"; {', '.join(mesh)}: tensor parallelism and the device mesh need type: fsdp (FSDP2 over a "
                 "dp_replicate x dp_shard x tp mesh)")
    return line + f"; expected some of {sorted(p for p in params if p != 'self')}"
