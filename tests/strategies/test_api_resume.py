"""The public Strategy API in a hand-written loop: SIGKILLed mid-epoch and resumed, it
ends bit for bit where an uninterrupted run ends, on one process and on two (DDP, FSDP
on gloo). Negative controls: without the RNG or the loader's place restored, it does not.
Runs tests/strategies/custom_loop_script.py in subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import fsdp_on_cpu, run_ranks

pytestmark = pytest.mark.slow  # subprocesses, some with 2 ranks
SCRIPT = str(Path(__file__).parent / "custom_loop_script.py")


def _run(strategy: str, work: Path, out: Path, *args: str, expect: int = 0) -> None:
    cmd = [strategy, str(work), str(out), *args]
    if strategy == "single":
        proc = subprocess.run([sys.executable, SCRIPT, *cmd], capture_output=True, text=True, timeout=300)
        results = [(proc.returncode, proc.stdout + proc.stderr)]
    else:
        results = run_ranks(SCRIPT, cmd, nproc=2, timeout=300)
    for rank, (code, output) in enumerate(results):
        assert code == expect, f"rank {rank} exited {code}, expected {expect}:\n{output[-4000:]}"


def _equal(a: dict, b: dict) -> bool:
    return a["iter"] == b["iter"] and all(
        torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"]) and all(
        torch.equal(a["optim_state"][p][k], b["optim_state"][p][k])
        for p in a["optim_state"] for k in a["optim_state"][p])


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


# A checkpoint every 5 iterations puts one inside an accumulation window (accumulative_counts=2),
# whose gradients are then part of the state. FSDP restarts an open window on resume (its
# gradients are shards), so its checkpoints are taken where windows close.
CASES = [("single", "5"), ("ddp", "5"), pytest.param("fsdp", "4", marks=fsdp_on_cpu)]


@pytest.mark.parametrize("strategy,every", CASES)
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, strategy, every):
    _run(strategy, tmp_path / "a", tmp_path / "a.pt", "--save-every", every)
    _run(strategy, tmp_path / "b", tmp_path / "b.pt", "--save-every", every, "--kill-at", "7", expect=-9)
    assert not (tmp_path / "b.pt").exists()
    _run(strategy, tmp_path / "b", tmp_path / "b.pt", "--save-every", every)  # resume=True finds iter_0005/0004
    a, b = _load(tmp_path / "a.pt"), _load(tmp_path / "b.pt")
    assert a["iter"] == (72 if strategy == "single" else 36)  # 3 epochs of 96 samples, batch 4 per rank
    assert _equal(a, b)


@pytest.mark.parametrize("control", ["no-rng", "no-loader"])
def test_negative_control_without_rng_or_loader_place_differs(tmp_path, control):
    _run("single", tmp_path / "a", tmp_path / "a.pt")
    _run("single", tmp_path / "b", tmp_path / "b.pt", "--kill-at", "7", expect=-9)
    _run("single", tmp_path / "b", tmp_path / "b.pt", "--control", control)
    assert not _equal(_load(tmp_path / "a.pt"), _load(tmp_path / "b.pt"))
