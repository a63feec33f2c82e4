"""The stall watch (treadle/distributed/watch.py) in one process: where a training thread
is, read from its stack; which rank is stuck and what the warning and the end say, on a
store of records (the jobs themselves: tests/distributed/test_fail_fast.py, slow)."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import treadle
from treadle.distributed.launch import failure_line, first_failure
from treadle.distributed.watch import Place, StallWatch, _Places, rank_list

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

    def after_train_iter(self, trainer, batch, outputs) -> None:
        if self.point == "hook":
            self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
        elif self.point == "checkpoint" and trainer.state.iter == 1:
            def blocking_writer(path, payloads, meta=None):
                self.gate.reached.set(); self.gate.go.wait(30)  # noqa: E702
                return path
            trainer.save_checkpoint(trainer.checkpoint_path("x"), writer=blocking_writer)


def _place_where_it_blocks(tmp_path, where: str) -> Place:
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
    elif where in ("hook", "checkpoint"):
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
        place = _Places().read(sys._current_frames()[thread.ident], trainer.state.mode)
    finally:
        gate.go.set()
        thread.join(60)
        BlockingBackward.gate = BlockingSGD.gate = None
    assert not errors, errors
    return place


@pytest.mark.parametrize("where, phase, detail", [
    ("forward", "forward", "BlockingNet.forward"),
    ("backward", "backward", None),  # on CUDA the autograd engine's own thread runs the Function's backward
    ("optimizer", "optimizer", "BlockingSGD.step"),
    ("data", "data", "BlockingData.__getitem__"),
    ("hook", "hooks", "BlockingHook.after_train_iter"),
    ("checkpoint", "checkpoint", "BlockingHook.after_train_iter.<locals>.blocking_writer"),
    ("validation", "validation", "BlockingData.__getitem__"),
])
def test_the_phase_is_read_from_the_training_threads_stack(tmp_path, where, phase, detail):
    place = _place_where_it_blocks(tmp_path, where)
    assert place.phase == phase, place
    if detail is not None:
        detail = detail if sys.version_info >= (3, 11) else detail.rsplit(".", 1)[-1]  # co_qualname came with 3.11
        assert place.detail.startswith(f"{detail}, test_watch.py:"), place
    assert place.collective == ""


# -- the judgement on rank 0, over records in a store ---------------------------------------
class Job:
    """Rank 0's watch over a HashStore, with the other ranks' records written by hand."""

    def __init__(self, world: int = 3, **kw) -> None:
        self.store = dist.HashStore()
        self.said: list[str] = []
        self.exits: list[int] = []
        kw = {"warn_s": 10.0, "timeout_s": 30.0, "period_s": 1.0, **kw}
        self.watch = StallWatch(self.store, 0, world, report=self.said.append, exit_process=self.exits.append, **kw)
        self.watch.follow(lambda: (4, "train", "still"))
        self.watch.set_active(True)
        self.world = world

    def record(self, rank: int, moves: int, it: int, phase: str, collective: str = "", detail: str = "",
               stack: str | None = None) -> None:
        self.store.set(f"r{rank}", json.dumps({"a": True, "it": it, "ph": phase, "d": detail, "c": collective,
                                                "n": moves}))
        if stack is not None:
            self.store.set(f"stack{rank}", stack)


def test_the_rank_behind_is_named_with_its_stack_then_ended_and_the_waiting_ones_are_not(monkeypatch, tmp_path):
    job = Job()
    # rank 0 (this watch) waits in backward at iteration 5 (index 4); rank 2 too; rank 1 is in forward.
    job.watch._places.read = lambda frame, mode: Place("backward")
    job.record(1, 7, 4, "forward", detail="Net.forward, model.py:12", stack='  File "model.py", line 12, in forward')
    job.record(2, 9, 4, "backward")
    t0 = time.monotonic()
    job.watch.tick(t0)
    job.watch.tick(t0 + 9)  # nobody moved for 9 s: not yet
    assert job.said == []
    job.watch.tick(t0 + 10.5)
    assert len(job.said) == 1, job.said
    warning = job.said[0]
    head = warning.splitlines()[0]
    assert head.startswith("stall: rank 1 has made no progress for 10 s, in forward at iteration 5 (Net.forward, "
                           "model.py:12)"), head
    assert "ranks 0 and 2 wait (in backward at iteration 5)" in head and "20 s from now" in head, head
    assert "Python stack of rank 1" in warning and 'File "model.py", line 12' in warning
    assert not job.store.check(["end"])
    job.watch.tick(t0 + 31)  # the deadline: the end names rank 1 alone
    end = json.loads(job.store.get("end"))
    assert end["ranks"] == [1] and end["line"].startswith("rank 1 made no progress for 31 s (in forward"), end
    assert job.exits == []  # rank 0 waits: its collective fails when rank 1 goes (or later, its watcher ends it)
    assert job.watch.elsewhere() == "rank 1 made no progress for 31 s (in forward at iteration 5) and the stall " \
                                    "watch ended the job"


def test_the_stuck_rank_ends_itself_with_status_1_and_tells_the_launcher(monkeypatch, tmp_path):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    store = dist.HashStore()
    exits: list[int] = []
    watch = StallWatch(store, 1, 2, warn_s=10.0, timeout_s=30.0, period_s=1.0, exit_process=exits.append)
    store.set("end", json.dumps({"ranks": [1], "line": "rank 1 made no progress", "since": 1000.0}))
    watch.tick(100.0)
    assert exits == [1]
    data = json.loads(error_file.read_text())
    assert data["treadle"] == "stall" and data["message"]["message"] == "rank 1 made no progress"
    # What TorchElastic's agent reads of it: the time the stall began, which makes it the first failure.
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.timestamp == 1000
    assert failure_line(1, failure) == "process of rank 1 was ended (exit code 1): rank 1 made no progress"


def test_a_waiting_rank_whose_collective_never_fails_is_ended_a_little_later(tmp_path):
    store = dist.HashStore()
    exits: list[int] = []
    watch = StallWatch(store, 2, 3, warn_s=10.0, timeout_s=30.0, period_s=1.0, exit_process=exits.append)
    store.set("end", json.dumps({"ranks": [1], "line": "rank 1 made no progress", "short": "rank 1 stuck"}))
    watch.tick(100.0)
    watch.tick(105.0)
    assert exits == []
    watch.tick(111.0)
    assert exits == [1]


def test_ranks_all_at_one_place_are_warned_about_and_not_ended():
    job = Job(world=2)
    job.watch._places.read = lambda frame, mode: Place("collective", collective="all_reduce")
    job.record(1, 3, 4, "collective", collective="all_reduce")
    t0 = time.monotonic()
    job.watch.tick(t0)
    job.watch.tick(t0 + 40)
    assert len(job.said) == 1 and job.said[0].startswith("stall: no rank has made progress for 40 s, all 2 in "
                                                          "collective after iteration 4, waiting in torch.distributed's "
                                                          "all_reduce"), job.said
    assert not job.store.check(["end"])


def test_a_rank_waiting_in_a_collective_is_ahead_of_one_working_in_the_same_phase():
    job = Job(world=2)
    job.watch._places.read = lambda frame, mode: Place("checkpoint")  # rank 0 writes the checkpoint
    job.record(1, 3, 4, "checkpoint", collective="barrier")  # rank 1 waits for it
    t0 = time.monotonic()
    job.watch.tick(t0)
    job.watch.tick(t0 + 11)
    assert job.said[0].startswith("stall: rank 0 has made no progress for 11 s, in checkpoint"), job.said


def test_a_rank_stuck_in_a_collective_inside_forward_is_behind_one_in_backward():
    job = Job(world=2)
    job.watch._places.read = lambda frame, mode: Place("backward")
    job.record(1, 3, 4, "forward", collective="barrier")
    t0 = time.monotonic()
    job.watch.tick(t0)
    job.watch.tick(t0 + 11)
    assert job.said[0].startswith("stall: rank 1 has made no progress for 11 s, in forward at iteration 5, waiting "
                                  "in torch.distributed's barrier"), job.said


def test_a_stall_that_resolves_is_said_to_and_nothing_ends():
    job = Job(world=2)
    job.watch._places.read = lambda frame, mode: Place("backward")
    job.record(1, 3, 4, "forward")
    t0 = time.monotonic()
    job.watch.tick(t0)
    job.watch.tick(t0 + 12)
    job.record(1, 4, 5, "data")  # it moves again
    job.watch.tick(t0 + 13)
    assert job.said[-1] == "stall: rank 1 moved on", job.said
    assert not job.store.check(["end"])


def test_no_run_no_judgement():
    job = Job(world=2)
    job.watch.set_active(False)
    job.watch._places.read = lambda frame, mode: Place("run")
    job.store.set("r1", json.dumps({"a": False, "it": None, "ph": "run", "d": "", "c": "", "n": 1}))
    job.watch.tick(0.0)
    job.watch.tick(1000.0)
    assert job.said == [] and not job.store.check(["end"])


def test_the_default_deadline_comes_just_before_the_process_groups_timeout():
    store = dist.HashStore()
    assert StallWatch(store, 0, 2, warn_s=300.0, group_timeout_s=1800.0).deadline_s == pytest.approx(1792.0)
    assert StallWatch(store, 0, 2, warn_s=300.0, timeout_s=60.0, group_timeout_s=1800.0).deadline_s == 60.0
    short = StallWatch(store, 0, 2, warn_s=300.0, group_timeout_s=30.0)
    assert short.deadline_s == pytest.approx(30.0 - min(max(3 * short.period_s + 2, 5), 6))
    assert StallWatch(store, 0, 2, warn_s=5.0, timeout_s=None, group_timeout_s=None).deadline_s is None


def test_rank_lists_are_short():
    assert rank_list([3]) == "rank 3"
    assert rank_list([0, 2]) == "ranks 0 and 2"
    assert rank_list([0, 1, 2, 3, 7]) == "ranks 0-3 and 7"


# -- the launcher's last line ----------------------------------------------------------------
class Failure:
    def __init__(self, exitcode: int, kind: str | None, timestamp: int, message: str = "") -> None:
        self.exitcode, self.timestamp, self.message = exitcode, timestamp, message
        self.error_file_data = {"treadle": kind} if kind is not None else {}


def test_the_launcher_blames_the_stuck_rank_then_one_with_its_own_error_then_a_silent_death():
    stall = {0: Failure(1, "stopped", 100), 1: Failure(1, "stall", 120, "rank 1 made no progress ...")}
    rank, failure = first_failure(stall)
    assert rank == 1
    assert failure_line(rank, failure) == "process of rank 1 was ended (exit code 1): rank 1 made no progress ..."
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
    own = {0: Failure(1, "error", 101), 1: Failure(1, "stopped", 100)}
    assert first_failure(own)[0] == 0
    assert failure_line(0, own[0]) == "process of rank 0 failed with exit code 1 (its error is shown above)"


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
    import json

    from treadle.distributed import watch

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    watch.write_error_file("rank 1 made no progress", "stall", started=5.0)
    first = json.loads(path.read_text())
    assert first["treadle"] == "stall" and first["message"]["extraInfo"]["timestamp"] == "5"

    def dies(*a, **k):  # the process ended between the write and the rename
        raise OSError("killed mid-write")
    monkeypatch.setattr(watch.os, "replace", dies)
    watch.write_error_file("another line", "stopped")
    assert json.loads(path.read_text()) == first
