"""treadle: a small, exact and fast training engine for PyTorch.

    import treadle
    trainer = treadle.Trainer(model, train_dataloader=loader, optimizer=dict(type="AdamW", lr=1e-3), max_epochs=3)
    trainer.fit()
"""

from treadle.hooks.base import Hook, Priority
from treadle import hooks
from treadle.metrics import Accuracy
from treadle.state import TrainState
from treadle.trainer import Trainer

__version__ = "0.1.0"
__all__ = ["Accuracy", "Hook", "Priority", "TrainState", "Trainer", "__version__"]
