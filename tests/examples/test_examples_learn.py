"""Each example learns in the run its file documents, run whole (so these are slow: 10 to
60 s each on a 2-core CPU; the times themselves are stated in the examples, not tested)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from treadle.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _last_val(work: Path) -> dict:
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    return [r for r in records if r["mode"] == "val"][-1]


@pytest.mark.slow
@pytest.mark.parametrize("config, key, better_than", [
    ("digits/digits.yaml", "val/acc", 0.95),                  # chance: 0.1
    ("mmengine_style/digits_mmengine.yaml", "val/acc", 0.95),  # the averaged weights, after 6 epochs
    ("gan/gan.yaml", "val/modes", 0.99),                      # every mode of the ring
])
def test_a_config_example_learns(tmp_path, config, key, better_than):
    assert main(["train", str(EXAMPLES / config), "--work-dir", str(tmp_path / "run")]) == 0
    assert _last_val(tmp_path / "run")[key] > better_than


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name, key, good", [
    ("bert", "val/acc", lambda v: v > 0.9),   # chance: 0.5
    ("gpt2", "val/loss", lambda v: v < 1.0),  # guessing: ln 64 = 4.2
])
def test_the_hugging_face_example_learns(tmp_path, name, key, good):
    pytest.importorskip("transformers")
    pytest.importorskip("torchmetrics")
    example = _module(EXAMPLES / "huggingface" / "train.py", "hf_example")
    example.build_trainer(name, tmp_path / "run", progress=False).fit()
    assert good(_last_val(tmp_path / "run")[key])
