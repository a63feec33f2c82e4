"""The stall watch: a rank that stops while the others wait for it is named, with its
Python stack, and the job is ended, naming it.

Each process of a job runs one daemon thread, its watcher. The training thread does
nothing for it: no call, no store, no collective per step. Every ``period_s`` seconds the
watcher reads where its rank is:

* how far it got, from a function the run gives (:meth:`StallWatch.follow`; the Trainer's
  iteration, mode and evaluation batch), read from this thread;
* what it is doing, from the training thread's Python stack (``sys._current_frames``):
  the phase of the iteration (data, forward, backward, optimizer, hooks, collective,
  checkpoint, validation) and whether it waits in a ``torch.distributed`` call;

and writes that record to a key-value store every rank reaches: the ``TCPStore`` the
process group was set up through (torchrun's agent's, else rank 0's), over a connection
of the watch's own, keys by global rank, whatever the device mesh
(treadle/distributed/comm.py ``start_watch``). Rank 0's watcher reads every record. When no rank has
moved for ``warn_s`` seconds while a run is active, the rank(s) furthest behind (the
lowest iteration, then the earliest phase of it, then not waiting in a collective) are
stuck, the others wait for them: one warning names the stuck ranks, their phase and
iteration, and shows their stacks (each rank's watcher publishes its own stack once it
has not moved for a while). When a deadline passes, the watch ends the job: the stuck
ranks print one line and exit with status 1 first (so that launchers blame them), the
others stop when their collectives fail (or their watchers end them a few seconds later).

The deadline is ``timeout_s`` (``stall_timeout_s``) when set, else a few seconds before the
process group's own timeout, which would end the job then anyway, blaming a rank that
waits. So by default a run is never ended earlier than before, and a long first compile,
a large checkpoint save or a long validation on one rank is only warned about.

Ranks all at the same place (all in one collective, all compiling) are not one stuck
rank: the warning says so and names no culprit; the deadline then leaves it to the
process group's timeout.
"""

from __future__ import annotations

import json
import linecache
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable

#: What a phase's messages call it, and its order inside one iteration (what comes later
#: waits for what comes earlier). ``agree``, the epoch's end and validation come after the
#: loop counted the iteration done: their iteration is one less (:func:`_key`).
_ORDER = {"epoch start": 0, "data": 1, "forward": 2, "step": 2, "compile": 2, "backward": 3, "optimizer": 4,
          "hooks": 5, "checkpoint": 5, "collective": 6, "epoch end": 7, "validation": 8, "test": 8, "run": 0}
_AFTER_COUNT = ("collective", "epoch end", "validation", "test")
_SEP = "/"


def _norm(filename: str) -> str:
    return filename.replace("\\", _SEP)


def _qualname(frame: FrameType) -> str:
    code = frame.f_code
    return getattr(code, "co_qualname", code.co_name)


@dataclass(frozen=True)
class Place:
    """Where a rank's training thread is: ``phase`` (see ``_ORDER``), the ``detail`` of it
    (the innermost frame of the user's code, e.g. ``Net.forward (model.py:40)``), and
    ``collective``: the ``torch.distributed`` function it waits in, or ""."""

    phase: str
    detail: str = ""
    collective: str = ""


def _torch_dir() -> str:
    import torch

    return _norm(os.path.dirname(torch.__file__)) + _SEP


