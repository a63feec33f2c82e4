"""A fault to inject from a config (``hooks: [{type: faults.SigkillAt, ...}]``; tests/ is
on the workers' PYTHONPATH): the SIGKILL of tests/strategies/ddp_script.py's Fault hook."""

from __future__ import annotations

import os
import signal

import treadle
from treadle.distributed.env import restart_count


class SigkillAt(treadle.Hook):
    """Rank ``rank`` (None: every rank) kills itself with SIGKILL once ``at_iter`` iterations
    are done (after the checkpoint hook has saved), in attempt ``attempt`` of an elastic job only."""

    priority = "LOWEST"

    def __init__(self, rank: int | None, at_iter: int, attempt: int = 0) -> None:
        self.rank, self.at_iter, self.armed = rank, at_iter, restart_count() == attempt

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if self.armed and trainer.state.iter + 1 == self.at_iter and self.rank in (None, trainer.strategy.rank):
            os.kill(os.getpid(), signal.SIGKILL)
