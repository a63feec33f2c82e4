"""treadle: a small, exact and fast training engine for PyTorch.

    import treadle
    trainer = treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="AdamW", lr=1e-3), max_epochs=3)
    trainer.fit()

Your own loop, with the same strategies and checkpoints (treadle/strategies/api.py)::

    strategy = treadle.build_strategy("ddp", work_dir="runs/x", seed=0)
    model, optim_wrapper = strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))
"""

from treadle.compat import check_torch

check_torch()  # below the floor: one line naming the installed and the required release

from treadle.hooks.base import Hook, Priority  # noqa: E402
from treadle import hooks  # noqa: E402, F401 (treadle.hooks: the package as an attribute)
from treadle.metrics import Accuracy  # noqa: E402
from treadle.hooks.state import TrainState  # noqa: E402
from treadle.strategies.build import build_strategy  # noqa: E402
from treadle.engine.trainer import Trainer  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Accuracy", "Hook", "Priority", "TrainState", "Trainer", "__version__", "build_strategy"]
