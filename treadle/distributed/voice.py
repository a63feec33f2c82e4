"""One voice for a failing job: its failure is said once, whichever process says it,
and its exit status says what happened, not which process the launcher saw first.

The policy, for the command line, the Trainer and a hand-written loop alike:

* A process that fails with an error of its own (:func:`fail`) writes it whole to its
  TorchElastic error file, with its kind and status, and tells the job (the store every
  process reaches, :func:`use_store`). Under treadle's own launcher (``treadle train
  --nproc``, which sets :data:`AGENT_ENV` for its workers) no worker prints it: the
  launcher prints the line of the process that failed the job, once, and exits with its
  status (:func:`treadle.distributed.launch.launch_local`). Under any other launcher
  (torchrun, SLURM, MPI) the first process to claim the job's voice prints it; the same
  failure on other ranks (a configuration error every rank meets) is not printed again.
* A process that only stops because another one failed (its collective found the peer
  gone, the stall watch ended the job, the agent's closing SIGTERM) says nothing
  (:func:`follow_on`), unless no process of the job said anything (a peer killed from
  outside, under a launcher that names nobody).
* A script's configuration error (the Trainer's arguments, :func:`mark_config_error`)
  is said as the command line says its errors: one line, no traceback (unless
  :data:`FULL_TRACEBACK_ENV` is set), by the exception hook (:func:`install_excepthook`).
* The status: 2 for a configuration error (``kind="config"``), 1 for any other failure
  (an uncaught exception's status is Python's: 1).

Before the process group is up there is no store: a configuration error, which every
rank meets alike, is printed by rank 0 only; anything else by the process that meets it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

#: Set to "1" by treadle's launcher for the processes it starts: it prints the job's failure.
AGENT_ENV = "TREADLE_AGENT"
#: Set (not "0"): an error said in one line (the command line's, a script's configuration
#: error) is printed with its whole traceback instead.
FULL_TRACEBACK_ENV = "TREADLE_FULL_TRACEBACK"
_CONFIG_LINE = "treadle_config_line"  # the attribute mark_config_error sets on an error
#: What a failure was (``treadle`` in the error file; read by the launcher): a configuration
#: error, another error of the process's own, a stall the watch ended, or a stop because
#: another process failed.
KINDS = ("config", "error", "stall", "stopped")

_store: Any = None  # the job's store (treadle/distributed/comm.py: open_job_store), or None
_rank = 0
_heard: str | None = None  # a file where this process's stall watch leaves what the job said (see hear_from)
_lock = threading.Lock()  # the store: the main thread and the stall watch's helper thread


def status_of(kind: str) -> int:
    """The exit status of a failure of ``kind``: 2 for a configuration error, else 1."""
    return 2 if kind == "config" else 1


def agent_speaks() -> bool:
    """Whether treadle's launcher started this process and says the job's failure itself."""
    return os.environ.get(AGENT_ENV) == "1"


def use_store(store: Any, rank: int) -> None:
    """Claims and failures go to ``store`` from now on (None: no store, e.g. after the
    process group ended)."""
    global _store, _rank
    _store, _rank = store, rank


def _env_rank() -> int:
    """This process's rank by its launcher's environment (before the process group is up)."""
    for key in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(key)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _env_world_size() -> int:
    """How many processes this process's launcher started (its environment's; 1 without one)."""
    for rank, size in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                       ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank in os.environ:
            try:
                return int(os.environ.get(size, "1"))
            except ValueError:
                return 1
    return 1


def _store_op(op: Any) -> Any:
    """``op(store)`` under the lock; None when there is no store or it is gone."""
    global _store
    with _lock:
        if _store is None:
            return None
        try:
            return op(_store)
        except Exception:  # the process serving it ended: no store from now on
            _store = None
            return None


def claim(line: str, kind: str = "error") -> bool:
    """Whether this process is the one that prints the job's failure ``line``: the first
    to claim it in the job's store; without a store, rank 0 for a configuration error (the
    same on every rank), any process for anything else."""
    mine = json.dumps({"rank": _rank, "line": line, "kind": kind})
    got = _store_op(lambda s: s.compare_set("voice", "", mine))
    if got is None:
        return kind != "config" or _env_rank() == 0
    return (got.decode() if isinstance(got, bytes) else got) == mine


def hear_from(path: str | None) -> None:
    """What the job said may also be read from the file ``path`` (this process's stall
    watch writes there what it learned: the store may be gone by the time this process
    asks, its server ended with the stuck rank)."""
    global _heard
    _heard = path


def spoken() -> dict[str, Any] | None:
    """What the process that claimed the job's voice said (``rank``, ``line``, ``kind``), or None."""
    raw: Any = None
    if _heard is not None:
        try:
            with open(_heard) as f:
                raw = f.read()
        except OSError:
            raw = None
    if not raw:
        raw = _store_op(lambda s: s.get("voice") if s.check(["voice"]) else None)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def fail(line: str, kind: str = "error", started: float | None = None, stream: Any = None) -> int:
    """This process fails with an error of its own, ``line`` (all of it): written to the
    error file, printed (to ``stream``, default ``sys.stderr``) when this process is the
    job's voice (see the module's docstring). Returns the exit status for it."""
    write_error_file(line, kind, started)
    if claim(line, kind) and not agent_speaks():
        print(line, file=stream or sys.stderr, flush=True)
    return status_of(kind)


