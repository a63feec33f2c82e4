"""treadle: a small, exact and fast training engine for PyTorch.

    import treadle
    trainer = treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="AdamW", lr=1e-3), max_epochs=3)
    trainer.fit()

Your own loop, with the same strategies and checkpoints (treadle/strategies/api.py)::

    strategy = treadle.build_strategy("ddp", work_dir="runs/x", seed=0)
    model, optim_wrapper = strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))
"""

from treadle.hooks.base import Hook, Priority
from treadle import hooks
from treadle.metrics import Accuracy
from treadle.state import TrainState
from treadle.strategies.build import build_strategy
from treadle.trainer import Trainer

__version__ = "0.1.0"
__all__ = ["Accuracy", "Hook", "Priority", "TrainState", "Trainer", "__version__", "build_strategy"]
