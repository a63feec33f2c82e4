"""A resumed run's TensorBoard events: what TensorBoard shows (its own EventAccumulator
reading the directory) equals the uninterrupted run's, record for record, after a resume
from any position, several resumes, a torn last frame, and event files whose names sort
the wrong way (TensorBoardWriter.drop_after)."""

from __future__ import annotations

import os

import pytest

from treadle.logging.backends import TensorBoardWriter
from treadle.logging.writers import written_after

pytest.importorskip("tensorboard")

VALS = (10, 20, 30, 36)


def _records(stale: float = 0.0) -> list[dict]:
    """The records of a 36-iteration run in the order LoggerHook writes them: train every 3
    iterations and at the last, a validation at 10, 20, 30 and 36. ``stale``: added to every
    value, to tell an interrupted run's records after its checkpoint from the resumed run's."""
    out = []
    for i in range(1, 37):
        if i % 3 == 0 or i == 36:
            out.append({"mode": "train", "epoch": 1, "iter": i, "loss": 1.0 / i + stale, "lr": 0.1 + stale})
        if i in VALS:
            out.append({"mode": "val", "epoch": 1, "iter": i, "val/acc": i / 100 + stale})
    return out


def _shown(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows of ``log_dir``: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def _write(log_dir, records) -> TensorBoardWriter:
    w = TensorBoardWriter(log_dir, flush_secs=0)
    for r in records:
        w.write(r)
    return w


def _killed(log_dir, iteration: int, val_due: bool, extra: int, keep: int = 0, resumed_from=None) -> None:
    """A run that resumes (from ``resumed_from``, or starts afresh) and is killed after
    writing every record before the checkpoint at (``iteration``, ``val_due``) and the
    next ``extra`` records after it (with stale values); ``keep``: records before the resume."""
    records = _records()
    before = [r for r in records if not written_after(r, iteration, val_due)]
    after = [r for r in _records(stale=1000.0) if written_after(r, iteration, val_due)][:extra]
    if resumed_from is None:
        w = _write(log_dir, before + after)
    else:
        w = _resumed(log_dir, *resumed_from, upto=(iteration, val_due), keep=keep)
        for r in after:
            w.write(r)
    w.sync()  # what was written before the kill is on disk; the writer is never closed


def _resumed(log_dir, iteration: int, val_due: bool, upto=None, keep: int = 0) -> TensorBoardWriter:
    """A run resumed from (``iteration``, ``val_due``): it purges, then writes the records
    after that position (up to the position ``upto``, or to the end)."""
    w = TensorBoardWriter(log_dir, flush_secs=0)
    w.drop_after(iteration, val_due, keep_last=keep)
    for r in _records():
        if written_after(r, iteration, val_due) and (upto is None or not written_after(r, *upto)):
            w.write(r)
    return w


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("whole")
    _write(log_dir, _records()).close()
    return _shown(log_dir)


@pytest.mark.parametrize("iteration,val_due,extra", [
    (14, False, 3),  # train records after the checkpoint, and the validation at 20
    (30, True, 2),  # saved before the validation at 30: that validation is written again, the train record at 30 not
    (30, False, 2),  # saved after it: both stay
    (20, True, 0),  # killed right after the save
    (7, False, 20),  # killed at the end of the run, before its last save
])
def test_after_a_kill_and_a_resume_tensorboard_shows_the_uninterrupted_runs_scalars(
        tmp_path, whole, iteration, val_due, extra):
    _killed(tmp_path, iteration, val_due, extra)
    w = _resumed(tmp_path, iteration, val_due)
    w.close()
    assert _shown(tmp_path) == whole
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2


def test_resumes_one_after_another_and_twice_from_one_checkpoint(tmp_path, whole):
    _killed(tmp_path, 21, False, 4)  # killed at 26, the last checkpoint at 21
    _killed(tmp_path, 30, True, 3, resumed_from=(21, False))  # resumed, killed after 31 (after the val at 30)
    _killed(tmp_path, 30, True, 1, resumed_from=(30, True))  # resumed from 30, killed again from it
    _resumed(tmp_path, 30, True).close()
    assert _shown(tmp_path) == whole


def test_drop_after_hides_and_counts_only_events_after_the_position(tmp_path):
    _killed(tmp_path, 30, True, 3)  # the validation at 30 and train records at 33, 36 after the save
    w = TensorBoardWriter(tmp_path, flush_secs=0)
    assert w.drop_after(30, val_due=True) == 3
    size = w.path.stat().st_size
    assert w.drop_after(30, val_due=True) == 0  # nothing shown after the position: nothing written
    assert w.drop_after(36, val_due=False) == 0 and w.path.stat().st_size == size
    w.close()
    shown = _shown(tmp_path)
    assert shown["val/acc"] == [(10, pytest.approx(0.1)), (20, pytest.approx(0.2))]
    assert [step for step, _ in shown["train/loss"]] == list(range(3, 31, 3))


def test_a_run_that_validated_before_resuming_keeps_its_own_records(tmp_path, whole):
    _killed(tmp_path, 14, False, 4)
    own = {"mode": "val", "epoch": 1, "iter": 16, "val/acc": 0.5}  # a validate() before fit(), as LoggerHook counts
    _write(tmp_path, [own]).close()
    w = TensorBoardWriter(tmp_path, flush_secs=0)
    assert w.drop_after(14, val_due=False, keep_last=1) == 4  # train at 15, 18, 21 and the validation at 20
    for r in _records():
        if written_after(r, 14, False):
            w.write(r)
    w.close()
    shown = _shown(tmp_path)
    assert shown["val/acc"] == [(10, pytest.approx(0.1)), (16, 0.5), (20, pytest.approx(0.2)), (30, pytest.approx(0.3)),
                                (36, pytest.approx(0.36))]  # in the order written: its own record first
    assert {k: v for k, v in shown.items() if k not in ("val/acc", "val/epoch")} == {
        k: v for k, v in whole.items() if k not in ("val/acc", "val/epoch")}


def test_a_torn_last_frame_of_the_killed_run_is_passed_over(tmp_path, whole):
    _killed(tmp_path, 14, False, 3)
    (first,) = tmp_path.glob("events.out.tfevents.*")
    frame = first.read_bytes()[-60:]
    with open(first, "ab") as f:
        f.write(frame[:25])  # a write cut short by the kill
    _resumed(tmp_path, 14, False).close()
    assert _shown(tmp_path) == whole


@pytest.mark.parametrize("extra", [3, 0])  # events to hide, or none (read in order all the same)
def test_the_resumed_runs_file_is_renamed_to_be_read_last(tmp_path, whole, extra):
    """An interrupted run's file whose name sorts after the resumed run's (made in the same
    second by another process, or a clock set back)."""
    _killed(tmp_path, 14, False, extra)
    (first,) = tmp_path.glob("events.out.tfevents.*")
    later = first.name.split(".")
    later[3] = "9" + later[3][1:]
    os.rename(first, tmp_path / ".".join(later))
    w = _resumed(tmp_path, 14, False)
    assert sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))[-1] == w.path.name
    w.close()
    assert _shown(tmp_path) == whole


def test_a_processs_event_files_sort_in_the_order_they_were_made(tmp_path, monkeypatch):
    """TensorBoard reads a directory's files in name order: a process's 10th writer of a
    second must sort after its 9th (the counter in the name is zero-padded)."""
    import itertools

    from treadle.logging import backends
    from treadle.logging.event_files import event_file_names

    monkeypatch.setattr(backends, "_file_counter", itertools.count(9))
    made = [TensorBoardWriter(tmp_path, flush_secs=0) for _ in range(3)]  # counters 9, 10, 11
    for w in made:
        w.close()
    assert event_file_names(tmp_path) == [w.path.name for w in made]
