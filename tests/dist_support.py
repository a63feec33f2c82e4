"""Run a function on N local processes joined by a gloo process group (tests only).

    results = run_ranks(worker, world_size=2, args=(tmp_path,), timeout_s=90)

``worker(rank, world_size, *args)`` must be a module-level function of an importable
file (a test module is fine: the child imports the file by path, so pytest's import
mode does not matter). Each child gets ``MASTER_ADDR``/``MASTER_PORT`` (a free port),
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in its environment, as
torchrun would set them, and one intra-op thread; the worker initialises the group
itself (e.g. through a strategy's ``setup()``). The group is destroyed when it returns.

The children see no GPU (``CUDA_VISIBLE_DEVICES=""``, set before the worker's file is
imported, so before anything touches CUDA; ``env`` may say otherwise): distributed tests
run 2 processes on gloo, and a 1-GPU machine cannot give 2 nccl ranks a GPU each.

Return values travel back through ``torch.save`` and are read with
``weights_only=True``: tensors and plain containers only. An exception in any rank
fails the call with that rank's traceback; a rank still running after ``timeout_s``
(a hang, e.g. a missed collective) is killed and the call raises ``TimeoutError``.
"""

from __future__ import annotations

import importlib.util
import io
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual race is acceptable in tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_function(file: str, qualname: str) -> Callable[..., Any]:
    name = f"_dist_support_{Path(file).stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: pickling/dataclasses look it up
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _child(file: str, qualname: str, rank: int, world_size: int, port: int, args: tuple[Any, ...],
           results: Any, sys_path: list[str], env: dict[str, str]) -> None:
    # First: torch reads CUDA_VISIBLE_DEVICES when CUDA is first used (torch.cuda is lazy),
    # which the worker's file may do at import (tests/support.py's DEVICE).
    os.environ.update({"CUDA_VISIBLE_DEVICES": "", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), **env})
    sys.path[:] = sys_path
    torch.set_num_threads(1)  # N ranks share few cores
    try:
        value = _load_function(file, qualname)(rank, world_size, *args)
        buf = io.BytesIO()
        torch.save(value, buf)
        results.put((rank, True, buf.getvalue()))
    except BaseException:  # report everything, KeyboardInterrupt included
        results.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int = 2, args: tuple[Any, ...] = (),
              timeout_s: float = 120.0, env: dict[str, str] | None = None) -> list[Any]:
    """``fn(rank, world_size, *args)`` on ``world_size`` processes; their results in rank order.
    ``env``: variables for the children, over the defaults (e.g. ``CUDA_VISIBLE_DEVICES``)."""
    file = getattr(getattr(fn, "__code__", None), "co_filename", None)
    if file is None or not os.path.isfile(file) or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn.__qualname__} must be a module-level function of a file")
    ctx = mp.get_context("spawn")  # fork would inherit the parent's torch threads and state
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(file, fn.__qualname__, r, world_size, port, tuple(args), results,
                                              list(sys.path), dict(env or {})), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    clean = False  # every rank reported a result: let them exit on their own
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) + len(errors) < world_size:
            left = deadline - time.monotonic()
            try:
                rank, ok, payload = results.get(timeout=max(min(left, 1.0), 0.01))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():  # killed (e.g. a segfault) without reporting
                    time.sleep(0.5)  # a queued report may still be in the pipe
                    if results.empty():
                        raise RuntimeError(f"rank process exited with code {dead[0].exitcode} without a result")
                if left <= 0:
                    raise TimeoutError(f"{fn.__qualname__} on {world_size} ranks did not finish in {timeout_s:.0f}s "
                                       f"(finished ranks: {sorted(out)}); a collective probably hangs") from None
                continue
            if ok:
                out[rank] = torch.load(io.BytesIO(payload), weights_only=True)
            else:
                errors.append(f"--- rank {rank} ---\n{payload}")
                break  # the other ranks may now wait forever on a collective
        if errors:
            raise RuntimeError(f"{fn.__qualname__} failed:\n" + "\n".join(errors))
        clean = True
    finally:
        for p in procs:
            p.join(timeout=10 if clean else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    return [out[r] for r in range(world_size)]
