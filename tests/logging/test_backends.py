"""CSV, TensorBoard, MLflow and wandb writers: files parse back to what was written."""

from __future__ import annotations

import csv
import math
import sys
import time

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import read_jsonl
from treadle.logging.backends import CsvWriter, MlflowWriter, TensorBoardWriter, WandbWriter, scalars
from treadle.logging.event_files import frame, masked_crc32c

from support import TinyNet, make_data


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The log.jsonl records of a real two-epoch run (train every 2 iterations, val per epoch)."""
    work = tmp_path_factory.mktemp("run")
    t = treadle.Trainer(TinyNet(), work_dir=work, train_dataloader=DataLoader(make_data(16), batch_size=4),
                        val_dataloader=DataLoader(make_data(8, seed=1), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                        optimizer=dict(type="SGD", lr=0.1), max_epochs=2, log_interval=2,
                        metrics={"acc": treadle.Accuracy()})
    t.fit()
    recs = read_jsonl(work / "log.jsonl")
    assert {r["mode"] for r in recs} == {"train", "val"}
    return recs


def test_scalars_prefix_mode_once_and_skip_non_numeric():
    rec = {"mode": "val", "epoch": 2, "iter": 8, "val/acc": 0.5, "loss": 1.0, "note": "x", "flag": True, "bad": "nan"}
    assert scalars(rec) == {"val/epoch": 2.0, "val/acc": 0.5, "val/loss": 1.0}


def test_csv_rows_parse_and_header_grows(tmp_path, records):
    path = tmp_path / "log.csv"
    w = CsvWriter(path)
    for r in records:
        w.write(r)
    w.write({"mode": "train", "epoch": 3, "iter": 99, "loss": math.nan, "extra": [1, 2]})
    w.close()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records) + 1
    header = list(rows[0])
    union = list(dict.fromkeys(k for r in records for k in r))
    assert header[:len(union)] == union and header[-1] == "extra"
    for row, rec in zip(rows, records):
        for k in header:
            if k not in rec:
                assert row[k] == ""  # e.g. a val row has no "lr", a train row no "val/acc"
            elif isinstance(rec[k], float):
                assert float(row[k]) == pytest.approx(rec[k], rel=1e-12)
            else:
                assert row[k] == str(rec[k])
    assert math.isnan(float(rows[-1]["loss"])) and rows[-1]["extra"] == "[1, 2]"
    # Reopening appends under the existing header; a new key widens it again.
    w = CsvWriter(path)
    w.write({"mode": "val", "epoch": 3, "iter": 100, "val/new": 7})
    w.close()
    with open(path, newline="") as f:
        rows2 = list(csv.DictReader(f))
    assert len(rows2) == len(rows) + 1 and rows2[-1]["val/new"] == "7" and rows2[0]["val/new"] == ""
    assert rows2[:-1] == [dict(r, **{"val/new": ""}) for r in rows]
    assert not (tmp_path / "log.csv.tmp").exists()


def test_tensorboard_scalars_read_back(tmp_path, records):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = TensorBoardWriter(tmp_path / "tb")
    for r in records:
        w.write(r)
    w.write({"mode": "train", "epoch": 1, "iter": 1000, "note": "text is skipped"})
    w.close()
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/data_time", "val/acc", "val/loss"} <= tags
    assert not any(t.startswith("val/val/") or t.endswith("/mode") or "note" in t for t in tags)
    for mode, key, tag in (("train", "loss", "train/loss"), ("train", "lr", "train/lr"),
                           ("val", "val/acc", "val/acc"), ("val", "val/loss", "val/loss")):
        expected = [(r["iter"], r[key]) for r in records if r["mode"] == mode]
        got = [(e.step, e.value) for e in ea.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in expected]
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_tensorboard_missing_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoardWriter(tmp_path)


def _scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir))
    ea.Reload()
    return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_tensorboard_events_are_kept_until_flush_secs_then_written_in_one_go(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    w = TensorBoardWriter(tmp_path, flush_secs=10)
    for i in range(1, 200):
        w.write({"mode": "train", "iter": 50 * i, "loss": 1.0 / i})
    assert _scalars(tmp_path) == {}  # nothing written before flush_secs
    clock[0] += 10
    w.write({"mode": "train", "iter": 50 * 200, "loss": 1.0 / 200})
    got = _scalars(tmp_path)["train/loss"]  # readable before close()
    assert [s for s, _ in got] == [50 * i for i in range(1, 201)]
    assert [v for _, v in got] == pytest.approx([1.0 / i for i in range(1, 201)])
    w.write({"mode": "val", "iter": 10000, "val/acc": 0.5})
    w.close()
    w.close()  # idempotent
    assert _scalars(tmp_path)["val/acc"] == [(10000, 0.5)]
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    with pytest.raises(ValueError, match="after close"):
        w.write({"mode": "train", "iter": 1, "loss": 1.0})


def test_csv_header_of_a_new_file_then_widened_after_rows_were_written(tmp_path):
    path = tmp_path / "log.csv"
    w = CsvWriter(path, flush_secs=0)
    w.write({"mode": "train", "iter": 1, "loss": 0.5})  # an empty file: header and row appended
    assert path.read_text().splitlines() == ["mode,iter,loss", "train,1,0.5"]
    w.write({"mode": "val", "iter": 1, "val/acc": 0.25})  # a new column: rewritten, rows kept
    w.write({"mode": "train", "iter": 2, "loss": 0.25})
    w.close()
    assert path.read_text().splitlines() == ["mode,iter,loss,val/acc", "train,1,0.5,", "val,1,,0.25",
                                             "train,2,0.25,"]


def test_csv_rows_are_kept_until_flush_secs(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    w = CsvWriter(tmp_path / "log.csv", flush_secs=10)
    record = {"mode": "train", "iter": 1, "loss": 0.5}
    w.write(record)
    record["loss"] = 9.0  # the writer kept a copy
    assert (tmp_path / "log.csv").read_text() == ""
    clock[0] += 10
    w.write({"mode": "val", "iter": 1, "val/acc": 0.25})
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"mode": "train", "iter": "1", "loss": "0.5", "val/acc": ""},
                    {"mode": "val", "iter": "1", "loss": "", "val/acc": "0.25"}]
    w.close()
    with pytest.raises(ValueError, match="after close"):
        w.write(record)


def test_tensorboard_frames_match_tensorboards_own_record_writer():
    """Byte for byte what tensorboard's RecordWriter frames (length, masked CRC32C)."""
    import io

    from tensorboard.summary.writer.record_writer import RecordWriter

    data = b"\x00\x01 some serialized event \xff" * 7
    buf = io.BytesIO()
    RecordWriter(buf).write(data)
    assert frame(data) == buf.getvalue()