def _treadle_dir() -> str:
    return _norm(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + _SEP


def _stdlib_dir() -> str:
    return _norm(os.path.dirname(os.__file__)) + _SEP


class _Places:
    """Reads a :class:`Place` from a stack (its directories looked up once)."""

    def __init__(self) -> None:
        self.torch, self.treadle, self.stdlib = _torch_dir(), _treadle_dir(), _stdlib_dir()

    def _own(self, file: str) -> bool:
        """A frame of the user's code or of a library of theirs (not torch, treadle or the standard library)."""
        return not file.startswith((self.torch, self.treadle, self.stdlib, "<"))

    def _torch_phase(self, file: str, name: str) -> str | None:
        t = self.torch
        if file.startswith((t + "_dynamo/", t + "_inductor/")):
            return "compile"
        if file.startswith(t + "autograd/") or (file == t + "_tensor.py" and name == "backward"):
            return "backward"
        if file.startswith(t + "optim/"):
            return "optimizer"
        if file.startswith(t + "utils/data/"):
            return "data"
        if file == t + "nn/modules/module.py" and name in ("_call_impl", "_wrapped_call_impl"):
            return "forward"
        return None

    def read(self, frame: FrameType | None, mode: str = "train") -> Place:
        """The place of the stack whose innermost frame is ``frame``."""
        frames: list[FrameType] = []
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        frames.reverse()  # outermost first
        files = [_norm(f.f_code.co_filename) for f in frames]
        phase, below = "run", 0  # the place, and where the frames under it start
        saving = False
        loops, eval_loop = self.treadle + "engine/loops.py", self.treadle + "engine/eval_loop.py"
        for i, (f, file) in enumerate(zip(frames, files)):
            name = f.f_code.co_name
            if file == eval_loop and name == "run":
                phase, below = ("test" if mode == "test" else "validation"), i + 1
            elif file == loops and name == "_run_batches":
                line = linecache.getline(f.f_code.co_filename, f.f_lineno)
                phase = ("step" if "step(" in line else "collective" if "agree(" in line
                         else "hooks" if "fn(" in line else "data")
                below = i + 1
            elif file == loops and name in ("_open_epoch", "_close_epoch"):
                phase, below = ("epoch start" if name == "_open_epoch" else "epoch end"), i + 1
            elif file.startswith(self.treadle + "engine/snapshot.py") and name == "save":
                saving = True
        if phase in ("step", "run"):  # the outermost torch phase under the step: forward, backward, optimizer
            for f, file in zip(frames[below:], files[below:]):
                found = self._torch_phase(file, f.f_code.co_name)
                if found is not None:
                    phase = found if found != "data" or phase == "run" else phase
                    break
        if saving and phase in ("hooks", "epoch end", "run"):
            phase = "checkpoint"
        collective = ""
        if files and files[-1].startswith(self.torch + "distributed/"):
            collective = frames[-1].f_code.co_name
        inner = [(f, file) for f, file in zip(reversed(frames[below:]), reversed(files[below:]))]
        named = next(((f, file) for f, file in inner if self._own(file)), None) or next(
            ((f, file) for f, file in inner if file.startswith(self.treadle)), None)
        detail = f"{_qualname(named[0])}, {os.path.basename(named[1])}:{named[0].f_lineno}" if named else ""
        return Place(phase, detail, collective)


def main_thread_frame() -> FrameType | None:
    """The main thread's innermost frame (what the training thread runs)."""
    return sys._current_frames().get(threading.main_thread().ident or -1)


def format_stack(frame: FrameType | None, limit: int = 24) -> str:
    """``frame``'s stack as a traceback shows it: from the training loop's frame down (the
    command line and ``fit`` above it say nothing), at most the innermost ``limit`` frames."""
    if frame is None:
        return "  (no Python frame)"
    frames = traceback.extract_stack(frame)
    loops = _treadle_dir() + "engine/"
    start = next((i for i, f in enumerate(frames) if _norm(f.filename).startswith(loops)
                  and f.name in ("_run_batches", "run", "_open_epoch", "_close_epoch")), 0)
    return "".join(traceback.format_list(frames[start:][-limit:])).rstrip("\n")


def _key(record: dict[str, Any]) -> tuple[float, ...]:
    """Order of a rank's record in the run: a rank with a lower key is behind."""
    if not record.get("a"):
        return (float("inf"),)
    it = record.get("it")
    it = int(it) if isinstance(it, int) else 0
    phase = record.get("ph", "run")
    if phase in _AFTER_COUNT:
        it -= 1
    return (it, _ORDER.get(phase, 0), 1 if record.get("c") else 0)


def _where(record: dict[str, Any], detail: bool = True) -> str:
    """``in forward at iteration 6 (Net.forward, m.py:4)`` for a record (``detail``: with
    the innermost frame of the user's code), and the collective it waits in."""
    phase, it = record.get("ph", "run"), record.get("it")
    text = f"in {phase}"
    if isinstance(it, int):
        text += f" after iteration {it}" if phase in _AFTER_COUNT else f" at iteration {it + 1}"
    if detail and record.get("d") and phase != "collective":
        text += f" ({record['d']})"
    if record.get("c"):
        text += f", waiting in torch.distributed's {record['c']}"
    return text


def rank_list(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0, 2 and 5``, ``ranks 0-63`` (runs of consecutive ranks joined)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + (", ".join(runs[:-1]) + " and " + runs[-1] if len(runs) > 1 else runs[0])


def _seconds(s: float) -> str:
    return f"{s:.0f} s"


class StallWatch:
    """One process's watcher thread (rank 0's also judges the job); see the module docstring.

    Args:
        store: a ``torch.distributed`` Store every rank reaches (a PrefixStore of the watch's own).
        rank, world_size: this process in the job (global numbering).
        warn_s: seconds without progress before the warning (None: only at the deadline).
        timeout_s: seconds without progress before the job is ended (None: the process
            group's timeout, ``group_timeout_s``, less a margin).
        group_timeout_s: the process group's timeout, which ends a stalled job anyway.
        period_s: how often the watcher looks (default: from the settings, 0.2 to 2 s).
        report: where rank 0 writes the warning (default: the treadle logger's warning).
    """

    def __init__(self, store: Any, rank: int, world_size: int, *, warn_s: float | None = 300.0,
                 timeout_s: float | None = None, group_timeout_s: float | None = None,
                 period_s: float | None = None, report: Callable[[str], None] | None = None,
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.warn_s, self.timeout_s, self.group_timeout_s = warn_s, timeout_s, group_timeout_s
        first = min(s for s in (warn_s, timeout_s, group_timeout_s) if s is not None) if any(
            s is not None for s in (warn_s, timeout_s, group_timeout_s)) else 300.0
        self.period_s = period_s if period_s is not None else min(max(first / 20, 0.2), 2.0)
        self.deadline_s = self._deadline()
        #: seconds without progress before anything is said: the warning, or the deadline first
        firsts = [s for s in (warn_s, self.deadline_s) if s is not None]
        self._first_s = min(firsts) if firsts else float("inf")
        self._report = report
        self._exit = exit_process
        self._lock = threading.Lock()  # the store: this thread and the main thread's failure path
        self._store_lost = False  # a store operation failed: its server is gone (each failure logs in C++)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._places = _Places()
        # what the run says of itself (follow): () -> (iteration or None, mode, anything that moves)
        self._progress: Callable[[], tuple[Any, str, Any]] | None = None
        self._saved: Callable[[], str] | None = None  # what was and was not saved, for the last line
        self.active = False
        # this rank: its moves, and since when it has not moved
        self._last: Any = None
        self._moves = 0
        self._still_since = time.monotonic()
        self._stack_sent = False
        # rank 0: each rank's moves as last seen, and when they changed (this clock)
        self._seen: dict[int, int] = {}
        self._changed: dict[int, float] = {}
        self._episode = 0  # stalls seen; a warning and an end per stall
        self._warned: int | None = None
        self._stuck: list[int] = []
        self.verdict: str | None = None  # the line that ended the job, once it is ending
        self._ended_at: float | None = None
        self._stuck_here = False
        self._short = ""  # the verdict as the waiting ranks say it
        self._since: float | None = None  # when the stall that ends the job began (unix seconds)

    # -- settings -----------------------------------------------------------------------
    def _deadline(self) -> float | None:
        """When the job is ended: ``timeout_s``, or a margin before the process group's
        timeout (which ends it then anyway, blaming a waiting rank), the earlier."""
        implied = None
        if self.group_timeout_s is not None:
            implied = self.group_timeout_s - min(max(3 * self.period_s + 2.0, 5.0), self.group_timeout_s / 5)
        given = [s for s in (self.timeout_s, implied) if s is not None]
        return min(given) if given else None

    # -- what the run tells it (training thread, once per run) ----------------------------
    def follow(self, progress: Callable[[], tuple[Any, str, Any]] | None,
               saved: Callable[[], str] | None = None) -> None:
        """Judge progress by ``progress()``, read from the watcher thread: ``(iteration,
        mode, anything that changes as the run moves)``; ``saved()``: what a failure leaves
        saved, for the line that ends the job."""
        self._progress, self._saved = progress, saved

    def set_active(self, active: bool) -> None:
        """A run (fit, validate, test, a hand-written loop) is going on: stalls count."""
        self.active = active

    # -- the thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._publish()
        self._thread = threading.Thread(target=self._loop, name="treadle-stall-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.period_s + 1)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            if self._store_lost:
                if self.verdict is None:
                    return
                self._after_end(time.monotonic())  # a pending end needs no store
                continue
            try:
                self.tick()
            except Exception:  # the store is gone (the process serving it ended): never used again
                self._store_lost = True

    def tick(self, now: float | None = None) -> None:
        """One look: publish this rank's record, follow the commands, judge (rank 0)."""
        now = time.monotonic() if now is None else now
        self._publish(now)
        self._follow_commands(now)
        if self.rank == 0 and self.verdict is None:
            self._judge(now)

    # -- this rank ------------------------------------------------------------------------
    def _sample(self) -> tuple[dict[str, Any], Any, FrameType | None]:
        """This rank's record, what it says has moved, and the training thread's frame."""
        frame = main_thread_frame()
        it, mode, marker = self._progress() if self._progress is not None else (None, "train", None)
        place = self._places.read(frame, mode)
        record = {"a": self.active, "it": it, "ph": place.phase, "d": place.detail, "c": place.collective}
        return record, marker, frame

    def _publish(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        record, marker, frame = self._sample()
        seen = (record["a"], record["it"], record["ph"], record["c"], marker)
        if seen != self._last:
            self._last, self._moves, self._still_since, self._stack_sent = seen, self._moves + 1, now, False
        record["n"] = self._moves
        with self._lock:
            self.store.set(f"r{self.rank}", json.dumps(record))
            # Still for a while: this rank's stack, ready for rank 0's warning (once per stop).
            if not self._stack_sent and record["a"] and now - self._still_since >= self._first_s - 2 * self.period_s:
                self.store.set(f"stack{self.rank}", format_stack(frame))
                self._stack_sent = True

    def _follow_commands(self, now: float) -> None:
        with self._lock:
            if not self.store.check(["end"]):
                return
            end = json.loads(self.store.get("end"))
        self._take_end(end, now)

    def _take_end(self, end: dict[str, Any], now: float) -> None:
        if self.verdict is None:
            self.verdict, self._ended_at = end["line"], now
            self._short = end.get("short", end["line"])
            self._stuck_here = self.rank in end["ranks"]
            self._since = end.get("since")
        self._after_end(now)

    def _after_end(self, now: float) -> None:
        """The job is ending: a stuck rank ends once every watcher could read why (so that
        launchers blame it, and its peers say why); a waiting rank whose collective never
        failed (NCCL) is ended a little later."""
        if self._ended_at is None or self.verdict is None:
            return
        waited = now - self._ended_at
        # Rank 0 may serve the store (launchers other than torchrun): it waits a little, so that
        # every watcher reads why before it goes.
        if self._stuck_here and waited >= (1.5 * self.period_s if self.rank == 0 else 0):
            self._end(self.verdict, "stall", started=self._since)
        elif not self._stuck_here and waited >= max(10.0, 3 * self.period_s):
            self._end(f"stopped on rank {self.rank}: {self._short}", "stopped", started=None)

    def _end(self, line: str, kind: str, started: float | None) -> None:
        print(f"treadle: {line}", file=sys.stderr, flush=True)
        write_error_file(line, kind, started)
        for child in multiprocessing.active_children():  # the DataLoader workers: none left behind
            try:
                os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]  # a started child has a pid
            except (OSError, TypeError):
                pass
        sys.stdout.flush()
        self._exit(1)

    # -- rank 0: the job ----------------------------------------------------------------------
    def _records(self) -> dict[int, dict[str, Any]]:
        from treadle.compat import store_get_many

        keys = [f"r{r}" for r in range(self.world_size)]
        with self._lock:
            raw = store_get_many(self.store, keys)
        return {r: json.loads(v) for r, v in enumerate(raw)}

    def _judge(self, now: float) -> None:
        records = self._records()
        for r, rec in records.items():
            if self._seen.get(r) != rec.get("n"):
                self._seen[r], self._changed[r] = rec.get("n"), now
        active = [r for r, rec in records.items() if rec.get("a")]
        quiet = now - max(self._changed.values())
        if not active or quiet < self._first_s:
            if self._warned is not None and quiet < self.period_s * 1.5:  # it moved again
                self._say(f"stall: {rank_list(self._stuck)} moved on")
                self._warned = None
            return
        keys = {r: _key(records[r]) for r in range(self.world_size)}
        low = min(keys[r] for r in active)
        stuck = [r for r in active if keys[r] == low]
        if self._warned is None:
            self._episode += 1
            self._stuck = stuck
            self._warn(records, stuck, quiet)
            self._warned = self._episode
        if self.deadline_s is not None and quiet >= self.deadline_s and len(stuck) < self.world_size:
            self._end_job(records, stuck, quiet)

    def _others(self, records: dict[int, dict[str, Any]], stuck: list[int]) -> str:
        waiting: dict[str, list[int]] = {}
        for r, rec in records.items():
            if r not in stuck:
                waiting.setdefault(_where(rec, detail=False) if rec.get("a") else "done with the run", []).append(r)
        parts = [f"{rank_list(rs)} wait{'s' if len(rs) == 1 else ''} ({where})" for where, rs in waiting.items()]
        return "; ".join(parts)

    def _warn(self, records: dict[int, dict[str, Any]], stuck: list[int], quiet: float) -> None:
        everyone = len(stuck) == self.world_size
        where = _where(records[stuck[0]])
        if everyone:
            head = (f"stall: no rank has made progress for {_seconds(quiet)}, all {self.world_size} {where} "
                    "(not one rank behind the others: a collective every rank is in, or a long phase they share)")
        else:
            head = (f"stall: {rank_list(stuck)} {'has' if len(stuck) == 1 else 'have'} made no progress for "
                    f"{_seconds(quiet)}, {where}; {self._others(records, stuck)}")
        if self.deadline_s is not None and not everyone:
            why = (f"stall_timeout_s={self.timeout_s:g}" if self.timeout_s is not None and self.deadline_s == self.timeout_s
                   else f"the process group's timeout_s={self.group_timeout_s:g} is near")
            head += (f"; ending the job ({why})" if quiet >= self.deadline_s else
                     f"; the job ends {_seconds(self.deadline_s - quiet)} from now unless it moves ({why})")
        stacks = []
        with self._lock:
            for r in stuck[:4]:
                text = self.store.get(f"stack{r}").decode() if self.store.check([f"stack{r}"]) else \
                    "  (no stack: its watcher thread does not run; the training thread may hold the GIL in native code)"
                stacks.append(f"Python stack of rank {r} (most recent call last):\n{text}")
        self._say("\n".join([head, *stacks]))

    def _end_job(self, records: dict[int, dict[str, Any]], stuck: list[int], quiet: float) -> None:
        why = (f"stall_timeout_s={self.timeout_s:g}" if self.timeout_s is not None and self.deadline_s == self.timeout_s
               else f"before the process group's timeout_s={self.group_timeout_s:g} would end it, blaming a rank "
                    "that waits")
        line = (f"{rank_list(stuck)} made no progress for {_seconds(quiet)} ({_where(records[stuck[0]])}; the other "
                f"ranks waited for it): the job is ended ({why})")
        saved = self._saved() if self._saved is not None else ""
        if saved:
            line += f"; {saved}"
        short = (f"{rank_list(stuck)} made no progress for {_seconds(quiet)} ({_where(records[stuck[0]], detail=False)}) "
                 "and the stall watch ended the job")
        end = {"ranks": stuck, "line": line, "short": short, "since": time.time() - quiet}
        with self._lock:
            self.store.set("end", json.dumps(end))
        self._take_end(end, time.monotonic())

    def _say(self, text: str) -> None:
        if self._report is not None:
            self._report(text)
            return
        from treadle.logging.writers import get_logger

        get_logger().warning(text)

    # -- the main thread's failure path -----------------------------------------------------
    def note_failure(self, line: str) -> None:
        """This rank failed with an error of its own (printed): peers say so, not more."""
        if self._store_lost:
            return
        try:
            with self._lock:
                self.store.compare_set("failed", "", json.dumps({"rank": self.rank, "line": line}))
        except Exception:  # the store is gone: nothing to tell
            self._store_lost = True

    def elsewhere(self) -> str | None:
        """Why this rank's collective failed, when the watch knows: the stall verdict, or
        the rank that failed first with an error of its own."""
        failed = ""
        try:
            with self._lock:
                if not self._store_lost:
                    if self.verdict is None and self.store.check(["end"]):
                        end = json.loads(self.store.get("end"))
                        self.verdict, self._short = end["line"], end.get("short", end["line"])
                    failed = self.store.get("failed").decode() if self.store.check(["failed"]) else ""
        except Exception:
            self._store_lost = True
        if self.verdict is not None:
            return self._short or self.verdict
        if failed:
            first = json.loads(failed)
            return f"rank {first['rank']} failed first (its error is shown by it)"
        return None

    def end_stalled(self, reason: str) -> str | None:
        """This rank's collective timed out (``reason``): the ranks seen stuck are ended
        first (rank 0 ends them if the watch has not yet), so that the launcher blames
        them; this rank waits a moment for them to go. The line naming them, or None."""
        try:
            if self.rank == 0 and self._stuck and self.verdict is None and not self._store_lost:
                records = self._records()
                quiet = time.monotonic() - max(self._changed.values())
                line = (f"{rank_list(self._stuck)} made no progress for {_seconds(quiet)} "
                        f"({_where(records[self._stuck[0]])}), and the other ranks' collective timed out waiting for "
                        f"it ({reason})")
                end = {"ranks": self._stuck, "line": line, "since": time.time() - quiet}
                with self._lock:
                    self.store.set("end", json.dumps(end))
                self.verdict = self._short = line
            why = self.elsewhere()
            if why is not None and self.verdict is not None and not self._stuck_here:
                time.sleep(min(2 * self.period_s + 1.0, 5.0))  # the stuck ranks go first
            return why
        except Exception:
            return None


#: What a process's error file says it was (``treadle`` in the file; read by treadle/distributed/launch.py):
#: its own error (printed by it), a stall the watch ended, or a stop because another process failed.
ERROR_KINDS = ("error", "stall", "stopped")


def write_error_file(line: str, kind: str = "error", started: float | None = None) -> None:
    """Tell a TorchElastic agent (``treadle train --nproc``, torchrun) why this process
    fails: its ``TORCHELASTIC_ERROR_FILE``, in the agent's format, with ``kind`` (one of
    :data:`ERROR_KINDS`). ``started``: when the failure began (unix seconds), which the
    agent compares to find the first one. Nothing without such an agent."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    if kind == "error":  # printed by this process already: torchrun's summary points there, once
        line = "this process printed its error above (treadle's line)"
    try:
        stamp = str(int(started if started is not None else time.time()))
        # torchrun shows py_callstack as the failure's "traceback": the line. Written aside and
        # renamed: the process may be ended mid-write (the stall watch's end, the agent's SIGKILL),
        # and the agent fails on a truncated file with a JSON traceback instead of the line.
        data = json.dumps({"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}},
                           "treadle": kind})
        aside = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(aside, "w") as f:
            f.write(data)
        os.replace(aside, path)
    except OSError:
        pass


__all__ = ["ERROR_KINDS", "Place", "StallWatch", "format_stack", "main_thread_frame", "rank_list", "write_error_file"]
