"""treadle: a small, exact and fast training engine for PyTorch.

    import treadle
    trainer = treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="AdamW", lr=1e-3), max_epochs=3)
    trainer.fit()

Your own loop, with the same strategies and checkpoints (treadle/strategies/api.py)::

    strategy = treadle.build_strategy("ddp", work_dir="runs/x", seed=0)
    model, optim_wrapper = strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))

The public names are imported on first use (``treadle.Trainer`` imports torch and the
engine then), so that ``treadle --help`` answers without loading torch. With torch
already imported, ``import treadle`` checks its release at once; otherwise the first
public name does.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from treadle._version import __version__

# Public name -> the module that defines it.
_PUBLIC = {
    "Accuracy": "treadle.metrics",
    "Hook": "treadle.hooks.base",
    "Priority": "treadle.hooks.base",
    "TrainState": "treadle.hooks.state",
    "Trainer": "treadle.engine.trainer",
    "build_strategy": "treadle.strategies.build",
}
# Subpackages reachable as attributes (``treadle.hooks.ProgressBarHook``) without an import of their own;
# every other module too (treadle/lazy.py), and each package's modules in turn.
_SUBPACKAGES = ("checkpoint", "config", "data", "distributed", "engine", "hooks", "logging", "optim", "strategies")

if TYPE_CHECKING:
    from treadle.engine.trainer import Trainer
    from treadle.hooks.base import Hook, Priority
    from treadle.hooks.state import TrainState
    from treadle.metrics import Accuracy
    from treadle.strategies.build import build_strategy

if "torch" in sys.modules:  # below the floor: one line naming the installed and the required release
    from treadle.compat import check_torch

    check_torch()


def __getattr__(name: str) -> Any:
    """Import a public name or a subpackage on first use (PEP 562)."""
    if name in _PUBLIC:
        from treadle.compat import check_torch

        check_torch()
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"treadle.{name}")
    else:  # any other module (treadle.seeding, treadle.report), as the documentation names it
        from treadle.lazy import import_submodule

        value = import_submodule(__name__, name)
    globals()[name] = value  # later uses are a plain attribute read
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC, *_SUBPACKAGES})


__all__ = ["Accuracy", "Hook", "Priority", "TrainState", "Trainer", "__version__", "build_strategy"]
