"""log.jsonl and log.csv across runs: a run resumed from a checkpoint leaves the files (and
what TensorBoard shows) equal to the uninterrupted run's (the interrupted run's records after the checkpoint are
dropped, not written twice); a fresh run in a work_dir that holds an earlier run's
files moves those aside instead of appending to them."""

from __future__ import annotations

import csv
import json

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import JsonlWriter, read_jsonl
from treadle.logging.backends import CsvWriter
from treadle.logging.writers import written_after
from treadle.seeding import seed_everything

from faults import Crash, CrashAt
from support import TinyNet, make_data

# Values that differ from one process to the next (wall clock, timings).
PER_RUN = {"timestamp", "data_time", "step_time", "samples_per_s", "eta_s", "max_memory_mb", "resumed_at"}


def _trainer(work_dir, hooks=(), resume=False, batch_size=6, **kw):
    seed_everything(0)
    args = dict(work_dir=work_dir, train_dataloader=DataLoader(make_data(30), batch_size=batch_size, shuffle=True),
                val_dataloader=DataLoader(make_data(12, seed=1), batch_size=6), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="AdamW", lr=3e-3), max_epochs=3, seed=0, log_interval=2,
                log_writers=("jsonl", "csv"), progress=False, resume=resume, hooks=list(hooks))
    args.update(kw)
    return treadle.Trainer(TinyNet(dropout=0.2), **args)


def _records(work_dir):
    return [{k: v for k, v in r.items() if k not in PER_RUN} for r in read_jsonl(work_dir / "log.jsonl")]


def _tensorboard(work_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows the run's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(work_dir / "tensorboard"))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]
            if tag.split("/", 1)[1] not in PER_RUN}


ALL_WRITERS = dict(log_writers=("jsonl", "csv", "tensorboard"))


