"""The sentinel process beside each rank (treadle/distributed/sentinel.py starts it:
``python -m treadle.distributed.sentinel_main ARGS``): it runs
:class:`treadle.distributed.watch.Sentinel` every ``period_s`` until its rank is gone, asks
the rank for its stack, and ends it when the watch says so (when its Python does not run:
its child processes and then it, with SIGKILL).

A program of its own, beside the command line and above the layers it reads (the board,
the job's store, the run's checkpoints to say what a failure leaves saved): nothing
imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable

from treadle.checkpoint.directory import saved_note
from treadle.distributed import board as boards
from treadle.distributed.sentinel import BOARD_FILE, FLIGHT_DIR, FLIGHT_FILE, HEARD_FILE, STACK_FILE, WORK_DIR_FILE


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc; elsewhere none are known)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()  # after "pid (name) ": state, ppid, ...
            if len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry))
    return found


class _Rank:
    """What the sentinel does to its rank: asks for its stack, ends it."""

    def __init__(self, pid: int, ident: int, directory: str, board: memoryview, period_s: float) -> None:
        self.pid, self.ident, self.dir, self.board, self.period_s = pid, ident, directory, board, period_s
        self.stacks = os.path.join(directory, STACK_FILE)
        self._moved_at = 0  # the stacks file's size when the rank last moved: a dump after it is of this stop

    def moved(self) -> None:
        """The rank moved: a stack written before now is not where it stops next."""
        self._moved_at = os.path.getsize(self.stacks)

    def alive(self) -> bool:
        return os.getppid() == self.pid  # re-parented once it exits (even before it is reaped)

    def stack(self) -> Any:
        """The rank's main thread's frames: written by its helper thread when asked, or,
        when its Python does not run, by faulthandler's watchdog; None when neither has
        (yet: asked again at the next look)."""
        from treadle.distributed.stacks import thread_stack

        start = os.path.getsize(self.stacks)
        if self.board[boards.ASK] == self.board[boards.ANSWERED]:
            self.board[boards.ASK] += 1
        deadline = time.monotonic() + self.period_s + 1.0
        while self.board[boards.ASK] != self.board[boards.ANSWERED] and time.monotonic() < deadline:
            time.sleep(0.05)
        answered = self.board[boards.ASK] == self.board[boards.ANSWERED]
        with open(self.stacks, "rb") as f:  # offsets in bytes
            f.seek(start if answered else self._moved_at)
            text = f.read().decode(errors="replace")
        return thread_stack(text, self.ident)

    def end(self) -> None:
        """Ask the rank's helper thread to end it (status 1); when its Python does not run,
        kill its children and then it."""
        self.board[boards.END] = 1
        deadline = time.monotonic() + self.period_s + 2.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.alive():
            return
        for child in _children(self.pid):
            if child != os.getpid():
                try:
                    os.kill(child, signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def heard(self, end: dict[str, Any]) -> None:
        """Leave the job's end where the rank reads it (treadle/distributed/voice.py), written
        aside and renamed: the rank may read it at any time."""
        said = {"rank": -1, "line": f"treadle: {end['line']}", "kind": "stall"}
        path = os.path.join(self.dir, HEARD_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(said, f)
        os.replace(path + ".tmp", path)

    def saved(self) -> str:
        """What a failure leaves saved in the run's work_dir (when the rank said which)."""
        try:
            with open(os.path.join(self.dir, WORK_DIR_FILE)) as f:
                work_dir = f.read().strip()
        except OSError:
            return ""
        note = saved_note(work_dir)
        try:
            with open(os.path.join(self.dir, FLIGHT_FILE)) as f:
                flight = f.read().strip()
        except OSError:
            flight = os.path.join(work_dir, FLIGHT_DIR) if os.path.isdir(os.path.join(work_dir, FLIGHT_DIR)) else ""
        if flight:
            note += (f"; torch's flight recorder of each rank's last collectives: {flight} (python -m "
                     f"torch.distributed.flight_recorder.fr_trace {flight})")
        return note


def _say(rank: _Rank) -> Callable[[str], None]:
    """Rank 0's warning: on stdout as treadle's log lines, and in the run's log.txt."""
    def say(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} WARNING {text}", flush=True)
        try:
            with open(os.path.join(rank.dir, WORK_DIR_FILE)) as f:
                work_dir = f.read().strip()
            from treadle.logging.writers import TEXT_LOG_NAME

            log = os.path.join(work_dir, TEXT_LOG_NAME)
            if os.path.isfile(log):
                with open(log, "a") as f:
                    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} WARNING {text}\n")
        except OSError:
            pass
    return say


def main(argv: list[str] | None = None) -> int:
    """The sentinel process: watch one rank until it is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the rank's to handle
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    args = json.loads((argv if argv is not None else sys.argv[1:])[0])
    import datetime

    import torch.distributed as dist

    from treadle.distributed import voice
    from treadle.distributed.watch import Sentinel

    rank = _Rank(args["pid"], args["ident"], args["dir"], boards.attach(os.path.join(args["dir"], BOARD_FILE)),
                 args["period_s"])
    try:
        client = dist.TCPStore(args["host"], args["port"], None, False, timeout=datetime.timedelta(seconds=30))
        store = dist.PrefixStore(args["prefix"], client)
    except Exception:  # the job is gone already
        return 0
    voice.use_store(store, args["rank"])
    watch = Sentinel(store, args["rank"], args["world_size"], rank.board, warn_s=args["warn_s"],
                     timeout_s=args["timeout_s"], group_timeout_s=args["group_timeout_s"], period_s=args["period_s"],
                     take_stack=rank.stack, moved=rank.moved, end_rank=rank.end, heard=rank.heard, say=_say(rank),
                     saved=rank.saved)
    try:
        while rank.alive() and not watch.done:
            watch.tick()
            time.sleep(watch.period_s)
    except Exception:  # the store is gone (the process serving it ended): the job is ending
        pass
    deadline = time.monotonic() + 3.0
    while watch.done and rank.alive() and time.monotonic() < deadline:  # ended by this sentinel: going
        time.sleep(0.05)
    if not rank.alive():  # it ended without stopping its watch (killed, or ended by this sentinel): tidy up after it
        shutil.rmtree(args["dir"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
