"""collect_env reports versions, devices, seed and git commit, and never fails."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys

import numpy
import pytest
import torch

import treadle
from treadle.env import collect_env, format_env


def test_versions_seed_and_world_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git repository
    info = collect_env(seed=7, world_size=4)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
    assert info["python"] == platform.python_version() and info["torch"] == torch.__version__
    assert info["numpy"] == numpy.__version__ and info["treadle"] == treadle.__version__
    assert info["seed"] == "7" and info["world size"] == "4"
    assert info["torch threads"] == str(torch.get_num_threads())
    assert info["CUDA available"] == str(torch.cuda.is_available())
    if torch.cuda.is_available():
        assert any(k.startswith("GPU 0") and v == torch.cuda.get_device_name(0) for k, v in info.items())
    assert info["git commit"] == "not a git repository"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_commit_of_the_working_directory(tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "x")
    monkeypatch.chdir(tmp_path)
    head = git("rev-parse", "HEAD")
    assert len(head) == 40 and collect_env()["git commit"] == head


def test_git_failures_do_not_raise(monkeypatch):
    def hang(*a, **k):
        raise subprocess.TimeoutExpired(cmd="git", timeout=2)

    monkeypatch.setattr(subprocess, "run", hang)
    assert collect_env()["git commit"] == "unavailable"

    def missing(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", missing)
    assert collect_env()["git commit"] == "unavailable"


def test_format_env_aligns_values():
    text = format_env({"python": "3.11.9", "world size": "2", "a": sys.platform})
    lines = text.splitlines()
    body = lines[1:-1]
    assert lines[0].startswith("-") and lines[-1] == lines[0] and len(body) == 3
    starts = {line.index(v) for line, v in zip(body, ("3.11.9", "2", sys.platform))}
    assert starts == {len("world size") + 2}
    assert "python" in format_env(collect_env())
