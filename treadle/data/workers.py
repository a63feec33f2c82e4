"""Loader workers that end with their process: a DataLoader's worker processes outlive a
training process killed with SIGKILL (torch's workers notice a dead parent only between
batches, then block at exit flushing results nobody reads), each holding its memory and the
launcher's output pipes. :func:`dies_with_parent` wraps a loader's ``worker_init_fn`` so that
on Linux each worker asks the kernel for SIGKILL when the process that started it ends
(``prctl(PR_SET_PDEATHSIG)``), and ends at once if that process is already gone. Elsewhere
the function is left as it is. :class:`~treadle.data.feed.DataFeed` applies it to the loaders
it iterates.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any, Callable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class DiesWithParent:
    """``worker_init_fn`` wrapped: the parent-death signal first, then ``fn`` (picklable, so
    loaders started by ``spawn`` take it too)."""

    def __init__(self, fn: Callable[[int], Any] | None, parent: int) -> None:
        self.fn, self.parent = fn, parent

    def __call__(self, worker_id: int) -> None:
        _ask_for_sigkill_with(self.parent)
        if self.fn is not None:
            self.fn(worker_id)


def _ask_for_sigkill_with(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: torch's own checks remain
        return
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)


def dies_with_parent(loader: Any) -> None:
    """Make ``loader``'s worker processes end with this process (Linux; a DataLoader with
    workers; once: a wrapped function is not wrapped again)."""
    if not sys.platform.startswith("linux") or getattr(loader, "num_workers", 0) == 0:
        return
    fn = getattr(loader, "worker_init_fn", None)
    if isinstance(fn, DiesWithParent):
        return
    loader.worker_init_fn = DiesWithParent(fn, os.getpid())


__all__ = ["DiesWithParent", "dies_with_parent"]
