"""The stall watch (treadle/distributed/watch.py) in one process: where a training thread
is, as the loops write it on the board and as its stack says; which rank is stuck and
what the warning and the end say, on a store of records (the jobs themselves, with their
sentinel processes: tests/distributed/test_fail_fast.py and test_hangs.py, slow)."""

from __future__ import annotations

import io
import json
import sys
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import treadle
from treadle.distributed import board as boards
from treadle.distributed.launch import failure_line, first_failure, say_failure
from treadle.distributed.sentinel import write_stack
from treadle.distributed.stacks import Frame, Place, Places, thread_stack
from treadle.distributed.watch import Sentinel, rank_list

from support import TinyNet, make_data


# -- where a training thread is ------------------------------------------------------------
class Gate:
    """Where a thread blocks until the test has read its stack (each blocking place waits
    in its own frame: ``gate.reached.set(); gate.go.wait(30)``, so that frame is the innermost
    of the test's code)."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()


class BlockingNet(TinyNet):
    def __init__(self, gate: Gate | None) -> None:
        super().__init__()
        self.gate = gate

    def forward(self, x):
        if self.gate is not None and self.training:
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
        return super().forward(x)


class BlockingBackward(torch.autograd.Function):
    gate: Gate | None = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if BlockingBackward.gate is not None:
            BlockingBackward.gate.reached.set(); BlockingBackward.gate.go.wait(30)  # noqa: E702
        return grad


class BackwardNet(TinyNet):
    def forward(self, x):
        return BlockingBackward.apply(super().forward(x))


class BlockingSGD(torch.optim.SGD):
    gate: Gate | None = None

    def step(self, closure=None):
        if BlockingSGD.gate is not None:
            BlockingSGD.gate.reached.set(); BlockingSGD.gate.go.wait(30)  # noqa: E702
        return super().step(closure)


class BlockingData(Dataset):
    def __init__(self, gate: Gate) -> None:
        self.data, self.gate = make_data(32), gate

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        if i == 5:
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
        return self.data[i]


class BlockingHook(treadle.Hook):
    def __init__(self, gate: Gate, point: str) -> None:
        self.gate, self.point = gate, point

    def before_train(self, trainer) -> None:
        if self.point == "before_train":
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702

    def after_train(self, trainer) -> None:
        if self.point == "after_train":
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if self.point == "hook":
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
        elif self.point == "checkpoint" and trainer.state.iter == 1:
            def blocking_writer(path, payloads, meta=None):
                self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
                return path
            trainer.save_checkpoint(trainer.checkpoint_path("x"), writer=blocking_writer)


def _where_it_blocks(tmp_path, where: str) -> tuple[str, int, Place]:
    """The phase and iteration on the board, and the place read from the stack the
    sentinel asks for (written by the helper thread in faulthandler's format), of a
    Trainer's training thread blocked at ``where``."""
    gate = Gate()
    kw: dict = dict(model=TinyNet(), train_dataloader=DataLoader(make_data(32), batch_size=8), hooks=[])
    if where == "forward":
        kw["model"] = BlockingNet(gate)
    elif where == "backward":
        kw["model"], BlockingBackward.gate = BackwardNet(), gate
    elif where == "optimizer":
        BlockingSGD.gate = gate
    elif where == "data":
        kw["train_dataloader"] = DataLoader(BlockingData(gate), batch_size=4)
    elif where in ("hook", "checkpoint", "before_train", "after_train"):
        kw["hooks"] = [BlockingHook(gate, where)]
    elif where == "validation":
        kw["val_dataloader"] = DataLoader(BlockingData(gate), batch_size=4)
        kw["val_interval"] = 1
    model = kw.pop("model")
    optimizer = BlockingSGD(model.parameters(), lr=0.1) if where == "optimizer" else dict(type="SGD", lr=0.1)
    trainer = treadle.Trainer(model, work_dir=tmp_path, loss_fn=nn.CrossEntropyLoss(), optimizer=optimizer,
                              max_iters=3, progress=False, log_writers=[], preemption=False, **kw)
    errors: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # shown by the test
            errors.append(e)
    thread = threading.Thread(target=fit)
    thread.start()
    try:
        assert gate.reached.wait(60), errors
        board = boards.board()
        phase, it = boards.phase_name(board[boards.PHASE]), board[boards.ITER]
        out = io.StringIO()
        write_stack(out, sys._current_frames()[thread.ident], thread.ident)
        place = Places().read(thread_stack(out.getvalue(), thread.ident))
    finally:
        gate.go.set()
        thread.join(60)
        BlockingBackward.gate = BlockingSGD.gate = None
    assert not errors, errors
    return phase, it, place


@pytest.mark.parametrize("where, phase, it, inner, detail", [
    ("forward", "step", 0, "forward", "BlockingNet.forward"),
    ("backward", "step", 0, "backward", None),  # on CUDA the autograd engine's own thread runs the Function's backward
    ("optimizer", "step", 0, "optimizer", "BlockingSGD.step"),
    ("data", "data", 1, "", "BlockingData.__getitem__"),
    ("hook", "hooks", 0, "", "BlockingHook.after_train_iter"),
    ("checkpoint", "checkpoint", 1, "", "BlockingHook.after_train_iter.<locals>.blocking_writer"),
    ("validation", "validation", 1, "", "BlockingData.__getitem__"),
    ("before_train", "before_train", 0, "", "BlockingHook.before_train"),
    ("after_train", "after_train", 3, "", "BlockingHook.after_train"),
])
def test_the_loop_writes_its_phase_and_the_stack_says_the_rest(tmp_path, where, phase, it, inner, detail):
    """The phase and iteration come from the loops' writes on the board (no source file is
    read); forward, backward or optimizer inside a step and the user's line from the stack."""
    got_phase, got_it, place = _where_it_blocks(tmp_path, where)
    assert (got_phase, got_it) == (phase, it)
    if detail is not None:
        detail = detail if sys.version_info >= (3, 11) else detail.rsplit(".", 1)[-1]  # co_qualname came with 3.11
        assert place.detail.startswith(f"{detail}, test_watch.py:"), place
        assert place.phase == inner, place
    assert place.collective == ""


def test_a_faulthandler_dump_is_read_for_the_main_thread():
    """What faulthandler's watchdog writes (from C, GIL held or not) is parsed the same way."""
    import faulthandler
    import tempfile

    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        frames = thread_stack(f.read(), threading.get_ident())
    assert frames and frames[-1].name == "test_a_faulthandler_dump_is_read_for_the_main_thread"
    assert frames[-1].file.endswith("test_watch.py")
    assert thread_stack("Thread 0x0000000000000001 (most recent call first):\n", threading.get_ident()) is None


# -- the judgement on rank 0, over records in a store ---------------------------------------
def _board(phase: str = "step", it: int = 4, active: bool = True) -> memoryview:
    b = memoryview(bytearray(boards.SIZE)).cast("q")
    b[boards.PHASE], b[boards.ITER], b[boards.ACTIVE] = boards.PHASES.index(phase), it, int(active)
    return b


class Job:
    """Rank 0's sentinel over a HashStore, rank 0 on a board of its own, the other ranks'
    records written by hand. ``place``: where rank 0's stack says it is (in backward)."""

    def __init__(self, world: int = 3, phase: str = "step", place: Place | None = None, **kw) -> None:
        self.store = dist.HashStore()
        self.said: list[str] = []
        self.ended: list[int] = []
        self.board = _board(phase)
        kw = {"warn_s": 10.0, "timeout_s": 30.0, "period_s": 1.0, **kw}
        places = Places()
        got = place if place is not None else Place("backward")
        places.read = lambda frames: got  # type: ignore[method-assign]  # the place rank 0's stack gives
        frames = [Frame("model.py", 3, "forward")]
        self.watch = Sentinel(self.store, 0, world, self.board, take_stack=lambda: frames, places=places,
                              say=self.said.append, end_rank=lambda: self.ended.append(0), **kw)
        self.world = world

    def tick(self, now: float) -> None:
        """One look of the sentinel; rank 0's helper thread beat since the last one (its Python runs)."""
        self.board[boards.BEAT] += 1
        self.watch.tick(now)

    def warning_after(self, seconds: float) -> str:
        """The warning of a look ``seconds`` after a first one, nothing having moved."""
        self.tick(1000.0)
        self.tick(1000.0 + seconds)
        assert self.said, f"nothing said after {seconds} s"
        return self.said[0]

    def record(self, rank: int, moves: int, it: int, phase: str, inner: str = "", collective: str = "",
               detail: str = "", stack: str | None = None, blind: bool = False) -> None:
        self.store.set(f"r{rank}", json.dumps({"a": True, "it": it, "ph": phase, "f": inner, "d": detail,
                                                "c": collective, "n": moves, "b": blind, "s": True}))
        if stack is not None:
            self.store.set(f"stack{rank}", stack)


def test_the_rank_behind_is_named_with_its_stack_then_ended_and_the_waiting_ones_are_not():
    job = Job()
    # rank 0 (this sentinel's) waits in backward at iteration 5 (index 4); rank 2 too; rank 1 is in forward.
    job.record(1, 7, 4, "step", "forward", detail="Net.forward, model.py:12", stack='  File "model.py", line 12')
    job.record(2, 9, 4, "step", "backward")
    t0 = 1000.0
    job.tick(t0)
    job.tick(t0 + 9)  # nobody moved for 9 s: not yet
    assert job.said == []
    job.tick(t0 + 10.5)
    assert len(job.said) == 1, job.said
    warning = job.said[0]
    head = warning.splitlines()[0]
    assert head.startswith("stall: rank 1 has made no progress for 10 s, in forward at iteration 5 (Net.forward, "
                           "model.py:12)"), head
    assert "ranks 0 and 2 wait (in backward at iteration 5)" in head and "20 s from now" in head, head
    assert "Python stack of rank 1" in warning and 'File "model.py", line 12' in warning
    assert not job.store.check(["end"])
    job.tick(t0 + 31)  # the deadline: the end names rank 1 alone
    end = json.loads(job.store.get("end"))
    assert end["ranks"] == [1] and not end["all"], end
    assert end["line"].startswith("rank 1 made no progress for 31 s (in forward at iteration 5"), end
    assert job.ended == []  # rank 0 waits: its collective fails when rank 1 goes (or later, its sentinel ends it)


def test_a_rank_whose_python_does_not_run_is_named_so():
    job = Job(world=2)
    job.record(1, 7, 4, "step", "forward", detail="_sleep, faults.py:9", blind=True)
    assert job.warning_after(11).startswith("stall: rank 1 has made no progress for 11 s, in forward at iteration 5 ("
                                            "_sleep, "
                                  "faults.py:9); its Python does not run: native code holding the GIL?; rank 0 "
                                  "waits"), job.said


def test_the_stuck_rank_is_ended_with_its_line_in_the_error_file_once_every_rank_read_why(monkeypatch, tmp_path):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    store = dist.HashStore()
    ended: list[int] = []
    watch = Sentinel(store, 1, 2, _board(), warn_s=10.0, timeout_s=30.0, period_s=1.0,
                     end_rank=lambda: ended.append(1))
    store.set("end", json.dumps({"ranks": [1], "all": False, "line": "rank 1 made no progress", "short": "stuck",
                                 "since": 1000.0}))
    watch.tick(100.0)
    assert ended == []  # rank 0's sentinel has not read it yet (rank 0 may serve the store)
    store.set("ack0", "1")
    watch.tick(101.0)
    assert ended == [1]
    data = json.loads(error_file.read_text())
    assert data["treadle"] == "stall" and data["treadle_line"] == "rank 1 made no progress"
    # What TorchElastic's agent reads of it: the time the stall began, which makes it the first failure.
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.timestamp == 1000
    assert failure_line(1, failure) == "treadle: process of rank 1 was ended (exit code 1): rank 1 made no progress"


def test_a_waiting_rank_whose_collective_never_fails_is_ended_a_little_later():
    store = dist.HashStore()
    ended: list[int] = []
    watch = Sentinel(store, 2, 3, _board(), warn_s=10.0, timeout_s=30.0, period_s=1.0,
                     end_rank=lambda: ended.append(2))
    store.set("end", json.dumps({"ranks": [1], "all": False, "line": "rank 1 made no progress", "short": "stuck"}))
    watch.tick(100.0)
    watch.tick(105.0)
    assert ended == []
    watch.tick(111.0)
    assert ended == [2]


def test_ranks_all_asleep_at_one_place_are_ended_at_the_deadline_blaming_none():
    """Every rank stuck in forward (no collective to time out): the job ends at
    stall_timeout_s, its line says where each rank is and blames none."""
    job = Job(world=2, place=Place("forward", "_sleep, faults.py:9"))
    job.record(1, 3, 4, "step", "forward", detail="_sleep, faults.py:9")
    assert job.warning_after(11).startswith("stall: no rank has made progress for 11 s: all 2 ranks in forward at "
                                            "iteration 5 "
                                  "(_sleep, faults.py:9) (not one rank behind the others: none is blamed); the job "
                                  "ends 19 s from now"), job.said
    job.tick(1031.0)
    end = json.loads(job.store.get("end"))
    assert end["all"] and end["line"].startswith("no rank made progress for 31 s: all 2 ranks in forward at "
                                                 "iteration 5 (_sleep, faults.py:9); not one rank behind the others, "
                                                 "so none is blamed: the job is ended (stall_timeout_s=30)"), end
    job.store.set("ack1", "1")
    job.tick(1032.0)
    assert job.ended == [0]  # every rank's sentinel ends its own


def test_ranks_stuck_at_different_places_are_each_said():
    job = Job(world=3, place=Place("forward", "a, x.py:1"))
    job.record(1, 3, 4, "step", "forward", detail="b, y.py:2")
    job.record(2, 3, 4, "step", "forward", detail="a, x.py:1")
    assert job.warning_after(11).startswith("stall: no rank has made progress for 11 s: ranks 0 and 2 in forward at "
                                            "iteration 5 "
                                  "(a, x.py:1); rank 1 in forward at iteration 5 (b, y.py:2) (not one"), job.said


def test_the_judge_waits_for_the_stacks_then_goes_without():
    job = Job(world=2)
    job.store.set("r1", json.dumps({"a": True, "it": 4, "ph": "step", "f": "", "d": "", "c": "", "n": 3, "b": False,
                                    "s": False}))
    job.tick(1000.0)
    job.tick(1011.0)
    assert job.said == []  # rank 1's stack is not in yet: forward or backward is not known
    job.tick(1013.5)
    assert job.said and job.said[0].startswith("stall: rank 1 has made no progress for 14 s, in step at iteration 5")


def test_a_rank_waiting_in_a_collective_is_ahead_of_one_working_in_the_same_phase():
    job = Job(world=2, phase="checkpoint", place=Place())  # rank 0 writes the checkpoint
    job.record(1, 3, 4, "checkpoint", collective="barrier")  # rank 1 waits for it
    assert job.warning_after(11).startswith("stall: rank 0 has made no progress for 11 s, in checkpoint"), job.said


def test_a_rank_stuck_in_a_collective_inside_forward_is_behind_one_in_backward():
    job = Job(world=2)
    job.record(1, 3, 4, "step", "forward", collective="barrier")
    assert job.warning_after(11).startswith("stall: rank 1 has made no progress for 11 s, in forward at iteration 5, "
                                            "waiting "
                                  "in torch.distributed's barrier"), job.said


def test_a_stall_that_resolves_is_said_to_and_nothing_ends():
    job = Job(world=2)
    job.record(1, 3, 4, "step", "forward")
    job.tick(1000.0)
    job.tick(1012.0)
    job.record(1, 4, 5, "data")  # it moves again
    job.tick(1013.0)
    assert job.said[-1] == "stall: rank 1 moved on", job.said
    assert not job.store.check(["end"])


def test_no_run_no_judgement():
    store = dist.HashStore()
    said: list[str] = []
    watch = Sentinel(store, 0, 2, _board("run", active=False), warn_s=10.0, timeout_s=30.0, period_s=1.0,
                     say=said.append)
    store.set("r1", json.dumps({"a": False, "it": None, "ph": "run", "n": 1}))
    watch.tick(0.0)
    watch.tick(1000.0)
    assert said == [] and not store.check(["end"])


def test_the_default_deadline_comes_just_before_the_process_groups_timeout():
    store, b = dist.HashStore(), _board()
    assert Sentinel(store, 0, 2, b, warn_s=300.0, group_timeout_s=1800.0).deadline_s == pytest.approx(1792.0)
    assert Sentinel(store, 0, 2, b, warn_s=300.0, timeout_s=60.0, group_timeout_s=1800.0).deadline_s == 60.0
    short = Sentinel(store, 0, 2, b, warn_s=300.0, group_timeout_s=30.0)
    assert short.deadline_s == pytest.approx(30.0 - min(max(3 * short.period_s + 2, 5), 6))
    assert Sentinel(store, 0, 2, b, warn_s=5.0, timeout_s=None, group_timeout_s=None).deadline_s is None


def test_rank_lists_are_short():
    assert rank_list([3]) == "rank 3"
    assert rank_list([0, 2]) == "ranks 0 and 2"
    assert rank_list([0, 1, 2, 3, 7]) == "ranks 0-3 and 7"


# -- the launcher's last line ----------------------------------------------------------------
class Failure:
    def __init__(self, exitcode: int, kind: str | None, timestamp: int, line: str = "", status: int = 1,
                 job: bool = False) -> None:
        self.exitcode, self.timestamp = exitcode, timestamp
        self.error_file_data = {"treadle": kind, "treadle_line": line, "treadle_status": status,
                                "treadle_job": job} if kind is not None else {}


def test_the_launcher_blames_the_stuck_rank_then_one_with_its_own_error_then_a_silent_death():
    stall = {0: Failure(1, "stopped", 100, "stopped on rank 0"), 1: Failure(1, "stall", 120, "rank 1 made no progress")}
    rank, failure = first_failure(stall)
    assert rank == 1
    assert failure_line(rank, failure) == "treadle: process of rank 1 was ended (exit code 1): rank 1 made no progress"
    everyone = {0: Failure(1, "stall", 120, "no rank made progress", job=True),
                1: Failure(-9, "stall", 120, "no rank made progress", job=True)}
    assert failure_line(*first_failure(everyone)) == "treadle: no rank made progress"  # names no process
    silent = {0: Failure(1, "stopped", 100), 1: Failure(3, None, 100)}
    rank, failure = first_failure(silent)
    assert rank == 1 and failure_line(rank, failure) == (
        "process of rank 1 exited with status 3 and printed no Python error (os._exit, or a crash in native code?)")
    killed = {0: Failure(-9, None, 100), 1: Failure(1, "stopped", 99)}
    rank, failure = first_failure(killed)
    assert rank == 0 and failure_line(rank, failure).startswith(
        "process of rank 0 was killed by SIGKILL and printed no Python error")
    preempted = {0: Failure(-15, None, 100), 1: Failure(143, None, 100)}  # rank 0: the agent's closing SIGTERM
    rank, failure = first_failure(preempted)
    assert rank == 1 and failure_line(rank, failure) == "process of rank 1 was preempted (exit code 143)"
    own = {0: Failure(1, "error", 101, "treadle train: error: boom"), 1: Failure(1, "stopped", 100)}
    assert first_failure(own)[0] == 0
    assert failure_line(0, own[0]) == "treadle train: error: boom"


@pytest.mark.parametrize("seen", [[0, 1, 2], [2, 1, 0], [1, 0, 2]])
def test_the_launcher_says_a_configuration_error_once_with_status_2_whichever_process_ended_first(capsys, seen):
    """Every rank met the same bad mesh; one was stopped by the agent's SIGTERM before it
    wrote anything: the line is printed once, and the status is 2 in any order."""
    line = "treadle train: config error: x.yaml: dp_replicate=1 x dp_shard=3 x tp=2 = 6 process(es), but ..."
    failures = {0: Failure(2, "config", 100, line, status=2), 1: Failure(-15, None, 99),
                2: Failure(2, "config", 101, line, status=2)}
    ordered = {r: failures[r] for r in seen}
    assert say_failure(ordered) == 2
    err = capsys.readouterr().err
    assert err.count("config error") == 1 and err.strip() == line


# -- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value", [("stall_warn_s", 0), ("stall_timeout_s", -1), ("stall_warn_s", True),
                                        ("stall_timeout_s", float("nan")), ("stall_warn_s", "10")])
