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


# -- benchmarks/peers_compare.py: the same robustness tests for every engine ---------------
@pytest.fixture
def compare(monkeypatch):
    """benchmarks/peers_compare.py as a module (it puts benchmarks/ and peers_engines/ on the path)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    names = ("peers_compare_bench", "peers_common", "peers_faults")
    spec = importlib.util.spec_from_file_location("peers_compare_bench", ROOT / "benchmarks" / "peers_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name in names:
        sys.modules.pop(name, None)


def test_kill_points_fall_inside_an_epoch_after_a_checkpoint_inside_one(compare):
    pc = compare.pc
    points = compare.kill_points()
    assert points and len(set(points)) == len(points)
    for k in points:
        last = k // pc.CKPT_EVERY * pc.CKPT_EVERY
        assert k % pc.ITERS_PER_EPOCH and last % pc.ITERS_PER_EPOCH and 0 < last < k < pc.TOTAL_ITERS


def _job(seconds=None, left=0, named=None, cap=600.0):
    job = {"ended": seconds is not None, "cap_s": cap, "status": 1 if seconds is not None else None, "left": left}
    if seconds is not None:
        job["seconds"] = seconds
    if named is not None:
        job.update(named=True, named_after_s=named)
    return job


def test_the_verdicts_from_made_up_results(compare):
    trials = [{"kill_at": 6, "equal": True, "max_diff": 0.0}, {"kill_at": 9, "equal": False, "max_diff": 0.125}]
    trusted = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    results = {
        "a": {"resume": {"repeats": {"equal": True, "max_diff": 0.0}, "trials": trials[:1]},
              "fail": [_job(1.2), _job(2.0), _job(1.6)],
              "hang": {"default": _job(named=300.4), "short": _job(34.6, named=10.2)},
              "pickle": {"trials": [{"file": "c/state.pt", "env": {}, "ran_code": False, "resumed": False}]}},
        "b": {"resume": {"repeats": {"equal": False, "max_diff": 0.5},
                         "trials": [dict(trials[1], default_load="exit 1", env=trusted)]},
              "fail": [_job(3.0, left=1)],
              "hang": {"default": _job(), "short": _job(31.0, left=1)},
              "pickle": {"trials": [{"file": "x.pt", "env": {}, "ran_code": False, "resumed": False},
                                    {"file": "x.pt", "env": trusted, "ran_code": True, "resumed": True}]}},
    }
    assert compare.resume_cell(results["a"]["resume"]) == "bit-equal in 1 of 1 trials"
    assert compare.resume_cell(results["b"]["resume"]) == (
        "not bit-equal in 1 of 1 trials, largest difference 0.125; loads its own checkpoint only with "
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1; two uninterrupted runs differ by 0.5")
    assert compare.job_cell(results["a"]["fail"]) == "ended in 1.6 s (1.2-2), status 1, 0 processes left"
    assert compare.job_cell([results["b"]["hang"]["default"]], hang=True) == \
        "not ended within 600 s; the stuck rank not named"
    cells = compare.short_cells(results, ["a", "b"])
    assert cells["resume"] == {"a": "bit-equal (1/1)", "b": "differs by up to 0.125 (1/1) *"}
    assert cells["fail"] == {"a": "ends in 2 s, status 1, none left", "b": "ends in 3 s, status 1, 1 left running"}
    assert cells["hang"] == {"a": "not within 600 s; rank 1 named at 300 s", "b": "not within 600 s; not named"}
    assert cells["hang_short"]["a"] == "ends in 35 s, status 1, none left; rank 1 named at 10 s"
    assert cells["pickle"] == {"a": "refused", "b": "refused * (runs it with the switch)"}


@pytest.mark.slow  # fresh processes: a kill and a resume, 2 processes raising, a pickled file
def test_treadle_through_the_harness(tmp_path):
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "peers_compare.py"), "--engines", "treadle", "--rows",
           "resume,fail,pickle", "--trials", "1", "--fail-trials", "1", "--cap", "120", "--json", str(out),
           "--silent", "--keep", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    results = json.loads(out.read_text())
    assert results["readme"]["resume"]["treadle"] == "bit-equal (1/1)"
    assert results["readme"]["fail"]["treadle"].startswith("ends in ") and "none left" in results["readme"]["fail"]["treadle"]
    assert results["readme"]["pickle"]["treadle"] == "refused"
    assert not list((tmp_path / "runs").rglob("marker-*"))  # no payload ran
