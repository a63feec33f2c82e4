"""benchmarks/peers.py keeps working: its table from made-up results (fast), and a short run
of the hand loop and treadle in fresh processes (slow), whose losses must agree."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def peers(monkeypatch):
    """benchmarks/peers.py as a module; the path entry and modules it adds are undone after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("peers_run", "gpt2"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("peers_bench", ROOT / "benchmarks" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in ("peers_run", "gpt2"):
        sys.modules.pop(name, None)


def _run(steady_s: float, loss: float, whole_s: float = 2.0) -> dict:
    return {"version": "9.9", "steady_s": steady_s, "steady_steps": 10, "whole_s": whole_s, "loss": loss,
            "threads": 1, "cudnn_benchmark": False}


def test_table_ratios_per_repetition_missing_runners_and_a_loss_that_differs(peers):
    results = {"mlp": {
        "hand": [_run(0.010, 1.5), _run(0.020, 1.5, 4.0)],
        "treadle": [_run(0.011, 1.5), _run(0.024, 1.5, 6.0)],   # ratios 1.1 and 1.2 -> median 1.15
        "lightning": [_run(0.030, 1.7), _run(0.030, 1.7)],      # trained something else
        "mmengine": [{"missing": "mmengine"}],
        "accelerate": [{"error": "exit 1: RuntimeError: boom"}, {"error": "exit 1: RuntimeError: boom"}],
    }}
    results["gpt2"] = {"hand": [_run(0.010, 5.0)], "treadle": []}  # the time budget ran out before treadle
    args = argparse.Namespace(device="cpu")
    rows = peers.table(results, args, {"mlp": (5, 10), "gpt2": (1, 2)})
    by_runner = {row.split(" | ")[1]: row for row in rows if row.startswith("| ") and " | " in row[2:]}
    treadle = by_runner["treadle 9.9"].split(" | ")
    assert treadle[2] == "1.750 (1.100-2.400)"        # steady ms/step: median (min-max) of 1.1 and 2.4 ms
    assert treadle[3] == "1.150 (1.100-1.200)"        # x hand, per repetition
    assert treadle[5] == "1.25 (1.00-1.50)"           # whole fit: 2/2 and 6/4
    assert treadle[7].strip(" |") == "0"
    assert "(!)" in by_runner["Lightning 9.9"]
    assert "not installed" in by_runner["MMEngine"]
    assert "failed: exit 1: RuntimeError: boom" in by_runner["Accelerate"]
    assert any("mlp/lightning: loss 1.7" in row for row in rows)
    assert rows[-3].startswith("|  | treadle | not run (the time budget ran out) |"), rows
    assert not any("treadle" in row and "loss" in row for row in rows[-1:])


@pytest.mark.slow
def test_quick_run_of_the_hand_loop_and_treadle_trains_the_same_thing():
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--device", "cpu", "--runners", "hand,treadle",
           "--workloads", "mlp,gpt2", "--reps", "1", "--warmup", "2", "--steps", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [row.split(" | ") for row in out.stdout.splitlines() if row.startswith("| ") and "treadle" in row]
    assert len(rows) == 2, out.stdout
    for row in rows:
        assert float(row[2]) > 0 and float(row[3]) > 0          # ms/step and its ratio to the hand loop
        assert float(row[7].strip(" |")) <= 1e-3, row            # the loss after 6 steps, against the hand loop's
    assert "(!)" not in out.stdout and "failed" not in out.stdout, out.stdout
