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

Ctrl-C (SIGINT, unless listed in ``signals``) is a clean stop too: the first one stops
at the next iteration boundary and saves like a preemption, then exits with 130
(128 + SIGINT) and never requeues; a second one raises ``KeyboardInterrupt`` at once
(a save it cuts short leaves scratch files only, never a damaged checkpoint).
``interrupt=False`` leaves SIGINT to Python. Several processes agree on it as on
SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from treadle.distributed import comm
from treadle.logging.writers import get_logger
from treadle.hooks.state import TrainState

PREEMPTED_EXIT_CODE = 143
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
# Signals no handler can catch: the process stops (or dies) at once.
UNCATCHABLE = frozenset(getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n))


@dataclass
class PreemptionConfig:
    """``preemption=dict(signals=("SIGTERM", "SIGUSR1"), exit_code=143, requeue=True)``."""

    signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1")
    exit_code: int = PREEMPTED_EXIT_CODE
    requeue: bool = True
    interrupt: bool = True  # the first Ctrl-C stops at the iteration boundary, saves, exits 130
    received: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, cfg: Any) -> "PreemptionConfig | None":
        if cfg is False or cfg is None:
            return None
        if cfg is True:
            return cls()
        if not isinstance(cfg, dict):
            raise TypeError(f"preemption must be True, False or dict(signals=..., exit_code=..., requeue=...), got {cfg!r}")
        unknown = set(cfg) - {"signals", "exit_code", "requeue", "interrupt"}
        if unknown:
            raise ValueError(f"preemption has unknown keys {sorted(unknown)}; expected signals, exit_code, requeue, "
                             "interrupt")
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
        interrupt = cfg.get("interrupt", cls.interrupt)
        if not isinstance(interrupt, bool):
            raise TypeError(f"preemption interrupt={interrupt!r}; expected True (Ctrl-C saves and exits 130) or False "
                            "(Ctrl-C raises KeyboardInterrupt at once)")
        return cls(signals=tuple(signals), exit_code=exit_code, requeue=requeue, interrupt=interrupt)


class PreemptionHandlers:
    """Context manager installing the handlers (main thread only) and restoring them."""

    def __init__(self, cfg: PreemptionConfig, state: TrainState, deferred: bool = False, verbose: bool = True) -> None:
        self.cfg = cfg
        self.state = state
        # deferred (several processes): only record the request; the loop's agreement
        # step turns it into a stop on every rank at the same iteration boundary.
        self.deferred = deferred
        self.verbose = verbose  # say so on the console when Ctrl-C is pressed (rank 0)
        self._previous: dict[signal.Signals, Any] = {}
        self._pid = os.getpid()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self.cfg.received.append(name)
        self._stop(f"preempted by {name}")

    def _stop(self, reason: str) -> None:
        if self.deferred:
            self.state.preempt_requested = True
            self.state.stop_reason = reason
            return
        self.state.preempted = True
        self.state.request_stop(reason)

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        """The first Ctrl-C: stop at the iteration boundary and save, as a preemption
        does, then exit 130. A second one aborts at once (KeyboardInterrupt): a save it
        cuts short leaves only scratch files, never a damaged checkpoint."""
        if os.getpid() != self._pid:  # a loader worker forked with this handler: the Ctrl-C is its parent's
            return
        self.cfg.received.append("SIGINT")
        signal.signal(signal.SIGINT, self._abort)
        self.state.interrupted = True
        self._stop("interrupted (Ctrl-C)")
        if self.verbose:
            print("treadle: Ctrl-C: stopping after this iteration and saving; press Ctrl-C again to abort at once",
                  file=sys.stderr, flush=True)

    @staticmethod
    def _abort(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt("a second Ctrl-C: aborted without saving")

    def __enter__(self) -> "PreemptionHandlers":
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            for name in self.cfg.signals:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)
            # Ctrl-C stops cleanly, unless the application handles SIGINT itself (or ignores
            # it, as a shell does for a background job) or lists it as a preemption signal.
            if self.cfg.interrupt and signal.SIGINT not in self._previous and \
                    signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)
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


def agree_on_stop(state: Any) -> None:
    """Every rank learns whether any rank must stop, was preempted or interrupted (one
    CPU all-reduce per iteration; the Trainer calls it in multi-process runs only)."""
    s = state
    stop, preempted, interrupted = comm.any_rank(s.should_stop or s.preempt_requested, s.preempt_requested,
                                                 s.interrupted)
    if preempted and not s.preempted:
        s.preempted = True
        s.stop_reason = s.stop_reason or "preempted (signal received by another rank)"
    if interrupted and not s.interrupted:
        s.interrupted = True
        s.stop_reason = "interrupted (Ctrl-C received by another rank)"
    if stop:
        s.should_stop = True
