"""The treadle command: console script and ``python -m treadle``."""

from __future__ import annotations

import subprocess
import sys

import torch

from treadle.cli import main


def test_env_command(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"torch            {torch.__version__}" in out and "treadle" in out


def test_python_dash_m_treadle():
    proc = subprocess.run([sys.executable, "-m", "treadle", "env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python" in proc.stdout


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: treadle" in capsys.readouterr().out