def _csv(work_dir):
    with open(work_dir / "log.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = [{k: v for k, v in row.items() if k not in PER_RUN} for row in reader]
        return [k for k in reader.fieldnames or [] if k != "resumed_at"], rows


ITERS = dict(max_epochs=None, max_iters=15, val_interval=5, checkpoint=dict(interval=5, by_epoch=False))
# Train records every 2 iterations: counted inside the epoch when epoch-based (MMEngine's rule), over the run else.
EVERY_2 = [2, 4, 6, 8, 10, 12, 14, 15]
RUNS = {
    # 5 iterations an epoch; saved after epoch 1 (iter 5), before its validation; lost at 8
    "epochs": (dict(checkpoint=dict(interval=1)), [2, 4, 7, 9, 12, 14, 15]),
    # 8 iterations an epoch; saved at 5, before the validation at 5; lost at 8
    "iters": (dict(batch_size=4, **ITERS), EVERY_2),
    # 5 iterations an epoch: the checkpoint at 5 is taken in the epoch's last iteration
    "iters-epoch-end": (ITERS, EVERY_2),
}


@pytest.mark.parametrize("kw, train_iters", RUNS.values(), ids=RUNS.keys())
def test_log_files_after_a_crash_and_resume_equal_the_uninterrupted_runs(tmp_path, kw, train_iters):
    ref, run = tmp_path / "ref", tmp_path / "run"
    kw = dict(kw, **ALL_WRITERS)
    _trainer(ref, **kw).fit()
    with pytest.raises(Crash):
        _trainer(run, hooks=[CrashAt(8)], **kw).fit()
    before_crash = [("train", i) for i in train_iters if i <= 8]
    assert [(r["mode"], r["iter"]) for r in _records(run)] == before_crash[:2] + [("val", 5)] + before_crash[2:]
    assert [step for step, _ in _tensorboard(run)["val/loss"]] == [5]
    _trainer(run, resume=True, **kw).fit()

    expected = _records(ref)
    assert [(r["mode"], r["iter"]) for r in expected if r["mode"] == "val"] == [("val", 5), ("val", 10), ("val", 15)]
    assert [r["iter"] for r in expected if r["mode"] == "train"] == train_iters
    assert _records(run) == expected  # losses, lr, epochs and val metrics, record for record
    assert _csv(run) == _csv(ref)
    assert _tensorboard(run) == _tensorboard(ref)  # the validation at 5 once, the records after 5 once
    assert not list(run.glob("log.*.jsonl"))  # a resume moves nothing aside


def test_a_resume_that_finds_no_checkpoint_leaves_the_files_of_an_uninterrupted_run(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    kw = dict(ITERS, checkpoint=False, **ALL_WRITERS)
    _trainer(ref, **kw).fit()
    with pytest.raises(Crash):  # killed before its first save
        _trainer(run, hooks=[CrashAt(8)], **kw).fit()
    assert [r["iter"] for r in _records(run) if r["mode"] == "train"] == [2, 4, 6, 8]
    _trainer(run, resume=True, **kw).fit()  # nothing to resume: from scratch
    assert _records(run) == _records(ref) and _csv(run) == _csv(ref)
    assert _tensorboard(run) == _tensorboard(ref)  # one run: the killed start's events hidden, not beside
    assert not [p for p in (run / "tensorboard").iterdir() if p.is_dir()] and not list(run.glob("log.*.jsonl"))
    assert not any("resumed_at" in r for r in read_jsonl(run / "log.jsonl"))


def test_a_val_record_at_the_checkpoint_stays_when_no_validation_was_due_there():
    train_at, val_at = {"mode": "train", "iter": 5}, {"mode": "val", "iter": 5}
    assert not written_after(train_at, 5, val_due=True) and written_after(val_at, 5, val_due=True)
    assert not written_after(val_at, 5, val_due=False) and not written_after(train_at, 5, val_due=False)
    assert written_after({"mode": "train", "iter": "6"}, 5, False)  # a CSV cell
    assert not written_after({"mode": "val", "iter": 4}, 5, True) and not written_after({"mode": "x"}, 5, True)


def test_drop_after_rewrites_both_files_and_leaves_a_torn_last_line_out(tmp_path):
    records = [{"mode": "train", "iter": 2, "loss": 1.0}, {"mode": "val", "iter": 4, "val/acc": 0.5},
               {"mode": "train", "iter": 4, "loss": 0.5}, {"mode": "train", "iter": 6, "loss": 0.25}]
    jw, cw = JsonlWriter(tmp_path / "log.jsonl"), CsvWriter(tmp_path / "log.csv")
    for r in records:
        jw.write(r)
        cw.write(r)
    jw.close()
    cw.close()
    with open(tmp_path / "log.jsonl", "a", encoding="utf-8") as f:
        f.write('{"mode": "train", "it')  # a process killed in the middle of a write
    jw, cw = JsonlWriter(tmp_path / "log.jsonl"), CsvWriter(tmp_path / "log.csv")
    assert jw.drop_after(4, val_due=True) == 2 and cw.drop_after(4, val_due=True) == 2
    jw.write({"mode": "val", "iter": 4, "val/acc": 0.75})
    cw.write({"mode": "val", "iter": 4, "val/acc": 0.75})
    jw.close()
    cw.close()
    assert [(r["mode"], r["iter"]) for r in read_jsonl(tmp_path / "log.jsonl")] == [
        ("train", 2), ("train", 4), ("val", 4)]
    with open(tmp_path / "log.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["iter"], r["val/acc"]) for r in rows] == [("train", "2", ""), ("train", "4", ""),
                                                                    ("val", "4", "0.75")]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


FRESH = dict(max_epochs=None, max_iters=6, val_interval=3)


def test_a_fresh_run_moves_an_earlier_runs_log_files_aside(tmp_path):
    one, ref = tmp_path / "one", tmp_path / "ref"
    _trainer(ref, **FRESH).fit()
    _trainer(one, optimizer=dict(type="SGD", lr=0.5), **FRESH).fit()  # an earlier, different run
    earlier_jsonl, earlier_csv = _records(one), _csv(one)
    _trainer(one, **FRESH).fit()  # a new run, not resumed

    assert _records(one) == _records(ref) and _csv(one) == _csv(ref)  # this run's records alone
    (old_jsonl,), (old_csv,) = list(one.glob("log.*.jsonl")), list(one.glob("log.*.csv"))
    assert old_jsonl.name[len("log."):-len(".jsonl")] == old_csv.name[len("log."):-len(".csv")]  # one time stamp
    assert [{k: v for k, v in r.items() if k not in PER_RUN} for r in read_jsonl(old_jsonl)] == earlier_jsonl
    with open(old_csv, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert (reader.fieldnames, [{k: v for k, v in r.items() if k not in PER_RUN} for r in reader]) == earlier_csv

    _trainer(one, **FRESH).fit()  # a third run: the second one's files go aside too, under another name
    assert len(list(one.glob("log.*.jsonl"))) == 2 and len(list(one.glob("log.*.csv"))) == 2


def test_records_of_a_validate_before_fit_stay_with_their_run(tmp_path):
    _trainer(tmp_path, **FRESH).fit()  # an earlier run
    t = _trainer(tmp_path, **FRESH)
    t.validate()  # this trainer's first record, at iteration 0
    t.fit()
    records = read_jsonl(tmp_path / "log.jsonl")
    assert [(r["mode"], r["iter"]) for r in records] == [("val", 0), ("train", 2), ("val", 3), ("train", 4),
                                                         ("train", 6), ("val", 6)]
    (old,) = tmp_path.glob("log.*.jsonl")
    assert [(r["mode"], r["iter"]) for r in read_jsonl(old)] == [("train", 2), ("val", 3), ("train", 4),
                                                                 ("train", 6), ("val", 6)]
    with open(tmp_path / "log.csv", newline="", encoding="utf-8") as f:
        assert [(r["mode"], r["iter"]) for r in csv.DictReader(f)] == [(m, str(i)) for m, i in
                                                                       [("val", 0), ("train", 2), ("val", 3),
                                                                        ("train", 4), ("train", 6), ("val", 6)]]


def test_validate_alone_appends_to_the_runs_log(tmp_path):
    _trainer(tmp_path, **FRESH).fit()
    before = read_jsonl(tmp_path / "log.jsonl")
    _trainer(tmp_path, **FRESH).validate()  # e.g. an evaluation of the finished run
    after = read_jsonl(tmp_path / "log.jsonl")
    assert after[:-1] == before and after[-1]["mode"] == "val" and not list(tmp_path.glob("log.*.jsonl"))
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])["iter"] == 0


def test_a_validate_before_the_resumed_fit_keeps_its_record(tmp_path):
    kw, _ = RUNS["iters"]
    kw = dict(kw, **ALL_WRITERS)
    ref, run = tmp_path / "ref", tmp_path / "run"
    _trainer(ref, **kw).fit()
    with pytest.raises(Crash):
        _trainer(run, hooks=[CrashAt(8)], **kw).fit()
    t = _trainer(run, resume=True, **kw)
    t.validate()  # from the checkpoint at 5: this trainer's own record, before its fit
    t.fit()
    expected = [("train", 2), ("train", 4), ("val", 5)] + [(r["mode"], r["iter"]) for r in _records(ref)][2:]
    assert [(r["mode"], r["iter"]) for r in _records(run)] == expected
    # TensorBoard: the uninterrupted run's scalars, and this trainer's validation at 5 besides the fit's.
    ref_tb, run_tb = _tensorboard(ref), _tensorboard(run)
    assert {k: v for k, v in run_tb.items() if not k.startswith("val/")} == {
        k: v for k, v in ref_tb.items() if not k.startswith("val/")}
    assert {k: v for k, v in run_tb.items() if k.startswith("val/")} == {
        k: v[:1] + v for k, v in ref_tb.items() if k.startswith("val/")}


def _tensorboard_at(log_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows the event files of ``log_dir`` itself."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]
            if tag.split("/", 1)[1] not in PER_RUN}


def test_a_fresh_run_moves_an_earlier_runs_event_files_aside(tmp_path):
    """TensorBoard reads a directory's event files as one run: a fresh run's events must not
    land among an earlier run's, which then show under their own run (a subdirectory)."""
    pytest.importorskip("tensorboard")
    one, ref = tmp_path / "one", tmp_path / "ref"
    _trainer(ref, **FRESH, **ALL_WRITERS).fit()
    _trainer(one, optimizer=dict(type="SGD", lr=0.5), **FRESH, **ALL_WRITERS).fit()  # an earlier, different run
    earlier = _tensorboard(one)
    assert earlier != _tensorboard(ref)  # else the test could not tell the runs apart
    _trainer(one, **FRESH, **ALL_WRITERS).fit()  # a new run, not resumed

    assert _tensorboard(one) == _tensorboard(ref)  # this run's events alone
    (aside,) = [p for p in (one / "tensorboard").iterdir() if p.is_dir()]
    (old_jsonl,) = one.glob("log.*.jsonl")
    assert aside.name == old_jsonl.name[len("log."):-len(".jsonl")]  # one time stamp for all of the earlier run
    assert _tensorboard_at(aside) == earlier

    _trainer(one, **FRESH, **ALL_WRITERS).fit()  # a third run: the second one's go aside too, under another name
    assert len([p for p in (one / "tensorboard").iterdir() if p.is_dir()]) == 2
    assert _tensorboard(one) == _tensorboard(ref)


def test_a_validate_before_fit_keeps_its_events_apart_from_an_earlier_runs(tmp_path):
    pytest.importorskip("tensorboard")
    _trainer(tmp_path, **FRESH, **ALL_WRITERS).fit()  # an earlier run
    t = _trainer(tmp_path, **FRESH, **ALL_WRITERS)
    t.validate()  # this trainer's first record, at iteration 0
    t.fit()
    shown = _tensorboard(tmp_path)
    assert [step for step, _ in shown["val/loss"]] == [3, 6]
    assert [step for step, _ in shown["train/loss"]] == [2, 4, 6]
    dirs = sorted(p.name for p in (tmp_path / "tensorboard").iterdir() if p.is_dir())
    assert len(dirs) == 2 and dirs[1] == "val"  # the earlier run's (a time stamp), and the validate's
    assert [step for step, _ in _tensorboard_at(tmp_path / "tensorboard" / dirs[0])["val/loss"]] == [3, 6]
    assert [step for step, _ in _tensorboard_at(tmp_path / "tensorboard" / "val")["val/loss"]] == [0]


def test_validate_alone_keeps_its_events_apart_from_the_runs(tmp_path):
    """An evaluation of a finished run lies at step 0 (no training state loaded): among the
    run's events, TensorBoard's Rust reader would let it preempt the run's val/ curve."""
    pytest.importorskip("tensorboard")
    _trainer(tmp_path, **FRESH, **ALL_WRITERS).fit()
    run = _tensorboard(tmp_path)
    _trainer(tmp_path, **FRESH, **ALL_WRITERS).validate()
    _trainer(tmp_path, **FRESH, **ALL_WRITERS).validate()  # a second one joins the first
    assert _tensorboard(tmp_path) == run
    assert [step for step, _ in _tensorboard_at(tmp_path / "tensorboard" / "val")["val/loss"]] == [0, 0]
    assert [r["mode"] for r in read_jsonl(tmp_path / "log.jsonl")][-2:] == ["val", "val"]  # log.jsonl appends


def test_a_validate_before_fit_in_a_new_work_dir_stays_with_the_run(tmp_path):
    pytest.importorskip("tensorboard")
    t = _trainer(tmp_path, **FRESH, **ALL_WRITERS)
    t.validate()
    t.fit()
    assert [step for step, _ in _tensorboard(tmp_path)["val/loss"]] == [0, 3, 6]
    assert not [p for p in (tmp_path / "tensorboard").iterdir() if p.is_dir()]


def _rust(log_dir, run="."):
    """{tag: [(step, value), ...]} of one run as TensorBoard's Rust data server shows it."""
    from tb_rust import rust_scalars

    return {tag: series for tag, series in rust_scalars(log_dir).get(run, {}).items()
            if tag.split("/", 1)[1] not in PER_RUN}


@pytest.mark.slow  # starts TensorBoard's data server
def test_tensorboards_rust_reader_shows_the_same(tmp_path):
    """TensorBoard's default reader drops events by its own rule (a lower step preempts
    the same tag's later ones; it ignores the SessionLog.START a resume writes): after a
    crash and resume, a fresh run over an earlier one, and an evaluation of a finished
    run, it shows the uninterrupted run as EventAccumulator does."""
    pytest.importorskip("tensorboard")
    kw, _ = RUNS["iters"]
    kw = dict(kw, **ALL_WRITERS)
    ref, run = tmp_path / "ref", tmp_path / "run"
    _trainer(ref, **kw).fit()
    expected = _rust(ref / "tensorboard")
    assert expected == _tensorboard(ref) and expected["val/loss"]

    with pytest.raises(Crash):
        _trainer(run, hooks=[CrashAt(8)], **kw).fit()
    _trainer(run, resume=True, **kw).fit()
    assert _rust(run / "tensorboard") == expected

    _trainer(run, **kw).validate()  # weights alone, iteration 0
    assert _rust(run / "tensorboard") == expected
    assert [step for step, _ in _rust(run / "tensorboard", "val")["val/loss"]] == [0]

    _trainer(run, optimizer=dict(type="SGD", lr=0.5), **kw).fit()  # a fresh, different run over it
    again = _trainer(run, **kw)
    again.fit()
    assert _rust(run / "tensorboard") == expected
