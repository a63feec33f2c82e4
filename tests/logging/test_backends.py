"""CSV, TensorBoard, MLflow and wandb writers: files parse back to what was written."""

from __future__ import annotations

import csv
import math
import sys

import pytest
from torch import nn
from torch.utils.data import DataLoader

import treadle
from treadle.logging import read_jsonl
from treadle.logging.backends import CsvWriter, MlflowWriter, TensorBoardWriter, WandbWriter, scalars

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
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoardWriter(tmp_path)


@pytest.mark.parametrize("cls,package", [(MlflowWriter, "mlflow"), (WandbWriter, "wandb")])
def test_missing_tracker_package_says_what_to_install(tmp_path, monkeypatch, cls, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed, installed or not
    with pytest.raises(ImportError, match=f"'{package}' package.*pip install {package}"):
        cls(tmp_path)
    assert not (tmp_path / "mlruns").exists()


def test_mlflow_offline_store(tmp_path, records):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    w = MlflowWriter(tmp_path, run_name="t")
    for r in records:
        w.write(r)
    w.close()
    history = MlflowClient(tracking_uri=w.tracking_uri).get_metric_history(w.run_id, "val/acc")
    expected = [(r["iter"], r["val/acc"]) for r in records if r["mode"] == "val"]
    assert [(m.step, m.value) for m in history] == pytest.approx(expected)


def test_wandb_offline_run(tmp_path, records):
    pytest.importorskip("wandb")
    w = WandbWriter(tmp_path, project="treadle-test")
    for r in records:
        w.write(r)
    w.close()
    assert (tmp_path / "wandb").is_dir()
