"""A released OpenMMLab project runs unchanged through ``treadle train``: mmpretrain 1.2.0's
``lenet5_mnist.py`` (its registries, model, data_preprocessor, datasets, pipeline, sampler and
evaluator), compared with MMEngine's own Runner on the same file, data and seed
(mm_reference.py), on 1 and 2 processes; then what treadle adds (exact resume after SIGKILL,
``treadle report``). Overrides come from the command line only, the same on both sides.

On 2 processes MMEngine logs rank 0's loss and treadle the mean over ranks, so the losses are
compared on 1 process; weights, learning rates and validation results on both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
LENET = "configs/lenet/lenet5_mnist.py"
RESNET = "configs/resnet/resnet18_8xb16_cifar10.py"
EPOCHS = ["train_cfg.max_epochs=2"]
EVERY_ITERATION = ["default_hooks.logger.interval=1", "log_processor.window_size=1"]


def treadle_train(cwd: Path, config: str, run: Path, *args: str, nproc: int = 1) -> subprocess.CompletedProcess:
    """``treadle train CONFIG --work-dir RUN --seed 0 ...`` from ``cwd`` (where the config's
    relative data paths resolve), tests/ on the path for the injected faults."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "treadle", "train", config, "--work-dir", str(run), "--seed", "0",
           *(["--nproc", str(nproc)] if nproc > 1 else []), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def records(run: Path, mode: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r["mode"] == mode]


def weights(run: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / name / "state.pt", weights_only=True)["model"]


def assert_equal_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert torch.equal(got[name], w), (name, (got[name] - w).abs().max().item())


def test_lenet_on_one_process_is_mmengines_run(mm_work, tmp_path, mmengine_lenet):
    ref = mmengine_lenet[1]
    run = tmp_path / "run"
    proc = treadle_train(mm_work, LENET, run, "--set", *EPOCHS, *EVERY_ITERATION)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = records(run, "train")
    assert [r["iter"] for r in train] == [r["iter"] for r in ref["train"]] == list(range(1, 9))
    assert [r["lr"] for r in train] == [r["lr"] for r in ref["train"]]
    assert [r["loss"] for r in train] == pytest.approx([r["loss"] for r in ref["train"]], rel=1e-6, abs=0)
    val = records(run, "val")
    assert [r["val/accuracy/top1"] for r in val] == [r["accuracy/top1"] for r in ref["val"]]
    assert_equal_weights(weights(run, "epoch_0002"), ref["state_dict"])
    assert "val/accuracy/top1" in proc.stdout  # the closing table names the evaluator's result as MMEngine does


