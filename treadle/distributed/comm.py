"""Process group set-up and the few collectives the engine needs.

Small Python objects (log values, RNG states, stop flags, paths) travel over a
gloo group even when training uses NCCL, so they never wait on a CUDA stream.
Every function is a cheap no-op in a single process.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import importlib
import os
import sys
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist

from treadle.compat import FLIGHT_RECORDER_ENV
from treadle.distributed.env import DistEnv, detect_launcher, restart_store_hazard

#: The collectives torch's flight recorder keeps per process group under NCCL (its documentation's advice).
FLIGHT_RECORDER_ENTRIES = 2000
_control_group: Any = None  # gloo group for objects; None means the default group
_destroy_world: Callable[[], Any] | None = None  # see destroy_world_with
_failed = False  # see mark_failed
_watch: Any = None  # the stall watch (treadle/distributed/sentinel.py), see start_watch


def is_distributed() -> bool:
    """True inside an initialised process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one (many workers x many ranks)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: keep the limit
        pass


def init_distributed(env: DistEnv | None = None, *, backend: str | None = None,
                     timeout_s: float = 1800.0) -> torch.device:
    """Initialise the default process group for ``env`` (detected when None).

    Backend: ``nccl`` when CUDA is available, else ``gloo``. With CUDA, this process
    uses the GPU of its local rank. Returns the device. Idempotent: an already
    initialised group is used as it is.
    """
    global _control_group
    env = env if env is not None else detect_launcher()
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if use_cuda:
        if env.local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {env.local_rank} has no GPU: only {torch.cuda.device_count()} visible; "
                               "start at most one process per GPU on each node")
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
    else:
        device = torch.device("cpu")
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent started us, in a session of our own: do not outlive it
        from treadle.distributed.launch import end_with_launcher

        end_with_launcher()
    if not env.distributed or dist.is_initialized():
        return device
    if timeout_s is None or not timeout_s > 0:
        raise ValueError(f"the process-group timeout must be a positive number of seconds, got {timeout_s!r}")
    backend = backend or ("nccl" if use_cuda else "gloo")
    # env:// reads these; launchers other than torchrun do not set them all.
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.setdefault("MASTER_PORT", str(env.master_port))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(env.rank), str(env.world_size)
    os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
    raise_open_file_limit()
    hazard = restart_store_hazard() if env.launcher == "torchrun" and env.rank == 0 else None
    if hazard is not None:
        warnings.warn(hazard, RuntimeWarning, stacklevel=2)
    # Ten functions of torch.distributed.nn.functional take `group=group.WORLD` as a
    # default argument, evaluated on import; DistributedDataParallel imports the module
    # (through torch._dynamo) after init_process_group, and the defaults then keep the
    # group alive for good, past shutdown() (see there). Imported before, they are None.
    importlib.import_module("torch.distributed.nn.functional")
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device  # binds the communicator eagerly: no lazy first-collective init
        if not any(key in os.environ for key in FLIGHT_RECORDER_ENV):  # the stall watch dumps it (sentinel.py)
            os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = str(FLIGHT_RECORDER_ENTRIES)
    try:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    except RuntimeError as e:  # the processes could not connect: not a configuration error
        raise ProcessGroupError(_connect_failure(e, env)) from e
    # Free the group before the interpreter tears itself down (see shutdown()).
    atexit.register(_shutdown_at_exit)
    _control_group = dist.new_group(backend="gloo") if backend != "gloo" else None
    return device


class ProcessGroupError(ConnectionError):
    """The processes of the job could not connect into a process group (an OSError: a
    failure of the run, status 1, not of its configuration)."""


def _connect_failure(error: RuntimeError, env: DistEnv) -> str:
    """The line for a process group that could not connect: the error's first line and,
    on a restart of torchrun's that shares its rendezvous store, that known cause and its
    workaround (treadle/distributed/env.py restart_store_hazard)."""
    from treadle.distributed.env import restart_count

    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    line = f"rank {env.rank} could not connect the process group of {env.world_size} processes ({first})"
    hazard = restart_store_hazard()
    if restart_count() > 0 and hazard is not None:
        line += f"; this is restart {restart_count()} of an elastic job, and {hazard}"
    return line


def control_group() -> Any:
    """The gloo group for objects (created on first use when the user's group is NCCL)."""
    global _control_group
    if _control_group is None and dist.get_backend() != "gloo":
        _control_group = dist.new_group(backend="gloo")  # collective: every rank gets here together
    return _control_group


