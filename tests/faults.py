"""Faults to inject into a run once iteration ``at`` is done, after the logger and the
checkpoint hook have had it (priority LOWEST): an exception, a stop request, a signal, a
SIGKILL. From a config too (``hooks: [{type: faults.SigkillAt, ...}]``; tests/ is on the
workers' PYTHONPATH)."""

from __future__ import annotations

import os
import signal

import treadle
from treadle.distributed.env import restart_count


class Crash(Exception):
    """The failure a test injects: nothing in treadle catches it."""


class _AfterIter(treadle.Hook):
    priority = "LOWEST"

    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if trainer.state.iter + 1 == self.at:
            self.fire(trainer)

    def fire(self, trainer) -> None:
        raise NotImplementedError


class CrashAt(_AfterIter):
    """Raises ``error`` (an exception or its class; :class:`Crash` by default)."""

    def __init__(self, at: int, error: BaseException | type[BaseException] = Crash) -> None:
        super().__init__(at)
        self.error = error

    def fire(self, trainer) -> None:
        raise self.error


class StopAt(_AfterIter):
    """Asks the loop to stop, as a hook of a user's may."""

    def fire(self, trainer) -> None:
        trainer.state.request_stop("test")


class SignalAt(_AfterIter):
    """Sends this process ``sig``, ``times`` times (SIGINT: Ctrl-C pressed)."""

    def __init__(self, at: int, sig: int, times: int = 1) -> None:
        super().__init__(at)
        self.sig, self.times = sig, times

    def fire(self, trainer) -> None:
        for _ in range(self.times):
            os.kill(os.getpid(), self.sig)


class SigkillAt(_AfterIter):
    """Rank ``rank`` (None: every rank) kills itself with SIGKILL, in attempt ``attempt`` of
    an elastic job only (the SIGKILL of tests/strategies/ddp_script.py's Fault hook)."""

    def __init__(self, rank: int | None, at_iter: int, attempt: int = 0) -> None:
        super().__init__(at_iter)
        self.rank, self.armed = rank, restart_count() == attempt

    def fire(self, trainer) -> None:
        if self.armed and self.rank in (None, trainer.strategy.rank):
            os.kill(os.getpid(), signal.SIGKILL)


class SleepAt(_AfterIter):
    """Rank ``rank`` sleeps forever after iteration ``at_iter``: a stuck process, for the stall watch."""

    def __init__(self, rank: int, at_iter: int) -> None:
        super().__init__(at_iter)
        self.rank = rank

    def fire(self, trainer) -> None:
        if trainer.strategy.rank == self.rank:
            import time

            time.sleep(10**9)