def test_masked_crc32c_equals_tensorboards():
    import os

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tensorboards

    for n in (0, 1, 7, 8, 9, 255, 300, 4097):
        data = os.urandom(n)
        assert masked_crc32c(data) == tensorboards(data)


def test_tensorboard_write_error_is_raised_to_the_caller(tmp_path):
    class Full:
        closed = False

        def write(self, data):
            raise OSError("disk full")

        def flush(self):
            pass

        def close(self):
            self.closed = True

    w = TensorBoardWriter(tmp_path, flush_secs=0)
    w._file.close()
    w._file = Full()
    with pytest.raises(OSError, match="disk full"):
        w.write({"mode": "train", "iter": 1, "loss": 1.0})
    w.close()


def test_two_tensorboard_writers_of_one_process_use_two_files(tmp_path):
    a, b = TensorBoardWriter(tmp_path), TensorBoardWriter(tmp_path)
    a.close()
    b.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2


@pytest.mark.parametrize("cls,package", [(MlflowWriter, "mlflow"), (WandbWriter, "wandb")])
def test_missing_tracker_package_says_what_to_install(tmp_path, monkeypatch, cls, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed, installed or not
    with pytest.raises(ImportError, match=f"'{package}' package.*pip install {package}"):
        cls(tmp_path)
    assert not (tmp_path / "mlruns").exists()


# The MLflow and W&B writers against the real packages: tests/logging/test_trackers.py.
