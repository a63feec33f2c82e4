"""The stall watch's two halves: a sentinel process beside each rank, and what the rank
does for it (treadle/distributed/watch.py says what the watch decides).

The rank (:class:`RankWatch`, started by :func:`treadle.distributed.comm.start_watch`):

* moves its board (treadle/distributed/board.py) into a file the sentinel maps;
* runs one helper thread that wakes every ``period_s``: a heartbeat on the board (it
  stops when the process's Python does not run), a hand-written loop's progress
  (:meth:`RankWatch.follow`), the main thread's stack when the sentinel asks for it
  (written to a file), and the sentinel's request to end the process (its loader
  workers killed, exit status 1);
* keeps ``faulthandler``'s watchdog armed, re-armed by the helper thread at each wake:
  when the helper has not run for ``blind_s`` (the training thread holds the GIL in
  native code), the watchdog, a thread in C, writes every thread's stack to the same
  file. No signal is sent to the rank: nothing it waits in is interrupted;
* starts the sentinel: ``python -m treadle.sentinel_main ARGS``, which
  inherits its output streams and its TorchElastic error file.

The sentinel (treadle/sentinel_main.py, a program of its own) runs
:class:`treadle.distributed.watch.Sentinel` every ``period_s`` until its rank is gone.
When it must end a rank whose Python does not run, it kills the rank's child processes
and then the rank (SIGKILL).
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from types import FrameType
from typing import IO, Any, Callable

from treadle.distributed import board as boards
from treadle.distributed import voice

#: A rank's watch directory: its board, its stacks, its work_dir, what the job said, where its flight record went.
BOARD_FILE, STACK_FILE, WORK_DIR_FILE, HEARD_FILE, FLIGHT_FILE = "board", "stacks.txt", "work_dir", "heard.json", \
    "flight"
#: Where, in the run's work_dir, each rank's flight record goes (``rank_<r>``, as torch's analyzer reads them).
FLIGHT_DIR = "flight_recorder"


def blind_after(period_s: float) -> float:
    """Seconds without the helper thread running before the process counts as one whose
    Python does not run (and faulthandler's watchdog writes its stacks)."""
    return 3 * period_s + 1.0


def write_stack(out: IO[str], frame: FrameType | None, ident: int) -> None:
    """Thread ``ident``'s stack from its innermost ``frame``, in faulthandler's format
    (treadle/distributed/stacks.py reads both), with each function's qualified name."""
    lines = [f"Thread 0x{ident:016x} (most recent call first):"]
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {name}')
        frame = frame.f_back
    out.write("\n".join(lines) + "\n\n")
    out.flush()


class RankWatch:
    """The rank's half of the stall watch (see the module docstring). ``store``: where the
    sentinel connects, ``(host, port, prefix)``; the rest as for ``watch.Sentinel``."""

    def __init__(self, store: tuple[str, int, str], rank: int, world_size: int, *, warn_s: float | None,
                 timeout_s: float | None, group_timeout_s: float | None, period_s: float | None = None) -> None:
        given = [s for s in (warn_s, timeout_s, group_timeout_s) if s is not None]
        self.period_s = period_s if period_s is not None else min(max((min(given) if given else 300.0) / 20, 0.2), 2.0)
        self.blind_s = blind_after(self.period_s)
        self.rank, self._job = rank, store[2].strip("/").replace("/", "-")
        self._work_dir: str | None = None
        self.dir = tempfile.mkdtemp(prefix=f"treadle-watch-{rank}-")
        boards.share(os.path.join(self.dir, BOARD_FILE))
        self.board = boards.board()
        self._stacks = open(os.path.join(self.dir, STACK_FILE), "a")
        faulthandler.dump_traceback_later(self.blind_s, file=self._stacks)
        self._progress: Callable[[], Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._help, name="treadle-stall-watch", daemon=True)
        self._thread.start()
        args = {"host": store[0], "port": store[1], "prefix": store[2], "rank": rank, "world_size": world_size,
                "pid": os.getpid(), "dir": self.dir, "ident": threading.main_thread().ident, "warn_s": warn_s,
                "timeout_s": timeout_s, "group_timeout_s": group_timeout_s, "period_s": self.period_s}
        # torch's C++ warnings of a store whose server ended with its rank are not the job's to say. A
        # session of its own: a Ctrl-C (or a launcher's signal) to the job's process group is its rank's
        # to handle; the sentinel goes when its rank does.
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        self.process = subprocess.Popen([sys.executable, "-m", "treadle.sentinel_main", json.dumps(args)],
                                        stdin=subprocess.DEVNULL, close_fds=True, env=env, start_new_session=True)
        voice.hear_from(os.path.join(self.dir, HEARD_FILE))

    def follow(self, progress: Callable[[], Any] | None = None, work_dir: Any = None) -> None:
        """A run goes on: ``progress()`` (a hand-written loop's, read by the helper thread;
        anything that changes as the run moves; None: the Trainer's loop writes the board
        itself), and its ``work_dir`` (what a failure leaves saved, for the line that ends
        the job)."""
        self._progress = progress
        if work_dir is not None:
            self._work_dir = str(work_dir)
            with open(os.path.join(self.dir, WORK_DIR_FILE), "w") as f:
                f.write(str(work_dir))

    def set_active(self, active: bool) -> None:
        """A run (fit, validate, test, a hand-written loop) is going on: stalls count."""
        self.board[boards.ACTIVE] = 1 if active else 0

    def _help(self) -> None:
        b, last = self.board, None
        main = threading.main_thread().ident or 0
        while not self._stop.wait(self.period_s):
            b[boards.BEAT] += 1
            # Re-armed at every wake: it fires only when this thread stops running (the GIL held).
            faulthandler.dump_traceback_later(self.blind_s, file=self._stacks)
            ask = b[boards.ASK]
            if ask != b[boards.ANSWERED]:
                write_stack(self._stacks, sys._current_frames().get(main), main)
                self._dump_flight_record()
                b[boards.ANSWERED] = ask
            progress = self._progress
            if progress is not None:
                try:
                    now = progress()
                except Exception:  # a counter read while it changes: next time
                    now = last
                if now != last:
                    last = now
                    b[boards.STEPS] += 1
            if b[boards.END]:
                end_now()

    def _dump_flight_record(self) -> None:
        """With torch's flight recorder on (NCCL's, switched on by comm.init_distributed),
        this rank's record of its last collectives, to ``<work_dir>/flight_recorder/rank_<r>``
        (a temporary directory of the job's without a work_dir); where it went, for the
        line that ends the job."""
        from treadle.compat import dump_flight_record, flight_recorder_on

        if not flight_recorder_on():
            return
        data = dump_flight_record()
        if not data:
            return
        where = os.path.join(self._work_dir, FLIGHT_DIR) if self._work_dir else \
            os.path.join(tempfile.gettempdir(), f"treadle-{FLIGHT_DIR}-{self._job}")
        try:
            os.makedirs(where, exist_ok=True)
            path = os.path.join(where, f"rank_{self.rank}")
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
            with open(os.path.join(self.dir, FLIGHT_FILE), "w") as f:
                f.write(where)
        except OSError:  # a full or read-only disk: the stack and the line still come
            pass

    def stop(self) -> None:
        """Stop the sentinel and the helper thread; the board becomes private again."""
        self._stop.set()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.period_s + 1)
        faulthandler.cancel_dump_traceback_later()
        voice.hear_from(None)
        self._stacks.close()
        boards.unshare()
        shutil.rmtree(self.dir, ignore_errors=True)


def end_now(status: int = 1) -> None:
    """End this process at once, with ``status``, its DataLoader workers first (none left
    behind); the sentinel wrote why."""
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]  # a started child has a pid
        except (OSError, TypeError):
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