def barrier() -> None:
    if is_distributed():
        dist.barrier(group=control_group())


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` from rank ``src`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=control_group())
    return box[0]


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank; ``group``: only the ranks of that
    gloo group (a layout's ``data_object_group``: the ranks that read different data, for
    sums of results that count each batch once), in their order."""
    if not is_distributed():
        return [obj]
    group = group if group is not None else control_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj`` on rank ``dst`` (None elsewhere)."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=control_group())
    return out


def any_rank(*flags: bool) -> list[bool]:
    """For each flag: True on every rank when it is True on any (one CPU all-reduce)."""
    if not is_distributed():
        return list(flags)
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control_group())
    return [bool(v) for v in t.tolist()]


def open_job_store() -> tuple[str, int, str]:
    """The store every process of the job reaches, for the stall watch and the job's one
    voice (treadle/distributed/voice.py): the one the process group was set up through
    (``MASTER_ADDR:MASTER_PORT``: under torchrun its agent's, which outlives any rank;
    else rank 0's, served by a thread that needs no Python), over a connection of this
    process's own, under a prefix of this job attempt's (rank 0 draws it; one broadcast:
    collective, every rank calls it once the group is up). Returns ``(host, port, prefix)``."""
    import secrets

    from treadle.distributed import voice
    from treadle.distributed.env import restart_count

    token = broadcast_object(secrets.token_hex(4) if get_rank() == 0 else None)
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefix = f"treadle/{restart_count()}/{token}/"
    client = dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=30))
    voice.use_store(dist.PrefixStore(prefix, client), get_rank())
    voice.install_excepthook()
    return host, port, prefix


def start_watch(*, warn_s: float | None, timeout_s: float | None, group_timeout_s: float | None) -> None:
    """Open the job's store (:func:`open_job_store`; collective) and start this process's
    stall watch (treadle/distributed/sentinel.py: a sentinel process beside this one).
    Nothing in one process; no watch with nothing to watch for (``warn_s`` and
    ``timeout_s`` None)."""
    global _watch
    stop_watch()
    if not is_distributed():
        return
    job = open_job_store()
    if warn_s is None and timeout_s is None:
        return
    from treadle.distributed.sentinel import RankWatch

    _watch = RankWatch(job, get_rank(), get_world_size(), warn_s=warn_s, timeout_s=timeout_s,
                       group_timeout_s=group_timeout_s)


def stall_watch() -> Any:
    """This process's stall watch (a ``RankWatch``), or None."""
    return _watch


def stop_watch() -> None:
    """Stop the stall watch, if one runs (:func:`shutdown` does)."""
    global _watch
    watch, _watch = _watch, None
    if watch is not None:
        watch.stop()


def failure_elsewhere() -> str | None:
    """Why another process of the job made this one's collective fail, when the job
    knows: the stall the watch ended, or the rank that failed first with an error of its
    own; None when it does not (no store, or a process that died without a Python error:
    killed, ``os._exit``, out of memory)."""
    from treadle.distributed import voice

    return voice.elsewhere()


def mark_failed() -> None:
    """This process is ending on an error (the command line caught it and prints it):
    no collective at exit. Its peers may be gone or stuck in the collective it left, so
    waiting for them would hang; its exit closes its connections, their collectives fail
    at once, and the launcher stops what is left."""
    global _failed
    _failed = True


def _shutdown_at_exit() -> None:
    """At a clean exit, wait for every rank (so that none closes its connections while
    a peer still uses them), then free the group. After an error (uncaught, or caught
    and marked by :func:`mark_failed`), only stop the stall watch: see there.

    The collection :func:`shutdown` ends with has freed every cycle the run left; what
    survived it is frozen (``gc.freeze``), so that the interpreter's teardown, which
    would go over every object of the process several times (several seconds on a busy
    machine), frees it by reference counts alone and the rank ends promptly."""
    if _watch is not None and (_failed or getattr(sys, "last_value", None) is not None):
        stop_watch()
    if _failed or getattr(sys, "last_value", None) is not None or not dist.is_initialized():
        return
    try:
        dist.barrier(group=control_group())
    except Exception:  # a peer is gone: nothing left to agree with
        return
    shutdown()
    gc.freeze()


def destroy_world_with(destroy: Callable[[], Any]) -> None:
    """Have the next :func:`shutdown` destroy the default group with ``destroy()``
    instead of torch's ``destroy_process_group``: for a library that keeps groups of its
    own over it. DeepSpeed keeps a clone of the world group, which outlives torch's
    destroy and breaks the next DeepSpeed run in the process ("Group ... is not
    registered"); ``deepspeed.comm.destroy_process_group`` forgets it too."""
    global _destroy_world
    _destroy_world = destroy


def shutdown() -> None:
    """Destroy the process group (and the object group) if one is initialised, and
    free it now, while the interpreter is whole."""
    global _control_group, _destroy_world
    from treadle.distributed import voice

    stop_watch()  # before the group goes: its sentinel reads the ranks' records
    voice.use_store(None, 0)
    destroy, _destroy_world = _destroy_world or dist.destroy_process_group, None
    if not (dist.is_available() and dist.is_initialized()):
        _control_group = None
        return
    # destroy_process_group only forgets the group: gloo has no shutdown of its own, its
    # worker threads stop and its connections close when the last reference goes. A
    # group still alive when the interpreter finalizes dies there, and a gloo worker
    # that then takes the GIL to free its last collective's tensors is ended by Python
    # inside a C++ destructor: std::terminate, "terminate called without an active
    # exception", SIGABRT, a failed job. A finished Trainer's DDP model (its C++
    # reducer) holds a reference, in a reference cycle: collect it now, while `world`
    # keeps the group alive, and drop `world` last, because its deleter releases the
    # GIL while the workers are joined (a reducer dropping the last reference would
    # join them holding the GIL: a hang).
    world = dist.group.WORLD
    destroy()
    _control_group = None
    gc.collect()
    del world