def test_bad_stall_settings_are_refused_in_one_line(key, value):
    from treadle.strategies.build import resolve_strategy

    with pytest.raises(ValueError, match=f"{key}=.*expected a positive number of seconds, or None") as e:
        resolve_strategy({"type": "ddp", key: value})
    assert len(str(e.value).splitlines()) == 1


class _Threads(treadle.Hook):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def after_train_iter(self, trainer, batch, outputs) -> None:
        self.names |= {t.name for t in threading.enumerate()}


def test_a_single_process_run_starts_no_watch(tmp_path):
    from treadle.distributed import comm

    seen = _Threads()
    trainer = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(16), batch_size=4),
                              loss_fn=nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1), max_iters=3,
                              progress=False, log_writers=[], hooks=[seen])
    trainer.fit()
    assert seen.names and "treadle-stall-watch" not in seen.names, seen.names
    assert comm.stall_watch() is None


def test_the_error_file_is_whole_json_or_absent_never_truncated(tmp_path, monkeypatch):
    """The agent reads the error file after the process ends; a process ended while writing it
    must not leave a truncated file (the agent then fails with a JSON traceback): it is
    written aside and renamed, so a failed write leaves the earlier file as it was."""
    from treadle.distributed import voice

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    voice.write_error_file("rank 1 made no progress", "stall", started=5.0)
    first = json.loads(path.read_text())
    assert first["treadle"] == "stall" and first["message"]["extraInfo"]["timestamp"] == "5"

    def dies(*a, **k):  # the process ended between the write and the rename
        raise OSError("killed mid-write")
    monkeypatch.setattr(voice.os, "replace", dies)
    voice.write_error_file("another line", "stopped")
    assert json.loads(path.read_text()) == first