def follow_on(line: str, stream: Any = None) -> int:
    """This process stops because another one failed (``line`` says so): written to the
    error file, printed (to ``stream``, default ``sys.stderr``) only when no process of the
    job said anything and no launcher of treadle's will. Returns 1."""
    write_error_file(line, "stopped")
    if not agent_speaks() and spoken() is None:
        print(line, file=stream or sys.stderr, flush=True)
    return 1


def job_rank() -> int:
    """This process's rank in the job: the process group's once it is up, else the one its
    launcher's environment gives (0 in a process started alone)."""
    dist = _process_group()
    return dist.get_rank() if dist is not None else _env_rank()


def job_size() -> int:
    """How many processes the job has: the process group's size once it is up, else what
    this process's launcher's environment says (1 in a process started alone)."""
    dist = _process_group()
    return dist.get_world_size() if dist is not None else _env_world_size()


def job_warning(text: str) -> None:
    """A warning that every process of the job meets alike (a weights file that lacks a
    tensor of the model, a resume onto another layout of the processes): said once for the
    job, by rank 0, on the ``treadle`` logger. Other ranks say nothing, so use it only for
    what every rank finds the same; a warning of one rank's own (its loader, its device)
    goes to the logger as usual."""
    if job_rank() == 0:
        from treadle.logging.writers import get_logger

        get_logger().warning(text)


def elsewhere() -> str | None:
    """Why another process's failure made this one stop, when the job knows: the stall
    the watch ended (its line), or the rank that failed first; None when no process said
    anything (one killed without a Python error)."""
    said = spoken()
    if said is None or (said.get("rank") == _rank and said.get("kind") != "stall"):
        return None
    if said.get("kind") == "stall":
        return str(said.get("line", "")).removeprefix("treadle: ")
    return f"rank {said.get('rank')} failed first (its error is shown above)"


def full_traceback() -> bool:
    """Whether :data:`FULL_TRACEBACK_ENV` asks for whole tracebacks."""
    return os.environ.get(FULL_TRACEBACK_ENV, "") not in ("", "0")


def mark_config_error(error: BaseException, line: str) -> None:
    """``error`` is a mistake in what a script gave (the Trainer's arguments, a resume that
    does not fit the run), which every process of a job meets alike: uncaught in a
    process of a distributed script, the exception hook (:func:`install_excepthook`)
    prints ``line`` (one line that names the mistake) instead of its traceback, once for
    the job."""
    try:
        setattr(error, _CONFIG_LINE, line)
    except AttributeError:  # an exception type that takes no attributes: said with its traceback
        pass


def config_error_line(error: BaseException) -> str | None:
    """The line :func:`mark_config_error` gave ``error``, or None."""
    line = getattr(error, _CONFIG_LINE, None)
    return line if isinstance(line, str) else None


