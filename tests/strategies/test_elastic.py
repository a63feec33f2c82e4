"""Elastic restarts: under ``torchrun --max-restarts 1``, a worker SIGKILLed in the middle
of an epoch makes the agent restart every worker; with ``resume=True`` in the script the
restarted job takes up its latest verified checkpoint by itself (no flag changed) and ends
with the weights of an uninterrupted 2-process run, bit for bit.
Runs tests/strategies/ddp_script.py (DDP on gloo, shuffled data, dropout). The same
through treadle's own launcher: ``treadle train CONFIG --nproc 2 --max-restarts 1``, where
the restart resumes without ``--resume`` (TORCHELASTIC_RESTART_COUNT > 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import wait_all
from trainer_ranks import SCRIPT, _final, _run, start_torchrun

pytestmark = pytest.mark.slow  # two torchrun jobs of 2 processes

TESTS = Path(__file__).resolve().parent.parent


def test_a_worker_killed_mid_epoch_is_restarted_and_resumes_from_the_latest_checkpoint(tmp_path):
    # 48 samples, batch 4 per rank, 2 ranks: 6 iterations per epoch, 12 in all; a checkpoint
    # every 3 iterations. Rank 1 kills itself after iteration 10 (the 4th of epoch 2), in
    # the first attempt only: the latest checkpoint then is iteration 9's, inside epoch 2.
    common = ["--interval", "3", "--shuffle", "--dropout", "0.2", "--resume"]
    _run(tmp_path / "ref", "--work-dir", str(tmp_path / "ref_run"), *common)
    out, work = tmp_path / "out", tmp_path / "run"
    # The agent's TCPStore, shared with the workers (torch's default since 2.5), keeps the
    # first attempt's gloo addresses: the restart may read them and fail to connect
    # (pytorch/pytorch#135712, #167288). docs/distributed.md tells users to switch the sharing off.
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


# 48 samples, batch 4 per rank, 2 ranks: 6 iterations per epoch, 12 in all; a checkpoint every 3.
ELASTIC_CONFIG = """\
model: {type: support.TinyNet, dropout: 0.2}
train_dataloader:
  dataset: {type: support.make_data, n: 48}
  batch_size: 4
  shuffle: true
loss_fn: {type: CrossEntropyLoss}
optimizer: {type: SGD, lr: 0.1, momentum: 0.9}
max_epochs: 2
checkpoint: {interval: 3, by_epoch: false}
log_interval: 2
log_writers: [jsonl]
seed: 7
"""


def _treadle_train(config, work, *args: str) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",  # gloo: a GPU machine's one GPU is not two
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        env.pop(key, None)  # the launcher sets the store option itself
    proc = subprocess.Popen([sys.executable, "-m", "treadle", "train", str(config), "--work-dir", str(work),
                             "--nproc", "2", *args], env=env, cwd=work.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    [result] = wait_all([proc])
    return result


def _weights(work) -> dict[str, torch.Tensor]:
    return torch.load(work / "checkpoints" / "iter_00000012" / "state.pt", weights_only=True)["model"]


def test_treadle_train_max_restarts_restarts_a_killed_worker_which_resumes_by_itself(tmp_path):
    """`treadle train CONFIG --nproc 2 --max-restarts 1`, no --resume: rank 1 SIGKILLed after
    iteration 10 of attempt 0 (the latest checkpoint: iteration 9's, inside epoch 2); the
    launcher restarts both, the restart resumes from that checkpoint (TORCHELASTIC_RESTART_COUNT
    makes `treadle train` resume as --resume does), and the job ends with exit 0 and the
    weights of an uninterrupted `--nproc 2` run, bit for bit. The launcher unshares the
    rendezvous store itself (pytorch/pytorch#135712): nothing is exported here."""
    config = tmp_path / "elastic.yaml"
    config.write_text(ELASTIC_CONFIG)
    code, log = _treadle_train(config, tmp_path / "ref")
    assert code == 0, log[-6000:]
    work = tmp_path / "run"
    code, log = _treadle_train(config, work, "--max-restarts", "1",
                               "--set", "hooks=[{type: faults.SigkillAt, rank: 1, at_iter: 10, attempt: 0}]")
    assert code == 0, log[-6000:]
    assert "restart 1 of an elastic job: resuming from the latest verified checkpoint" in log, log[-6000:]
    assert "resumed from " + str(work / "checkpoints" / "iter_00000009") in log, log[-6000:]
    assert "epoch 2/2  iter 10/12" in (work / "log.txt").read_text()  # attempt 0 got past the checkpoint
    saved = sorted(p.name for p in (work / "checkpoints").iterdir())
    assert saved == [f"iter_{i:08d}" for i in (6, 9, 12)], saved  # keep=3 by default
    ref, got = _weights(tmp_path / "ref"), _weights(work)
    assert sorted(ref) == sorted(got)
    for name, w in ref.items():
        assert torch.equal(got[name], w), name