def test_lenet_on_two_processes_is_mmengines_run(mm_work, tmp_path, mmengine_lenet):
    ref = mmengine_lenet[2]
    run = tmp_path / "run"
    proc = treadle_train(mm_work, LENET, run, "--set", *EPOCHS, *EVERY_ITERATION, nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = records(run, "train")
    assert [r["iter"] for r in train] == [r["iter"] for r in ref["train"]] == [1, 2, 3, 4]
    assert [r["lr"] for r in train] == [r["lr"] for r in ref["train"]]
    val = records(run, "val")  # the 256 test images counted once over the ranks, gathered as MMEngine gathers
    assert [r["val/accuracy/top1"] for r in val] == [r["accuracy/top1"] for r in ref["val"]]
    assert_equal_weights(weights(run, "epoch_0002"), ref["state_dict"])


def test_lenet_under_fsdp_on_two_processes_ends_with_mmengines_ddp_weights(mm_work, tmp_path, mmengine_lenet):
    """FSDP2 shards the model in place, so the model's own train_step steps it (its forward hooks
    gather the shards); the sharded checkpoint exported whole equals MMEngine's DDP run."""
    from safetensors.torch import load_file

    ref = mmengine_lenet[2]
    run = tmp_path / "run"
    proc = treadle_train(mm_work, LENET, run, "--set", *EPOCHS, "strategy=fsdp", nproc=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["val/accuracy/top1"] for r in records(run, "val")] == [r["accuracy/top1"] for r in ref["val"]]
    from treadle.cli import main

    assert main(["export", str(run / "checkpoints" / "epoch_0002"), "--out", str(tmp_path / "w.safetensors")]) == 0
    assert_equal_weights(load_file(tmp_path / "w.safetensors"), ref["state_dict"])


@pytest.mark.parametrize("nproc, kill_at, resumed_at, epochs", [
    (1, 5, "iter_00000003", 2),  # saved inside epoch 1 (4 batches an epoch), killed in epoch 2
    (2, 5, "iter_00000003", 3),  # 2 batches an epoch: saved inside epoch 2, rank 1 killed in epoch 3
])
def test_killed_and_resumed_lenet_ends_bit_for_bit_as_the_uninterrupted_run(mm_work, tmp_path, nproc, kill_at,
                                                                             resumed_at, epochs):
    options = [f"train_cfg.max_epochs={epochs}", "default_hooks.checkpoint.by_epoch=False",
               "default_hooks.checkpoint.interval=3"]
    last = f"iter_{epochs * 4 // nproc:08d}"
    ref, run = tmp_path / "ref", tmp_path / "run"
    proc = treadle_train(mm_work, LENET, ref, "--set", *options, nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    kill = f"custom_hooks=[{{type: faults.SigkillAt, rank: {nproc - 1}, at_iter: {kill_at}}}]"
    proc = treadle_train(mm_work, LENET, run, "--set", *options, kill, nproc=nproc)
    assert proc.returncode != 0 and not (run / "checkpoints" / last).exists(), proc.stdout[-3000:]
    proc = treadle_train(mm_work, LENET, run, "--resume", "--set", *options, nproc=nproc)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed from {run / 'checkpoints' / resumed_at}" in proc.stdout + proc.stderr
    assert_equal_weights(weights(run, last), weights(ref, last))
    assert [r["val/accuracy/top1"] for r in records(run, "val")][-1] == \
        [r["val/accuracy/top1"] for r in records(ref, "val")][-1]


def test_a_stuck_rank_of_a_project_is_named_and_the_job_ends(mm_work, tmp_path):
    run = tmp_path / "run"
    proc = treadle_train(mm_work, LENET, run, "--set", "train_cfg.max_epochs=2",
                         "strategy={type: ddp, stall_warn_s: 3, stall_timeout_s: 8}",
                         "custom_hooks=[{type: faults.SleepAt, rank: 1, at_iter: 2}]", nproc=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "stall: rank 1 has made no progress for 3 s" in out, out[-3000:]
    assert "rank 1 made no progress for" in [line for line in out.splitlines() if line.strip()][-1], out[-3000:]


def test_report_reads_a_projects_run(mm_work, tmp_path):
    run = tmp_path / "run"
    proc = treadle_train(mm_work, LENET, run, "--set", "train_cfg.max_epochs=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from treadle.cli import main

    assert main(["report", str(run)]) == 0
    summary = (run / "report" / "summary.md").read_text()
    assert "val/accuracy/top1" in summary


def test_resnet18_cifar10_runs_unchanged(mm_work, tmp_path):
    """The other released config of the trial: ResNet-18 with BatchNorm, a random crop and flip
    in its pipeline (treadle seeds each sample's draws: other crops than MMEngine's workers
    draw, so only the learning rate is MMEngine's here; docs/mmengine.md)."""
    run = tmp_path / "run"
    proc = treadle_train(mm_work, RESNET, run, "--set", "train_cfg.max_epochs=1", *EVERY_ITERATION)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    train = records(run, "train")
    assert len(train) == 10 and all(r["lr"] == 0.1 for r in train)  # 160 images, 16 a batch; SGD lr 0.1
    assert 0 <= records(run, "val")[-1]["val/accuracy/top1"] <= 100
