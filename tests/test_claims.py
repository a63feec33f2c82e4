"""One figure per claim: what Getting started says of each example (its CPU time and its
result) is what the example's own docstring or header says. tools/check_claims.py runs
them and checks the figures themselves; tests/examples/ checks that each one learns."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_claims", ROOT / "tools" / "check_claims.py")
claims = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = claims  # its dataclass looks itself up there
spec.loader.exec_module(claims)

# Where each run states its figures: a file, and the line's start when the file states several.
SOURCES = {
    "digits": ("examples/digits/digits.yaml", ""),
    "digits-iter": ("examples/digits/digits_iter.yaml", ""),
    "digits-config": ("examples/digits/digits_config.py", ""),
    "digits-py": ("examples/digits/train.py", ""),
    "gan": ("examples/gan/gan.yaml", ""),
    "detection": ("examples/detection/train.py", ""),
    "huggingface-bert": ("examples/huggingface/train.py", "--model bert:"),
    "huggingface-gpt2": ("examples/huggingface/train.py", "--model gpt2:"),
    "custom_loop": ("examples/custom_loop/train.py", ""),
    "mmengine_style": ("examples/mmengine_style/digits_mmengine.yaml", ""),
    "lora": ("examples/lora/finetune.py", ""),
}
TIME = re.compile(claims.TIME.pattern, re.IGNORECASE)


def said(path: str, start: str) -> tuple[float | None, tuple[str, float] | None]:
    text = (ROOT / path).read_text()
    line = next(ln for ln in text.splitlines() if ln.strip(" #").startswith(start) and TIME.search(ln))
    t, r = TIME.search(line), claims.RESULT.search(line)
    return float(t.group(1)), ((r.group(1), float(r.group(2))) if r else None)


def test_every_run_of_the_checker_has_a_bullet_and_a_source():
    assert sorted(r.name for r in claims.RUNS) == sorted(SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_getting_started_and_the_example_state_the_same_figures(name):
    time, result = claims.stated(name)
    assert time is not None and result is not None, claims.bullet(name)
    assert said(*SOURCES[name]) == (time, result)


def test_make_demo_is_said_to_take_the_digits_run_s_time():
    time, _ = claims.stated("digits")
    text = claims.GETTING_STARTED.read_text()
    assert f"`runs/digits`, in under {time:g} s of CPU time after the install" in text


def test_the_snippets_state_a_cpu_time():
    for marker in ("## In Python\n", "A Hugging Face model needs no wrapper"):
        assert claims.readme_snippet(marker)[1] is not None, marker
    assert claims.readme_snippet("## A first run in Python\n", claims.GETTING_STARTED)[1] is not None


@pytest.mark.parametrize("value, figure, text, ok", [
    (0.9861, 0.99, "0.99", True), (0.984, 0.99, "0.99", False), (0.5242, 0.5, "0.5", True), (1.0, 1.0, "1.0", True)])
def test_a_result_reads_as_its_figure_to_the_digits_written(value, figure, text, ok):
    assert claims.close(value, figure, text) is ok
