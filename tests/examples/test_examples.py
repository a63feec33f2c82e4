"""Every example runs, for a few iterations, through the command line or its script."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from treadle.checkpoint.io import find_latest_checkpoint, load_checkpoint
from treadle.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def train(tmp_path, config, *overrides):
    work = tmp_path / "run"
    assert main(["train", str(EXAMPLES / config), "--work-dir", str(work), "--set", *overrides]) == 0
    records = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    return work, yaml.safe_load((work / "config.yaml").read_text()), records


def test_digits_yaml(tmp_path):
    work, cfg, records = train(tmp_path, "digits/digits.yaml", "max_epochs=1")
    val = [r for r in records if r["mode"] == "val"]
    assert len(val) == 1 and val[0]["val/acc"] > 0.5  # one epoch already learns something
    assert cfg["model"] == {"type": "DigitsCNN", "num_classes": 10} and cfg["optimizer"]["lr"] == 2e-3


def test_digits_iter_yaml_warms_up(tmp_path):
    work, cfg, records = train(tmp_path, "digits/digits_iter.yaml", "max_iters=6", "log_interval=2", "val_interval=6",
                               "checkpoint.interval=3")
    assert cfg["max_epochs"] is None and cfg["max_iters"] == 6  # the base's max_epochs switched off
    lrs = [r["lr"] for r in records if r["mode"] == "train"]
    assert len(lrs) == 3 and lrs == sorted(lrs) and lrs[-1] < 2e-3  # LinearLR warmup from 0.1 * lr
    assert find_latest_checkpoint(work / "checkpoints").name == "iter_00000006"
    assert [r["iter"] for r in records if r["mode"] == "val"] == [6]


def test_digits_python_config(tmp_path):
    _, cfg, records = train(tmp_path, "digits/digits_config.py", "max_epochs=1")
    assert cfg["model"] == {"type": "DigitsCNN", "num_classes": 10, "width": 16}  # class saved by name
    assert cfg["optimizer"] == {"type": "SGD", "lr": 0.05, "momentum": 0.9, "nesterov": True}  # _delete_: replaced
    assert cfg["schedulers"][0]["type"] == "CosineAnnealingLR"


def test_gan_two_optimizers_and_custom_step(tmp_path):
    work, cfg, records = train(tmp_path, "gan/gan.yaml", "max_iters=6", "log_interval=3", "checkpoint.interval=3")
    train_records = [r for r in records if r["mode"] == "train"]
    assert len(train_records) == 2
    assert {"loss_disc", "loss_gen", "lr/gen", "lr/disc"} <= set(train_records[-1])
    state = load_checkpoint(find_latest_checkpoint(work / "checkpoints"))["state.pt"]
    assert set(state["optim"]) == {"gen", "disc"}
    (val,) = [r for r in records if r["mode"] == "val"]  # the model's val_step: the modes it covers
    assert val["iter"] == 6 and 0.0 <= val["val/modes"] <= 1.0


def test_gan_script(tmp_path):
    spec = importlib.util.spec_from_file_location("gan_train", EXAMPLES / "gan" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    coverage = module.main(["--work-dir", str(tmp_path / "gan"), "--set", "max_iters=4"])
    assert 0.0 <= coverage <= 1.0 and (tmp_path / "gan" / "config.yaml").is_file()


def test_mmengine_style(tmp_path):
    work, cfg, records = train(tmp_path, "mmengine_style/digits_mmengine.yaml", "train_cfg.max_epochs=1")
    assert "optim_wrapper" not in cfg and cfg["optimizer"]["paramwise"] == {"norm_decay_mult": 0.0,
                                                                           "bias_decay_mult": 0.0}
    assert cfg["ema"] == {"momentum": 0.99, "gamma": 100, "convention": "mmengine"}
    assert cfg["checkpoint"]["best"] == "val/acc"
    (val,) = [r for r in records if r["mode"] == "val"]
    assert val["val/acc"] > 0.5  # the run its file suggests learns (the averaged weights too)
    assert (work / "checkpoints" / "best").is_dir()  # save_best -> best
    # The saved config is treadle's own and runs as it is.
    assert main(["train", str(work / "config.yaml"), "--work-dir", str(tmp_path / "again")]) == 0


@pytest.mark.parametrize("config", ["digits/digits.yaml", "digits/digits_iter.yaml", "digits/digits_config.py",
                                    "gan/gan.yaml", "mmengine_style/digits_mmengine.yaml"])
def test_example_configs_resolve_for_training(config):
    from treadle.config import build_trainer, load_config

    build_trainer(load_config(EXAMPLES / config, mode="train"))  # every component builds


@pytest.mark.slow
def test_digits_train_script_still_works(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "digits" / "train.py"), "--epochs", "1", "--work-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "val acc" in proc.stdout


@pytest.mark.slow  # subprocesses
def test_custom_loop_example_one_process_then_continued(tmp_path):
    script = str(EXAMPLES / "custom_loop" / "train.py")
    run = [sys.executable, script, "--work-dir", str(tmp_path / "run"), "--save-every", "30"]
    first = subprocess.run([*run, "--epochs", "1"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "epoch 1/1  iter 45" in first.stdout
    second = subprocess.run([*run, "--epochs", "2"], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "epoch_001" in second.stdout  # the log goes to stdout
    assert "epoch 2/2  iter 90" in second.stdout and "epoch 1/" not in second.stdout
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["epoch_001", "epoch_002", "iter_000030", "iter_000060", "iter_000090"]


@pytest.mark.slow  # 2 processes through torchrun
def test_custom_loop_example_under_torchrun(tmp_path):
    script = str(EXAMPLES / "custom_loop" / "train.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", script,
                           "--work-dir", str(tmp_path / "run"), "--epochs", "1"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})  # gloo: 1 GPU is not 2
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 1 and "iter 23" in lines[0]  # 45 batches split over 2 ranks; rank 0 prints
    acc = float(lines[0].rsplit(" ", 1)[1])
    assert acc > 0.5
