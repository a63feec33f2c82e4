"""Preemption: a signal asks for a checkpoint at the next iteration boundary.

While ``fit()`` runs, SIGTERM and SIGUSR1 (configurable) set ``state.preempted``
and ``state.should_stop``; the loop stops after the running iteration, the trainer
saves a checkpoint there, closes its writers, requeues the job under SLURM when
asked (rank 0 runs ``scontrol requeue $SLURM_JOB_ID``) and exits with
``exit_code`` (143 = 128 + SIGTERM by default). The previous handlers are restored
when ``fit()`` returns.

Several processes: a signal may reach some ranks only, or reach them at different
iterations. So it only sets ``state.preempt_requested``; after every iteration the
ranks all-reduce their stop and preemption flags (one small CPU all-reduce), and all
of them stop at the same boundary. Rank 0 writes the checkpoint; the others wait
for it at a barrier before exiting, so the launcher never kills a half-written save.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from treadle.logging.writers import get_logger
from treadle.state import TrainState

PREEMPTED_EXIT_CODE = 143
# Signals no handler can catch: the process stops (or dies) at once.
UNCATCHABLE = frozenset(getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n))


@dataclass
class PreemptionConfig:
    """``preemption=dict(signals=("SIGTERM", "SIGUSR1"), exit_code=143, requeue=True)``."""

    signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
    exit_code: int = PREEMPTED_EXIT_CODE
    requeue: bool = True
    received: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, cfg: Any) -> "PreemptionConfig | None":
        if cfg is False or cfg is None:
            return None
        if cfg is True:
            return cls()
        if not isinstance(cfg, dict):
            raise TypeError(f"preemption must be True, False or dict(signals=..., exit_code=..., requeue=...), got {cfg!r}")
        unknown = set(cfg) - {"signals", "exit_code", "requeue"}
        if unknown:
            raise ValueError(f"preemption has unknown keys {sorted(unknown)}; expected signals, exit_code, requeue")
        signals = cfg.get("signals", cls.signals)
        if not isinstance(signals, (list, tuple)):
            raise TypeError(f"preemption signals={signals!r}; expected a list of signal names such as "
                            "['SIGTERM', 'SIGUSR1']")
        for name in signals:
            sig = getattr(signal, name, None) if isinstance(name, str) else None
            if not isinstance(sig, signal.Signals):
                raise ValueError(f"preemption signal {name!r} is not a signal name such as 'SIGTERM'")
            if sig in UNCATCHABLE:
                raise ValueError(f"preemption signal {name!r} cannot be caught (the system stops the process at once); "
                                 "expected signals such as 'SIGTERM', 'SIGUSR1', 'SIGINT'")
        exit_code = cfg.get("exit_code", cls.exit_code)
        if isinstance(exit_code, bool) or not isinstance(exit_code, int):
            raise TypeError(f"preemption exit_code={exit_code!r} is not an int; expected an int in 0..255 such as 143 "
                            "(128 + SIGTERM)")
        if not 0 <= exit_code <= 255:
            raise ValueError(f"preemption exit_code={exit_code!r} is out of range; expected an int in 0..255 such as "
                             "143 (128 + SIGTERM)")
        requeue = cfg.get("requeue", cls.requeue)
        if not isinstance(requeue, bool):
            raise TypeError(f"preemption requeue={requeue!r}; expected True (requeue the SLURM job) or False")
        return cls(signals=tuple(signals), exit_code=exit_code, requeue=requeue)


class PreemptionHandlers:
    """Context manager installing the handlers (main thread only) and restoring them."""

    def __init__(self, cfg: PreemptionConfig, state: TrainState, deferred: bool = False) -> None:
        self.cfg = cfg
        self.state = state
        # deferred (several processes): only record the request; the loop's agreement
        # step turns it into a stop on every rank at the same iteration boundary.
        self.deferred = deferred
        self._previous: dict[signal.Signals, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.cfg.received.append(name)
        if self.deferred:
            self.state.preempt_requested = True
            self.state.stop_reason = f"preempted by {name}"
            return
        self.state.preempted = True
        self.state.request_stop(f"preempted by {name}")

    def __enter__(self) -> "PreemptionHandlers":
        if threading.current_thread() is threading.main_thread():
            for name in self.cfg.signals:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def requeue_slurm_job() -> bool:
    """``scontrol requeue $SLURM_JOB_ID``; True when it was asked and succeeded."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=60, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        get_logger().warning(f"could not requeue SLURM job {job}: {e}")
        return False
    get_logger().info(f"requeued SLURM job {job}")
    return True
