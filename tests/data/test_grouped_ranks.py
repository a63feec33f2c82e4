"""An mmdet-style config (``batch_sampler=dict(type='AspectRatioBatchSampler')``) under
``treadle train --nproc 2``: rank 1 SIGKILLed in the middle of an epoch, the run resumed
from the latest checkpoint ends with the weights of the uninterrupted run, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import wait_all

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.slow]  # 2 processes on gloo, three times

TESTS = Path(__file__).resolve().parent.parent

# 40 samples, 20 per rank, batches of 3 grouped by orientation: 7 an epoch, 14 in all; a checkpoint every 3.
CONFIG = """\
model = dict(type='support.TinyNet', dropout=0.2)
loss_fn = dict(type='CrossEntropyLoss')
train_dataloader = dict(
    batch_size=3, num_workers=0, dataset=dict(type='support.make_sized_data', n=40),
    sampler=dict(type='DefaultSampler', shuffle=True), batch_sampler=dict(type='AspectRatioBatchSampler'))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9))
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=3, by_epoch=False))
randomness = dict(seed=7)
progress = False
"""


def _train(config: Path, work: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(key, None)
    proc = subprocess.Popen([sys.executable, "-m", "treadle", "train", str(config), "--work-dir", str(work),
                             "--nproc", "2", *args], env=env, cwd=work.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    [result] = wait_all([proc])
    return result


def _final(work: Path) -> dict[str, torch.Tensor]:
    return torch.load(work / "checkpoints" / "iter_00000014" / "state.pt", weights_only=True)["model"]


def test_aspect_ratio_batches_resume_after_sigkill_as_the_uninterrupted_run(tmp_path):
    config, killed = tmp_path / "det.py", tmp_path / "det_killed.py"
    config.write_text(CONFIG)
    killed.write_text(CONFIG + "custom_hooks = [dict(type='faults.SigkillAt', rank=1, at_iter=10)]\n")
    code, log = _train(config, tmp_path / "ref")
    assert code == 0, log[-6000:]
    work = tmp_path / "run"
    code, log = _train(killed, work)
    assert code != 0 and not (work / "checkpoints" / "iter_00000014").exists(), log[-6000:]
    code, log = _train(config, work, "--resume")
    assert code == 0, log[-6000:]
    assert "resumed from " + str(work / "checkpoints" / "iter_00000009") in log, log[-6000:]
    ref, got = _final(tmp_path / "ref"), _final(work)
    assert sorted(ref) == sorted(got)
    for name, w in ref.items():
        assert torch.equal(got[name], w), name
