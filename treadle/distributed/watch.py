"""The stall watch: a rank that stops while the others wait for it is named, with its
Python stack, and the job is ended, naming it; ranks that all stop together end the
job too, each said where it is, none blamed.

Each rank of a job has a sentinel: a small process of its own, started with the process
group (treadle/distributed/sentinel.py), so that nothing it does needs the rank's
interpreter lock. The rank's training thread does nothing for it but write, at each
phase change, its phase and iteration into a few integers the sentinel maps
(treadle/distributed/board.py). Every ``period_s`` seconds a sentinel reads them and
publishes its rank's record to the key-value store every rank reaches (the one the
process group was set up through: torchrun's agent's, else rank 0's, served by a thread
that needs no Python), keyed by global rank. When its rank has not moved for a while,
it asks for the rank's stack: the rank's helper thread writes it when the training thread
waits with the GIL free, and ``faulthandler``'s watchdog (a thread in C) has written it
when the training thread holds the GIL in native code (treadle/distributed/stacks.py reads
both); the stack says what the phase does not (forward, backward or optimizer inside a
step, the line of the user's code, the ``torch.distributed`` call it waits in).

Rank 0's sentinel judges the job. When no rank has moved for ``warn_s`` seconds while a
run is active, the rank(s) furthest behind (the lowest iteration, then the earliest phase
of it, then not waiting in a collective) are stuck, the others wait for them: one warning
names the stuck ranks, their phase and iteration, and shows their stacks. When a
deadline passes the job is ended: the stuck ranks' sentinels end them (exit status 1, or
SIGKILL when their Python does not run), the others stop when their collectives fail (or
their sentinels end them a few seconds later). Ranks all at the same place (all asleep in
forward, all in one collective) end at the deadline too: the line says where each is and
blames none.

The deadline is ``timeout_s`` (``stall_timeout_s``) when set, else a few seconds before the
process group's own timeout, which would end the job then anyway, blaming a rank that
waits. So by default a run is never ended earlier than before, and a long first compile,
a large checkpoint save or a long validation on one rank is only warned about.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, Sequence

from treadle.distributed import voice
from treadle.distributed.board import ACTIVE, BEAT, EVAL, ITER, PHASE, STEPS, phase_name
from treadle.distributed.stacks import Frame, Place, Places, format_stack

#: What a phase's messages call it, and its order inside one iteration (what comes later
#: waits for what comes earlier). ``collective`` (the ranks agreeing after an iteration),
#: the epoch's end and validation come after the loop counted the iteration done: their
#: iteration is one less (:func:`_key`).
_ORDER = {"run": 0, "before_train": 0, "epoch start": 0, "data": 1, "step": 2, "forward": 2, "compile": 2, "backward": 3,
          "optimizer": 4, "hooks": 5, "checkpoint": 5, "collective": 6, "epoch end": 7, "validation": 8, "test": 8,
          "after_train": 9}
_AFTER_COUNT = ("collective", "epoch end", "validation", "test", "after_train")
_BLIND = "its Python does not run: native code holding the GIL?"


def _phase(record: dict[str, Any]) -> str:
    """A record's phase: the loop's, made finer by the stack inside a step (or a run
    without the Trainer's loop: a hand-written one)."""
    phase = record.get("ph", "run")
    return record.get("f") or phase if phase in ("step", "run") else phase


def _key(record: dict[str, Any]) -> tuple[float, ...]:
    """Order of a rank's record in the run: a rank with a lower key is behind."""
    if not record.get("a"):
        return (float("inf"),)
    it = record.get("it")
    it = int(it) if isinstance(it, int) else 0
    phase = _phase(record)
    if phase in _AFTER_COUNT:
        it -= 1
    return (it, _ORDER.get(phase, 0), 1 if record.get("c") else 0)


def _where(record: dict[str, Any], detail: bool = True) -> str:
    """``in forward at iteration 6 (forward, m.py:4)`` for a record (``detail``: with the
    innermost frame of the user's code), the collective it waits in, and that its Python
    does not run when it does not."""
    phase, it = _phase(record), record.get("it")
    text = f"in {phase}"
    if isinstance(it, int):
        text += f" after iteration {it}" if phase in _AFTER_COUNT else f" at iteration {it + 1}"
    if detail and record.get("d") and phase != "collective":
        text += f" ({record['d']})"
    if record.get("c"):
        text += f", waiting in torch.distributed's {record['c']}"
    if detail and record.get("b"):
        text += f"; {_BLIND}"
    return text


def rank_list(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 0, 2 and 5``, ``ranks 0-63`` (runs of consecutive ranks joined)."""
    ranks = list(ranks)
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


def _places_of(records: dict[int, dict[str, Any]], ranks: Sequence[int], detail: bool = True) -> str:
    """Where ``ranks`` are: their place when they share one (``in forward at iteration 5
    (...)``), else each group's (``rank 0 in forward ...; rank 2 in data ...``)."""
    places: dict[str, list[int]] = {}
    for r in ranks:
        places.setdefault(_where(records[r], detail), []).append(r)
    if len(places) == 1:
        return next(iter(places))
    return "; ".join(f"{rank_list(rs)} {where}" for where, rs in places.items())


def _everyone(records: dict[int, dict[str, Any]]) -> str:
    """Where every rank is: ``all 2 ranks in forward ...``, or each group's place."""
    places = _places_of(records, sorted(records))
    return f"all {len(records)} ranks {places}" if places.startswith("in ") else places


def _record(board: Sequence[int], moves: int, place: Place, blind: bool, stack_taken: bool) -> dict[str, Any]:
    """A rank's record as its sentinel publishes it (see :func:`_key`, :func:`_where`)."""
    it = board[ITER]
    return {"a": bool(board[ACTIVE]), "it": it if it >= 0 else None, "ph": phase_name(board[PHASE]), "f": place.phase,
            "d": place.detail, "c": place.collective, "n": moves, "b": blind, "s": stack_taken}


class Sentinel:
    """One rank's stall watch (rank 0's also judges the job); see the module docstring.
    It runs in a process of its own (treadle/distributed/sentinel.py), one :meth:`tick`
    every ``period_s`` seconds.

    Args:
        store: a ``torch.distributed`` Store every rank reaches (a PrefixStore of the job's own).
        rank, world_size: the watched process in the job (global numbering).
        board: the watched process's board (treadle/distributed/board.py), read here.
        warn_s: seconds without progress before the warning (None: only at the deadline).
        timeout_s: seconds without progress before the job is ended (None: the process
            group's timeout, ``group_timeout_s``, less a margin).
        group_timeout_s: the process group's timeout, which ends a stalled job anyway.
        period_s: how often it looks (default: from the settings, 0.2 to 2 s).
        take_stack: the watched process's main thread's frames, now (None: not yet; asked again
            at the next look).
        moved: called when the watched process has moved (a stack from before is stale).
        end_rank: ends the watched process (its status 1, or killed when its Python does not run).
        heard: told the job's end once read (the watched process learns it without the store).
        say: where rank 0's warning goes (default: stdout, as treadle's log lines).
        saved: what a failure leaves saved, for the line that ends the job.
        places: reads places from stacks (default: torch's, treadle's and Python's directories).
    """

    def __init__(self, store: Any, rank: int, world_size: int, board: Sequence[int], *,
                 warn_s: float | None = 300.0, timeout_s: float | None = None, group_timeout_s: float | None = None,
                 period_s: float | None = None, take_stack: Callable[[], list[Frame] | None] = lambda: None,
                 moved: Callable[[], None] = lambda: None, end_rank: Callable[[], None] = lambda: None,
                 heard: Callable[[dict[str, Any]], None] = lambda end: None, say: Callable[[str], None] | None = None,
                 saved: Callable[[], str] | None = None, places: Places | None = None) -> None:
        self.store, self.rank, self.world_size, self.board = store, rank, world_size, board
        self.warn_s, self.timeout_s, self.group_timeout_s = warn_s, timeout_s, group_timeout_s
        given = [s for s in (warn_s, timeout_s, group_timeout_s) if s is not None]
        first = min(given) if given else 300.0
        self.period_s = period_s if period_s is not None else min(max(first / 20, 0.2), 2.0)
        self.deadline_s = self._deadline()
        #: seconds without progress before anything is said: the warning, or the deadline first
        firsts = [s for s in (warn_s, self.deadline_s) if s is not None]
        self.first_s = min(firsts) if firsts else float("inf")
        #: the heartbeat of the watched process's helper thread stopped this long: its Python does not run
        self.blind_s = 3 * self.period_s + 1.0
        self._take_stack, self._moved, self._end_rank, self._heard = take_stack, moved, end_rank, heard
        self._say, self._saved = say, saved
        self.places = places if places is not None else Places()
        # the watched rank: its moves, since when it has not moved, and its heartbeat
        self._last: Any = None
        self._moves = 0
        self._still_since = 0.0
        self._beat: Any = None
        self._beat_at = 0.0
        self._stack_for = -1  # the moves count the published stack belongs to
        self._place = Place()
        # rank 0: each rank's moves as last seen, and when they changed (this clock)
        self._seen: dict[int, Any] = {}
        self._changed: dict[int, float] = {}
        self._warned = False
        self._stuck: list[int] = []
        self._waited_for_stacks = False
        # the end, once read: when, and whether this rank was ended
        self.end: dict[str, Any] | None = None
        self._end_read_at = 0.0
        self.done = False

    def _deadline(self) -> float | None:
        """When the job is ended: ``timeout_s``, or a margin before the process group's
        timeout (which ends it then anyway, blaming a waiting rank), the earlier."""
        implied = None
        if self.group_timeout_s is not None:
            implied = self.group_timeout_s - min(max(3 * self.period_s + 2.0, 5.0), self.group_timeout_s / 5)
        given = [s for s in (self.timeout_s, implied) if s is not None]
        return min(given) if given else None

    # -- one look ---------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Publish the watched rank's record, follow the end, judge (rank 0)."""
        now = time.monotonic() if now is None else now
        if self.done:
            return
        self._observe(now)
        self._follow_end(now)
        if self.rank == 0 and self.end is None:
            self._judge(now)

    def _observe(self, now: float) -> None:
        b = self.board
        seen = (b[PHASE], b[ITER], b[EVAL], b[STEPS], b[ACTIVE])
        if seen != self._last:
            self._last, self._moves, self._still_since, self._place = seen, self._moves + 1, now, Place()
            self._moved()
        if b[BEAT] != self._beat:
            self._beat, self._beat_at = b[BEAT], now
        blind = now - self._beat_at >= self.blind_s
        # Still for a while: the stack, ready for rank 0's warning (once per stop).
        if b[ACTIVE] and self._stack_for != self._moves and now - self._still_since >= self.first_s - 3 * self.period_s:
            frames = self._take_stack()
            if frames:
                self._stack_for = self._moves
                self._place = self.places.read(frames)
                self.store.set(f"stack{self.rank}", format_stack(frames, self.places))
        record = _record(b, self._moves, self._place, blind, self._stack_for == self._moves)
        self.store.set(f"r{self.rank}", json.dumps(record))

    # -- the end ------------------------------------------------------------------------------
    def _follow_end(self, now: float) -> None:
        if self.end is None:
            if not self.store.check(["end"]):
                return
            self.end, self._end_read_at = json.loads(self.store.get("end")), now
            self._heard(self.end)
            self.store.set(f"ack{self.rank}", "1")  # read: the stuck ranks may go (rank 0 may serve the store)
        end = self.end
        waited = now - self._end_read_at
        if end.get("all") or self.rank in end["ranks"]:
            everyone_read = self.store.check([f"ack{r}" for r in range(self.world_size)])
            if everyone_read or waited >= 2 * self.period_s + 2.0:
                voice.write_error_file(end["line"], "stall", started=end.get("since"), job=bool(end.get("all")))
                self._finish()
        elif waited >= max(10.0, 3 * self.period_s):  # its collective never failed (NCCL): end it too
            voice.write_error_file(f"stopped on rank {self.rank}: {end['short']}", "stopped")
            self._finish()

    def _finish(self) -> None:
        self.done = True
        self._end_rank()

    # -- rank 0: the job ----------------------------------------------------------------------
    def _records(self) -> dict[int, dict[str, Any]]:
        from treadle.compat import store_get_many

        raw = store_get_many(self.store, [f"r{r}" for r in range(self.world_size)])
        return {r: json.loads(v) for r, v in enumerate(raw)}

    def _judge(self, now: float) -> None:
        records = self._records()
        for r, rec in records.items():
            if self._seen.get(r) != rec.get("n"):
                self._seen[r], self._changed[r] = rec.get("n"), now
        active = [r for r, rec in records.items() if rec.get("a")]
        quiet = now - max(self._changed.values())
        if not active or quiet < self.first_s:
            if self._warned and quiet < self.period_s * 1.5:  # it moved again
                self._report(f"stall: {rank_list(self._stuck)} moved on")
                self._warned = False
            return
        # The stacks say what the phases do not (forward or backward): wait a tick or two for them.
        if not all(records[r].get("s") for r in active) and quiet < self.first_s + 3 * self.period_s:
            return
        keys = {r: _key(records[r]) for r in range(self.world_size)}
        low = min(keys[r] for r in active)
        stuck = [r for r in active if keys[r] == low]
        if not self._warned:
            self._stuck = stuck
            self._warn(records, stuck, quiet)
            self._warned = True
        if self.deadline_s is not None and quiet >= self.deadline_s:
            self._end_job(records, stuck, quiet, now)

    def _why(self, ending: bool) -> str:
        if self.timeout_s is not None and self.deadline_s == self.timeout_s:
            return f"stall_timeout_s={self.timeout_s:g}"
        if ending:
            return (f"before the process group's timeout_s={self.group_timeout_s:g} would end it, blaming a rank that "
                    "waits")
        return f"the process group's timeout_s={self.group_timeout_s:g} is near"

    def _others(self, records: dict[int, dict[str, Any]], stuck: list[int]) -> str:
        waiting: dict[str, list[int]] = {}
        for r, rec in records.items():
            if r not in stuck:
                waiting.setdefault(_where(rec, detail=False) if rec.get("a") else "done with the run", []).append(r)
        return "; ".join(f"{rank_list(rs)} wait{'s' if len(rs) == 1 else ''} ({where})"
                         for where, rs in waiting.items())

    def _warn(self, records: dict[int, dict[str, Any]], stuck: list[int], quiet: float) -> None:
        if len(stuck) == self.world_size:
            head = (f"stall: no rank has made progress for {_seconds(quiet)}: {_everyone(records)} (not one rank "
                    "behind the others: none is blamed)")
        else:
            head = (f"stall: {rank_list(stuck)} {'has' if len(stuck) == 1 else 'have'} made no progress for "
                    f"{_seconds(quiet)}, {_places_of(records, stuck)}; {self._others(records, stuck)}")
        if self.deadline_s is not None:
            why = self._why(False)
            head += (f"; ending the job ({why})" if quiet >= self.deadline_s else
                     f"; the job ends {_seconds(self.deadline_s - quiet)} from now unless it moves ({why})")
        stacks = []
        for r in stuck[:4]:
            text = self.store.get(f"stack{r}").decode() if self.store.check([f"stack{r}"]) else "  (no stack)"
            stacks.append(f"Python stack of rank {r} (most recent call last):\n{text}")
        self._report("\n".join([head, *stacks]))

    def _end_job(self, records: dict[int, dict[str, Any]], stuck: list[int], quiet: float, now: float) -> None:
        everyone = len(stuck) == self.world_size
        if everyone:
            line = (f"no rank made progress for {_seconds(quiet)}: {_everyone(records)}; not one rank behind the "
                    f"others, so none is blamed: the job is ended ({self._why(True)})")
            short = f"no rank made progress for {_seconds(quiet)} and the stall watch ended the job"
        else:
            them = "it" if len(stuck) == 1 else "them"
            line = (f"{rank_list(stuck)} made no progress for {_seconds(quiet)} ({_places_of(records, stuck)}); the "
                    f"other ranks waited for {them}: the job is ended ({self._why(True)})")
            short = (f"{rank_list(stuck)} made no progress for {_seconds(quiet)} "
                     f"({_places_of(records, stuck, detail=False)}) and the stall watch ended the job")
        saved = self._saved() if self._saved is not None else ""
        if saved:
            line += f"; {saved}"
        end = {"ranks": stuck, "all": everyone, "line": line, "short": short, "since": time.time() - quiet}
        self.store.set("end", json.dumps(end))
        said = f"treadle: {line}"
        if not voice.agent_speaks() and voice.claim(said, "stall"):  # treadle's launcher says it itself
            print(said, file=sys.stderr, flush=True)
        self._follow_end(now)

    def _report(self, text: str) -> None:
        if self._say is not None:
            self._say(text)
            return
        stamp = time.strftime("%H:%M:%S")
        print(f"{stamp} WARNING {text}", flush=True)


__all__ = ["Sentinel", "rank_list"]
