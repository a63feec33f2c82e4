"""JsonlWriter: one JSON object per line, readable while the run goes on."""

from __future__ import annotations

import json

import pytest

from treadle.logging import writers
from treadle.logging.writers import JsonlWriter, read_jsonl


class Clock:
    """Stands in for time.monotonic in the writers module."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(writers.time, "monotonic", c)
    return c


def test_records_are_valid_json_and_the_first_is_on_disk_at_once(tmp_path, clock):
    path = tmp_path / "log.jsonl"
    w = JsonlWriter(path)
    rec = {"mode": "train", "iter": 50, "loss": 0.25, "lr/pg1": 1e-3, "flag": True, "note": "x", "ids": (1, 2)}
    w.write(rec)
    rec["loss"] = 99.0  # the caller reuses its dict: what was written does not change
    # Another reader sees it before close.
    assert read_jsonl(path) == [{**rec, "loss": 0.25, "ids": [1, 2]}]
    w.write({"mode": "val", "iter": 50, "val/acc": 1.0})
    w.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_records_faster_than_flush_secs_are_written_together(tmp_path, clock):
    path = tmp_path / "log.jsonl"
    w = JsonlWriter(path, flush_secs=1.0)
    w.write({"iter": 1})  # the first: at once
    clock.now += 0.4
    w.write({"iter": 2})
    clock.now += 0.4
    rec3 = {"iter": 3}
    w.write(rec3)
    rec3["iter"] = -1  # kept as a copy
    assert [r["iter"] for r in read_jsonl(path)] == [1]  # 0.8 s after the last write: kept
    clock.now += 0.2
    w.write({"iter": 4})  # 1 s after: everything kept goes out, in order
    assert [r["iter"] for r in read_jsonl(path)] == [1, 2, 3, 4]
    clock.now += 0.1
    w.write({"iter": 5})
    w.flush()
    assert [r["iter"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5]
    clock.now += 0.1
    w.write({"iter": 6})
    w.close()
    assert [r["iter"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5, 6]
    w.close()  # idempotent
    with pytest.raises(ValueError, match="after close"):
        w.write({"iter": 7})


def test_flush_secs_zero_writes_every_record_at_once(tmp_path, clock):
    path = tmp_path / "log.jsonl"
    w = JsonlWriter(path, flush_secs=0)
    for i in range(3):
        w.write({"iter": i})
        assert len(read_jsonl(path)) == i + 1
    w.close()


def test_a_record_that_is_not_json_names_itself_and_the_others_are_written(tmp_path, clock):
    path = tmp_path / "log.jsonl"
    w = JsonlWriter(path)
    w.write({"iter": 1})
    w.write({"iter": 2, "bad": object()})
    w.write({"iter": 3})
    with pytest.raises(TypeError, match="not JSON-serializable.*'iter': 2"):
        w.close()
    assert [r["iter"] for r in read_jsonl(path)] == [1, 3]


def test_non_finite_values_are_written_as_strings(tmp_path):
    w = JsonlWriter(tmp_path / "log.jsonl")
    w.write({"iter": 1, "loss": float("nan"), "grad_norm": float("inf"), "nested": {"a": float("-inf"), "b": 2.0}})
    w.close()
    text = (tmp_path / "log.jsonl").read_text()
    # Strict JSON (no bare NaN/Infinity tokens), so any reader can parse it.
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"iter": 1, "loss": "nan", "grad_norm": "inf", "nested": {"a": "-inf", "b": 2.0}}


def test_a_text_log_on_a_full_disk_is_said_once_in_one_line(capsys):
    """/dev/full: every write fails with ENOSPC. One line on stderr, no traceback, and
    closing the handler raises nothing."""
    import logging
    from pathlib import Path

    from treadle.logging.writers import add_file_handler, get_logger, remove_handler

    handler = add_file_handler(Path("/dev/full"))
    try:
        for i in range(3):
            get_logger().info(f"record {i}")
    finally:
        remove_handler(handler)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "/dev/full" in ln]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "the text log stops here" in lines[0]
    assert "Traceback" not in err and "Logging error" not in err
    assert isinstance(handler, logging.FileHandler)


def _own_logger(monkeypatch):
    """The treadle logger as a run without any other logging setup has it (pytest's root
    handlers set aside): its console handler on the stdout of the test (call it there)."""
    import logging

    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.getLogger(writers.LOGGER_NAME), "handlers", [])
    return writers.get_logger()


def _lines(text):
    import re

    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"(\d{4}-\d\d-\d\d )?(\d\d:\d\d:\d\d) INFO (.*)", line)
        assert m is not None, line
        out.append((m.group(1) is not None, m.group(3)))
    return out


def test_info_line_writes_what_logging_writes(tmp_path, capsys, monkeypatch):
    import logging

    own_logger = _own_logger(monkeypatch)
    handler = writers.add_file_handler(tmp_path / "log.txt")
    records = []
    make = logging.Logger.makeRecord
    monkeypatch.setattr(logging.Logger, "makeRecord", lambda self, *a, **k: records.append(a) or make(self, *a, **k))
    try:
        writers.info_line(own_logger, "epoch 1/3  iter 50/150  loss 1.234  50% done")  # no %-formatting
        assert records == []  # written straight to the streams, not through logging
        own_logger.info("epoch 1/3  iter 50/150  loss 1.234  50% done")
        logging.getLogger("elsewhere").info("not ours")
    finally:
        writers.remove_handler(handler)
    console = _lines(capsys.readouterr().out)
    text_log = _lines((tmp_path / "log.txt").read_text())
    assert console == [(False, "epoch 1/3  iter 50/150  loss 1.234  50% done")] * 2
    assert text_log == [(True, "epoch 1/3  iter 50/150  loss 1.234  50% done")] * 2



def test_info_line_goes_through_logging_for_any_other_setup(monkeypatch):
    import logging

    own_logger = _own_logger(monkeypatch)
    seen = []

    class Catch(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    # a handler of the application's, on the treadle logger or on the root logger; a filter
    for setup in ("handler", "root", "filter"):
        catch = Catch()
        if setup == "handler":
            own_logger.addHandler(catch)
        elif setup == "root":
            monkeypatch.setattr(logging.root, "handlers", [catch])
        else:
            own_logger.handlers[0].addFilter(lambda r: seen.append("filtered " + r.getMessage()) or True)
        writers.info_line(own_logger, setup)
        if setup == "handler":
            own_logger.removeHandler(catch)
        elif setup == "root":
            monkeypatch.setattr(logging.root, "handlers", [])
    assert seen == ["handler", "root", "filtered filter"]
