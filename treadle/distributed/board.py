"""Where this process's training thread is, as the loops tell it: a few integers in
memory that another process can read.

The loops write the phase they enter and the iteration (``board()[PHASE] = STEP``: one
store into a ``memoryview``, no call, no lock, nothing else per step). In one process
the board is a private buffer nobody reads. When the stall watch runs
(treadle/distributed/watch.py), :func:`share` moves it into a small file mapped into
memory, which the watch's sentinel process maps too: it reads where the rank is without
the rank's interpreter lock, so a training thread stuck in native code that holds the
GIL still shows its phase and iteration as it last wrote them.

Slots (int64): ``PHASE`` (one of :data:`PHASES`), ``ITER`` (the Trainer's iteration
counter as the loop last wrote it), ``EVAL`` (batches of the running evaluation),
``STEPS`` (a hand-written loop's progress, counted by the in-process helper thread),
``ACTIVE`` (1 while a run goes on), ``BEAT`` (the helper thread's heartbeat: it stops
when the process's Python does not run), ``END`` (the sentinel asks the process to end),
``ASK`` and ``ANSWERED`` (the sentinel asks for the stack, the helper thread wrote it).
"""

from __future__ import annotations

import mmap
import os

#: Phase codes, as the loops write them, by name (the index is the code).
PHASES = ("run", "epoch start", "data", "step", "hooks", "checkpoint", "collective", "epoch end", "validation", "test",
          "before_train", "after_train")
(RUN, EPOCH_START, DATA, STEP, HOOKS, CHECKPOINT, COLLECTIVE, EPOCH_END, VALIDATION, TEST, BEFORE_TRAIN,
 AFTER_TRAIN) = range(len(PHASES))

#: Slot indices.
PHASE, ITER, EVAL, STEPS, ACTIVE, BEAT, END, ASK, ANSWERED = range(9)
SLOTS = 10
SIZE = 8 * SLOTS

_board: memoryview = memoryview(bytearray(SIZE)).cast("q")
_board[ITER] = -1  # no iteration written yet (a hand-written loop never writes one)
_mapped: mmap.mmap | None = None


def board() -> memoryview:
    """This process's board (int64 slots). A loop takes it once per run and writes into
    it; :func:`share` may replace it between runs (when a process group starts)."""
    return _board


def share(path: str) -> None:
    """Move the board into the file ``path`` (created, :data:`SIZE` bytes), mapped into
    memory so that another process can map it too (:func:`attach`). What the board
    holds is kept."""
    global _board, _mapped
    with open(path, "wb") as f:
        f.write(_board.tobytes())
    with open(path, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), SIZE)
    _board, _mapped = memoryview(mapped).cast("q"), mapped  # a loop still holding the old one writes where nobody reads


def unshare() -> None:
    """Back to a private board (its values kept), e.g. when the process group ends."""
    global _board, _mapped
    if _mapped is None:
        return
    _board, _mapped = memoryview(bytearray(_board.tobytes())).cast("q"), None  # the map goes with its last view


def attach(path: str) -> memoryview:
    """Another process's board, mapped from its file (the sentinel's view: it reads every
    slot and writes ``END`` only)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mapped = mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
    return memoryview(mapped).cast("q")


def phase_name(code: int) -> str:
    """The name of phase ``code`` ("run" for a code the board does not know)."""
    return PHASES[code] if 0 <= code < len(PHASES) else "run"


__all__ = ["PHASES", "SIZE", "SLOTS", "attach", "board", "phase_name", "share", "unshare"]
