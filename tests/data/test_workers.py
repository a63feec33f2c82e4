"""A loader's worker processes end with the process that iterates it, even when that process
is killed with SIGKILL (treadle/data/workers.py): torch's own workers would outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from treadle.data.workers import DiesWithParent, dies_with_parent

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader
    from treadle.data.feed import DataFeed

    class Big:  # batches larger than a pipe holds: a worker of a killed process blocks at exit flushing them
        def __len__(self): return 10_000
        def __getitem__(self, i): return b"x" * 1_000_000  # through the pipe itself (tensors go by shared memory)

    feed = DataFeed(DataLoader(Big(), batch_size=4, num_workers=2), seed=0)
    feed.start_epoch(0)
    next(feed)
    time.sleep(1)  # the workers fill their queue
    children = [int(p) for p in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()]
    print(" ".join(map(str, children)), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_end_when_their_process_is_killed():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(w) for w in workers)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(w) for w in workers)


def test_the_loaders_own_worker_init_fn_still_runs_and_is_wrapped_once():
    from torch.utils.data import DataLoader

    seen = []
    loader = DataLoader(range(4), num_workers=2, worker_init_fn=seen.append)
    dies_with_parent(loader)
    dies_with_parent(loader)
    wrapped = loader.worker_init_fn
    assert isinstance(wrapped, DiesWithParent) and wrapped.fn == seen.append and wrapped.parent == os.getpid()
    in_process = DataLoader(range(4))
    dies_with_parent(in_process)
    assert in_process.worker_init_fn is None  # no workers: nothing to do
