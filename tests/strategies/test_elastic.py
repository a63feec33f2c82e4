"""Elastic restarts: under ``torchrun --max-restarts 1``, a worker SIGKILLed in the middle
of an epoch makes the agent restart every worker; with ``resume=True`` in the script the
restarted job takes up its latest verified checkpoint by itself (no flag changed) and ends
with the weights of an uninterrupted 2-process run, bit for bit.
Runs tests/strategies/ddp_script.py (DDP on gloo, shuffled data, dropout)."""

from __future__ import annotations

import pytest
import torch

from support import wait_all
from trainer_ranks import SCRIPT, _final, _run, start_torchrun

pytestmark = pytest.mark.slow  # two torchrun jobs of 2 processes


def test_a_worker_killed_mid_epoch_is_restarted_and_resumes_from_the_latest_checkpoint(tmp_path):
    # 48 samples, batch 4 per rank, 2 ranks: 6 iterations per epoch, 12 in all; a checkpoint
    # every 3 iterations. Rank 1 kills itself after iteration 10 (the 4th of epoch 2), in
    # the first attempt only: the latest checkpoint then is iteration 9's, inside epoch 2.
    common = ["--interval", "3", "--shuffle", "--dropout", "0.2", "--resume"]
    _run(tmp_path / "ref", "--work-dir", str(tmp_path / "ref_run"), *common)
    out, work = tmp_path / "out", tmp_path / "run"
    # The agent's TCPStore, shared with the workers (torch's default since 2.5), keeps the
    # first attempt's gloo addresses: the restart may read them and fail to connect
    # (pytorch/pytorch#135712, #167288). The README tells users to switch the sharing off.
    agent = start_torchrun("--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.2",
                     SCRIPT, str(out), "--work-dir", str(work), *common, "--kill-at", "10", "--fault-attempt", "0",
                           env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    [(code, log)] = wait_all([agent])
    assert code == 0, log[-6000:]
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
