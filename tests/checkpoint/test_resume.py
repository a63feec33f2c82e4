"""Exact resume, by fault injection in subprocesses: a run killed with SIGKILL (or
stopped with SIGTERM) and resumed ends with the weights of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # training runs in subprocesses, killed and resumed

SCRIPT = Path(__file__).with_name("resume_script.py")
ROOT = Path(__file__).resolve().parents[2]


def run(work_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), str(work_dir), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def final(work_dir: Path) -> dict:
    return torch.load(work_dir / "final.pt", weights_only=True)


def assert_equal_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for part in a:
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), f"{part}.{k} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, one per variant, computed once."""
    cache: dict[str, dict] = {}

    def get(variant: str) -> dict:
        if variant not in cache:
            d = tmp_path_factory.mktemp(f"ref-{variant}")
            proc = run(d, "--variant", variant)
            assert proc.returncode == 0, proc.stderr
            cache[variant] = final(d)
        return cache[variant]
    return get


def killed_then_resumed(tmp_path: Path, *args: str, kill: str = "--kill-at", at: int = 13, variant: str = "plain") -> Path:
    first = run(tmp_path, kill, str(at), "--variant", variant, *args)
    expected = -signal.SIGKILL if kill in ("--kill-at", "--kill-in-save") else 143
    assert first.returncode == expected, first.stderr[-2000:]
    second = run(tmp_path, "--resume", "--variant", variant, *args)
    assert second.returncode == 0, second.stderr[-2000:]
    return tmp_path


@pytest.mark.parametrize("at", [4, 10, 13, 27])  # early, at an epoch boundary (10 batches/epoch), mid-epoch, late
def test_sigkill_then_resume_is_bit_exact(tmp_path, reference, at):
    killed_then_resumed(tmp_path, at=at)
    assert_equal_weights(final(tmp_path), reference("plain"))


def test_bf16_accumulation_ema_and_schedulers_resume_exactly(tmp_path, reference):
    killed_then_resumed(tmp_path, at=14, variant="full")  # inside an accumulation window of 3
    assert_equal_weights(final(tmp_path), reference("full"))


def test_iteration_based_resume_exactly(tmp_path, reference):
    killed_then_resumed(tmp_path, at=17, variant="iter")
    assert_equal_weights(final(tmp_path), reference("iter"))


def test_epoch_checkpoints_resume_exactly(tmp_path, reference):
    killed_then_resumed(tmp_path, "--by-epoch", at=15)  # the epoch-1 checkpoint, 5 iterations lost
    assert_equal_weights(final(tmp_path), reference("plain"))


def test_kill_between_checkpoints_replays_from_the_last_one(tmp_path, reference):
    killed_then_resumed(tmp_path, "--interval", "4", at=14)  # saved at 12, killed at 14
    assert_equal_weights(final(tmp_path), reference("plain"))


def test_sigterm_saves_at_the_boundary_and_exits_143(tmp_path, reference):
    killed_then_resumed(tmp_path, "--interval", "100", kill="--term-at", at=8)
    assert (tmp_path / "checkpoints" / "iter_00000008").is_dir()  # the preemption save
    assert_equal_weights(final(tmp_path), reference("plain"))


def test_kill_during_a_checkpoint_write_leaves_the_previous_one_usable(tmp_path, reference):
    # saves happen after every iteration; the 9th save is killed half-way
    killed_then_resumed(tmp_path, kill="--kill-in-save", at=9)
    assert_equal_weights(final(tmp_path), reference("plain"))


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, reference):
    first = run(tmp_path, "--kill-at", "13")
    assert first.returncode == -signal.SIGKILL
    newest = tmp_path / "checkpoints" / "iter_00000013" / "state.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit-pattern
    newest.write_bytes(bytes(data))
    truncated = tmp_path / "checkpoints" / "iter_00000012" / "state.pt"
    truncated.write_bytes(truncated.read_bytes()[:100])
    second = run(tmp_path, "--resume")
    assert second.returncode == 0, second.stderr[-2000:]
    out = second.stdout + second.stderr
    assert "iter_00000013" in out and "iter_00000012" in out  # both named in warnings
    assert "resumed from" in out and "iter_00000011" in out
    assert_equal_weights(final(tmp_path), reference("plain"))


@pytest.mark.parametrize("flag", ["--no-rng", "--no-data-pos"])
def test_negative_control_without_rng_or_data_position_is_not_exact(tmp_path, reference, flag):
    killed_then_resumed(tmp_path, flag, at=13)
    got, ref = final(tmp_path), reference("plain")
    assert any(not torch.equal(got["model"][k], ref["model"][k]) for k in ref["model"])


def test_resuming_a_finished_run_does_nothing(tmp_path):
    assert run(tmp_path).returncode == 0
    before = final(tmp_path)
    again = run(tmp_path, "--resume")
    assert again.returncode == 0
    assert "already finished" in again.stdout + again.stderr
    assert_equal_weights(final(tmp_path), before)
