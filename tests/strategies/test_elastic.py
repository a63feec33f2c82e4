"""Elastic restarts: under ``torchrun --max-restarts 1``, a worker SIGKILLed in the middle
of an epoch makes the agent restart every worker; with ``resume=True`` in the script the
restarted job takes up its latest verified checkpoint by itself (no flag changed) and ends
with the weights of an uninterrupted 2-process run, bit for bit.
Runs tests/strategies/ddp_script.py (DDP on gloo, shuffled data, dropout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer_ranks import SCRIPT, _final, _run

pytestmark = pytest.mark.slow  # two torchrun jobs of 2 processes


def _torchrun(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_worker_killed_mid_epoch_is_restarted_and_resumes_from_the_latest_checkpoint(tmp_path):
    # 48 samples, batch 4 per rank, 2 ranks: 6 iterations per epoch, 12 in all; a checkpoint
    # every 3 iterations. Rank 1 kills itself after iteration 10 (the 4th of epoch 2), in
    # the first attempt only: the latest checkpoint then is iteration 9's, inside epoch 2.
    common = ["--interval", "3", "--shuffle", "--dropout", "0.2", "--resume"]
    _run(tmp_path / "ref", "--work-dir", str(tmp_path / "ref_run"), *common)
    out, work = tmp_path / "out", tmp_path / "run"
    proc = _torchrun("--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.2",
                     SCRIPT, str(out), "--work-dir", str(work), *common, "--kill-at", "10", "--fault-attempt", "0")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "failed (exitcode: -9) local_rank: 1" in log, log[-6000:]  # attempt 0: rank 1 died of SIGKILL
    assert "resumed from " + str(work / "checkpoints" / "iter_00000009") in log, log[-6000:]
    for rank in range(2):
        result = torch.load(out / f"result_rank{rank}.pt", weights_only=True)
        assert result["resumed_at"] == 9, result  # the restarted attempt, from iteration 9's checkpoint
        assert result["iter"] == 12 and result["world_size"] == 2
    saved = sorted(p.name for p in (work / "checkpoints").iterdir())
    assert saved == [f"iter_{i:08d}" for i in (3, 6, 9, 12)], saved
    ref, got = _final(tmp_path / "ref"), _final(out)
    assert sorted(ref) == sorted(got)
    for name, w in ref.items():
        assert torch.equal(got[name], w), name
