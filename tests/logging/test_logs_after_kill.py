"""After SIGKILL anywhere and a resume, log.jsonl, log.csv and what TensorBoard shows hold
exactly the records of the uninterrupted run: every record logged before a checkpoint is
durable when that checkpoint commits (LoggerHook.before_save_checkpoint), and the resumed
run rewrites those after it (TensorBoard: hides them, TensorBoardWriter.drop_after)."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("log_kill_run.py")
TIMING = ("_time", "_per_s", "eta_s", "timestamp", "resumed_at")  # per process, not per record


def _run(work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(work), *extra], capture_output=True, text=True,
                          timeout=300)


def _jsonl(work: Path) -> list[dict]:
    rows = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in rows]


def _csv(work: Path) -> list[dict]:
    with open(work / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in rows]


def _tensorboard(work: Path) -> list[tuple[str, int, float]]:
    """Every scalar TensorBoard shows of the run, read as TensorBoard reads the directory:
    (tag, step, value) in the order of each tag's events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(work / "tensorboard"))
    ea.Reload()
    return [(tag, e.step, e.value) for tag in sorted(ea.Tags()["scalars"]) if not tag.endswith(TIMING)
            for e in ea.Scalars(tag)]


@pytest.mark.slow  # subprocesses
def test_log_files_equal_the_uninterrupted_runs_after_kills_anywhere(tmp_path):
    whole = tmp_path / "whole"
    assert _run(whole).returncode == 0
    expected_jsonl, expected_csv, expected_tb = _jsonl(whole), _csv(whole), _tensorboard(whole)
    assert len({(tag, step) for tag, step, _ in expected_tb}) == len(expected_tb) > 12 + 4
    assert len(expected_jsonl) == 12 + 4  # 36 / 3 train records, validation at 10, 20, 30, 36
    # Kills right after a checkpoint (7, 14), between a save and the next record (8, 16), at a
    # validation (20), two checkpoints on (29): resumed from the newest each time.
    for kill_at in (7, 8, 14, 16, 20, 29):
        work = tmp_path / f"cut{kill_at}"
        killed = _run(work, "--kill-at", str(kill_at))
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        resumed = _run(work, "--resume")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert _jsonl(work) == expected_jsonl, kill_at
        assert _csv(work) == expected_csv, kill_at
        assert _tensorboard(work) == expected_tb, kill_at
