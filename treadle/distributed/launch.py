"""Start N local processes the way ``torchrun --standalone --nproc-per-node N`` does,
through torch.distributed.run's own API (TorchElastic's agent).

Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, which :func:`treadle.distributed.detect_launcher` reads. When one process
fails, the agent stops the others at once (no waiting for a collective timeout)
and the failure, with the rank and the error, is reported. Multi-node runs use
``torchrun`` or SLURM directly (see docs/distributed.md).

With ``max_restarts`` > 0 the agent instead starts every process again, up to that many
times (``torchrun --max-restarts``); ``treadle train`` then resumes from the run's latest
verified checkpoint by itself (treadle/cli.py, :func:`treadle.distributed.env.restart_count`).
The rendezvous store is then not shared with the workers
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): shared, it keeps the failed attempt's
addresses and a restart may fail to connect (pytorch/pytorch#135712).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from treadle.distributed.voice import AGENT_ENV
from treadle.logging.writers import get_logger


UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"  # read by the agent's c10d rendezvous
_watching = False


def end_with_launcher(interval_s: float = 0.5) -> None:
    """In a process started by torchrun's agent (``treadle train --nproc N`` included;
    the agent sets ``TORCHELASTIC_RUN_ID``, which ``init_distributed`` checks):
    end this process, and the process group it leads (its DataLoader workers), as soon
    as the launcher that started it is gone. The agent starts each process in a session
    of its own, so a launcher killed with SIGKILL (or an OOM kill) would otherwise leave
    them running, holding the GPUs and the work_dir lock. A daemon thread compares the
    parent's pid with the one at start every ``interval_s`` seconds: no work per step."""
    global _watching
    if _watching or os.name != "posix":
        return
    _watching = True
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:  # re-parented: the launcher is gone
                own_group = os.getpgrp() == os.getpid()
                os.killpg(os.getpgrp(), signal.SIGKILL) if own_group else os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="treadle-launcher-watch", daemon=True).start()


def launch_local(nproc: int, args: Sequence[str], *, max_restarts: int = 0, monitor_interval: float = 0.1) -> int:
    """Run ``python ARGS...`` in ``nproc`` processes on this machine; returns the exit
    status: 0, the failed process's own status (143 after a preemption), 128 + the
    signal's number when this launcher was stopped by one (130 for Ctrl-C), or 1.
    ``max_restarts``: how many times the agent starts every process again after one
    failed (each attempt sees ``TORCHELASTIC_RESTART_COUNT``); the status is the last
    attempt's."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1, got {nproc!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"treadle-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0",  # a free port, like torchrun --standalone
        max_restarts=max_restarts, monitor_interval=monitor_interval, start_method="spawn",
    )
    env = {AGENT_ENV: "1", **({UNSHARED_STORE: "1"} if max_restarts > 0 else {})}
    try:
        with _environ(env), _quiet_agent():
            elastic_launch(config, entrypoint=sys.executable)(*args)
    except SignalException as e:
        # Ctrl-C (or SIGTERM) reached this launcher: the agent has passed it on to every
        # process (each in its own session, so once), which saved and exited, and waited
        # for them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default, before a SIGKILL).
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        return say_failure(e.failures)
    return 0


def say_failure(failures: dict[int, Any]) -> int:
    """The job's failure, said once (treadle/distributed/voice.py: the processes left it
    to this launcher): the line of the process that failed the job (:func:`first_failure`),
    and the status for what happened (2 for a configuration error, 1 for another failure,
    143 for a preemption), whichever process the agent saw end first."""
    rank, failure = first_failure(failures)
    codes = {f.exitcode for f in failures.values()}
    line = failure_line(rank, failure)
    data = _data(failure)
    if data.get("treadle_line"):
        print(line, file=sys.stderr, flush=True)
    else:
        get_logger().error(line)
    if codes == {143} or failure.exitcode == 143:  # preempted: keep the code for requeueing
        return 143
    status = data.get("treadle_status")
    if isinstance(status, int) and status > 0:
        return status
    return failure.exitcode if failure.exitcode > 0 else 1


@contextmanager
def _quiet_agent() -> Iterator[None]:
    """The agent's own lines about the processes it stops after a failure ("Sending
    process ... closing signal SIGTERM", "failed (exitcode: 2) local_rank: 0 ...") are not
    shown: the failure is said once, by :func:`say_failure`."""
    import logging

    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _data(failure: Any) -> dict[str, Any]:
    data = getattr(failure, "error_file_data", None)
    return data if isinstance(data, dict) else {}


def _kind(failure: Any) -> str:
    """What a failed process's error file says it was (treadle/distributed/voice.py
    KINDS), or "" when it wrote none (it died without a Python error)."""
    kind = _data(failure).get("treadle")
    return kind if isinstance(kind, str) else ""


def first_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The process that failed the job, among those the agent saw fail: one ended by
    the stall watch, else one that failed with an error of its own, else one that died
    without a Python error, before one that only stopped because another had failed;
    the earliest of them (then the lowest rank)."""
    rank_of = {"stall": 0, "config": 1, "error": 1, "": 2, "stopped": 3}

    def order(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, failure = item
        kind = _kind(failure)
        # Killed by SIGTERM with no word of its own: the agent's closing signal to a survivor.
        victim = kind == "" and failure.exitcode == -signal.SIGTERM
        return (4 if victim else rank_of.get(kind, 2), failure.timestamp, rank)

    return min(failures.items(), key=order)


def failure_line(rank: int, failure: Any) -> str:
    """The launcher's line for the process that failed the job: its own line (an error,
    the stall watch's verdict), as that process would have printed it; else how it ended
    (an exit status or a signal) and that it printed no Python error."""
    kind, code, data = _kind(failure), failure.exitcode, _data(failure)
    line = data.get("treadle_line")
    if isinstance(line, str) and line:
        if kind == "stall":
            return f"treadle: {line}" if data.get("treadle_job") else \
                f"treadle: process of rank {rank} was ended (exit code {code}): {line}"
        return line
    if kind in ("error", "config", "stopped"):
        return f"process of rank {rank} failed with exit code {code} (its error is shown above)"
    if code == 143:  # SIGTERM handled: a preemption, saved and stopped (treadle/engine/preemption.py)
        return f"process of rank {rank} was preempted (exit code 143)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return (f"process of rank {rank} was killed by {name} and printed no Python error (killed from outside, or "
                "by the out-of-memory killer?)")
    return (f"process of rank {rank} exited with status {code} and printed no Python error (os._exit, or a crash in "
            "native code?)")


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the agent runs (it and the processes it
    starts read them), as it was afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
