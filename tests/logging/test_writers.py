"""JsonlWriter: one JSON object per line, readable while the run goes on."""

from __future__ import annotations

import json

from treadle.logging.writers import JsonlWriter, read_jsonl


def test_records_are_valid_json_and_on_disk_at_once(tmp_path):
    w = JsonlWriter(tmp_path / "log.jsonl")
    rec = {"mode": "train", "iter": 50, "loss": 0.25, "lr/pg1": 1e-3, "flag": True, "note": "x", "ids": (1, 2)}
    w.write(rec)
    # Flushed per record: another reader sees it before close (a crash loses nothing written).
    assert read_jsonl(tmp_path / "log.jsonl") == [{**rec, "ids": [1, 2]}]
    w.write({"mode": "val", "iter": 50, "val/acc": 1.0})
    w.close()
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_non_finite_values_are_written_as_strings(tmp_path):
    w = JsonlWriter(tmp_path / "log.jsonl")
    w.write({"iter": 1, "loss": float("nan"), "grad_norm": float("inf"), "nested": {"a": float("-inf"), "b": 2.0}})
    w.close()
    text = (tmp_path / "log.jsonl").read_text()
    # Strict JSON (no bare NaN/Infinity tokens), so any reader can parse it.
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"iter": 1, "loss": "nan", "grad_norm": "inf", "nested": {"a": "-inf", "b": 2.0}}
