"""tools/gpu_check.py and tools/gpu_resume.py, dry-run on the CPU (the GPU check itself
runs on a machine with CUDA: make test-gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_resume_after_sigkill_is_bit_exact_and_a_changed_run_is_told(tmp_path):
    cmd = [sys.executable, str(ROOT / "tools" / "gpu_resume.py"), "--device", "cpu", "--precision", "32",
           "--iters", "10", "--save-every", "5", "--kill-at", "7"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and result["equal"] and result["tensors"] > 20, proc.stdout + proc.stderr
    # Negative control: a resumed run trained further than the uninterrupted one differs.
    proc = subprocess.run([*cmd[:-2], "--kill-at", "7", "--resume-extra", "2"], capture_output=True, text=True,
                          timeout=600)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 1 and not result["equal"] and result["differ"], proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_check_prints_a_table_of_its_steps(tmp_path):
    skip = ["fast-tier", "tests/gpu", "resume-fp16", "resume-ddp-bf16", "resume-fsdp", "resume-compile", "gpt2"]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu", "--out",
                           str(tmp_path), "--skip", *skip], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (tmp_path / "summary.md").read_text()
    assert "| resume-bf16 | ok | bit-exact, " in table
    assert "| overhead | ok | " in table and "us/step on" in table
    assert table.rstrip().splitlines()[-1].startswith("| total | ok |")
    assert (tmp_path / "resume-bf16.log").is_file() and (tmp_path / "overhead.log").is_file()


def test_without_cuda_the_gpu_check_says_so_and_stops(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a machine with CUDA runs the check itself")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device; run it on a machine with a GPU, or pass --device cpu for a dry run" in proc.stdout