def install_excepthook() -> None:
    """An uncaught exception in a process of a distributed script (the Trainer, a loop of
    your own through the Strategy API) is said once for the job, as the command line
    says its errors: the first process to fail prints its traceback, a process that only
    stops because another failed prints nothing (:func:`follow_on`). A configuration
    error (:func:`mark_config_error`) is its one line instead of the traceback (the
    traceback with :data:`FULL_TRACEBACK_ENV` set), printed by the first process to claim
    the job's voice, or by rank 0 before the process group is up. Installed once, by the
    process group's set-up (treadle/distributed/comm.py), and by the Trainer before it
    reads its arguments in a process of a job of several."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = sys.excepthook
    # Written where stderr went when the hook was installed: torch's process-group set-up wraps
    # the hook it finds in one that captures stderr to put "[rank<r>]: " before every line.
    out = sys.stderr

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        import traceback

        line = config_error_line(error) if issubclass(kind, Exception) else None
        if line is not None:  # every rank meets it: said once, by the job's voice (rank 0 before there is one)
            fail(line if not full_traceback() else "".join(traceback.format_exception(kind, error, tb)).rstrip("\n"),
                 "config", stream=out)
            return
        if _store is None or not issubclass(kind, Exception):  # no job (it ended), or Ctrl-C / SystemExit
            (_previous_hook or sys.__excepthook__)(kind, error, tb)
            return
        if peer_lost(error) or collective_timed_out(error):
            why = elsewhere() or "another process of the job ended without a Python error"
            follow_on(f"treadle: stopped on rank {_rank}: {why}", stream=out)
            return
        fail("".join(traceback.format_exception(kind, error, tb)).rstrip("\n"), stream=out)
    sys.excepthook = hook


_previous_hook: Any = None


def write_error_file(line: str, kind: str = "error", started: float | None = None, job: bool = False) -> None:
    """Tell a TorchElastic agent (``treadle train --nproc``, torchrun) why this process
    fails: its ``TORCHELASTIC_ERROR_FILE``, in the agent's format, with ``kind`` (one of
    :data:`KINDS`), the status and the whole ``line`` for treadle's launcher.
    ``started``: when the failure began (unix seconds), which the agent compares to find
    the first one; ``job``: the failure is the whole job's (every rank stalled), no one
    process's. Nothing without such an agent."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    # torchrun's summary shows the message as the failure's "traceback": a stall's line; for
    # an error, or a stop because of another's, where the job's failure was said.
    message = line if kind == "stall" or agent_speaks() else "treadle printed this error above (once for the job)" \
        if kind != "stopped" else "stopped because another process failed (treadle printed why above)"
    try:
        stamp = str(int(started if started is not None else time.time()))
        data = json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": message, "timestamp": stamp}},
                           "treadle": kind, "treadle_line": line, "treadle_status": status_of(kind),
                           "treadle_job": job})
        # Written aside and renamed: the process may be ended mid-write (the stall watch's end,
        # the agent's SIGKILL), and the agent fails on a truncated file with a JSON traceback.
        aside = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(aside, "w") as f:
            f.write(data)
        os.replace(aside, path)
    except OSError:
        pass

def _process_group() -> Any:
    """``torch.distributed`` when a process group is set up, else None; never imports torch
    (the voice also says a config error found before torch is imported)."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def collective_timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a collective that timed out waiting for another process
    (gloo's "Timed out waiting ...", NCCL's watchdog)."""
    text = str(error)
    return isinstance(error, RuntimeError) and ("Timed out waiting" in text or "collective operation timeout" in text
                                                or ("timed out" in text.lower() and "collective" in text.lower()))


# What a collective raises when a peer process has gone (gloo, NCCL); and what torch's
# DataLoader raises when the launcher, stopping the job after another rank failed,
# terminated this rank's loader workers first (seen under load: SIGKILL to rank 1, rank 0
# in a step).
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited",
              "NCCL communicator was aborted", "has been aborted", "peer exited", "is killed by signal: Terminated")


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) is a collective failing because
    another process of the job has gone: this process then only stops, saying so; the
    job's real error is the other process's. Always False in one process."""
    dist = _process_group()
    if dist is None or dist.get_world_size() < 2:
        return False
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, RuntimeError) and any(s in str(error) for s in _PEER_LOST):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]  # None ends the loop
        seen += 1
    return False


__all__ = ["AGENT_ENV", "FULL_TRACEBACK_ENV", "KINDS", "agent_speaks", "claim", "collective_timed_out",
           "config_error_line", "elsewhere", "fail", "follow_on", "full_traceback", "hear_from", "install_excepthook",
           "job_rank", "job_size", "job_warning", "mark_config_error", "peer_lost", "spoken", "status_of", "use_store",
           "write_error_file"]
