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
from treadle import env
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


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, check=True).stdout.strip()


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_git_commit_of_the_working_directory(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found from a subdirectory too
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert len(head) == 40 and collect_env()["git commit"] == head


@needs_git
def test_git_commit_read_without_starting_git(tmp_path, monkeypatch):
    """Loose refs, packed refs, a detached HEAD and a worktree are read from the
    files; git itself is never run for them."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one")
    first = _git(repo, "rev-parse", "HEAD")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    second = _git(repo, "rev-parse", "HEAD")
    _git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "wt"), first)

    def no_git(*a, **k):
        raise AssertionError("git was started")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert env._git_commit(str(repo)) == second  # a loose ref
    assert env._git_commit(str(tmp_path / "wt")) == first  # a worktree, detached
    monkeypatch.undo()
    _git(repo, "pack-refs", "--all")
    _git(repo, "checkout", "-q", "-b", "other")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "three")
    third = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-")  # back on the packed branch
    assert not any((repo / ".git" / "refs" / "heads").glob("ma*"))  # only in packed-refs
    monkeypatch.setattr(subprocess, "run", no_git)
    assert env._git_commit(str(repo)) == second
    monkeypatch.undo()
    _git(repo, "checkout", "-q", "--detach", "other")
    monkeypatch.setattr(subprocess, "run", no_git)
    assert env._git_commit(str(repo)) == third


def test_git_failures_do_not_raise(tmp_path, monkeypatch):
    # A HEAD naming a ref that the files do not hold: only git could tell, and git fails.
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/unborn\n")
    monkeypatch.chdir(tmp_path)

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere platform.platform() itself")
def test_platform_string_is_platform_platform_without_starting_a_process(monkeypatch):
    expected = platform.platform()  # before the patch below (it starts `uname -p`)
    if platform.uname().processor not in ("", "unknown", platform.machine()):
        pytest.skip("a processor name platform.platform() includes")

    def no_process(*a, **k):
        raise AssertionError("collect_env started a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    assert env.platform_string() == expected
    info = collect_env()  # in a git checkout: read from the files, no process either
    assert info["platform"] == expected and info["treadle"] == treadle.__version__


def test_the_installed_version_is_treadle_version():
    from importlib import metadata

    try:
        installed = metadata.version("treadle")
    except metadata.PackageNotFoundError:
        pytest.skip("treadle's distribution metadata is not installed (imported from a path, not pip-installed)")
    assert installed == treadle.__version__  # pyproject reads it from there
