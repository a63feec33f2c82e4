"""What a run ran on: versions, devices, threads, seed and git commit, for the log.

``collect_env`` never raises: anything it cannot find out is reported as such, so
calling it at the start of every run is safe.

It starts no process and scans no package index (it runs at the start of every fit(),
so its cost is a short run's): the platform string is built from ``os.uname()`` and
the C library's version (``platform.platform()`` starts ``uname -p`` for the
processor name, 1.5 to 8 ms), treadle's version is ``treadle._version.__version__`` (which the
installed distribution's version is read from, see pyproject.toml), and the git commit
is read from the repository's files.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import torch

from treadle._version import __version__


def _git_commit(cwd: str | None = None, timeout: float = 2.0) -> str:
    """The commit checked out in ``cwd`` (default: the current directory), or why not.

    Read from the repository's files (``HEAD``, then the loose ref or ``packed-refs``),
    so no process is started at the start of every run. A layout this does not know
    (the reftable format, an unborn branch) falls back to ``git rev-parse HEAD``.
    """
    start = os.path.abspath(cwd or os.getcwd())
    found = _read_head(start)
    if found is not None:
        return found
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=start, capture_output=True,
                             text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):  # no git executable, a hang, ...
        return "unavailable"
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else "not a git repository"


def _read_head(start: str) -> str | None:
    """The commit from the files of the repository holding ``start``; "not a git
    repository" when none does; None when only git itself can tell."""
    path = start
    while not os.path.exists(os.path.join(path, ".git")):
        parent = os.path.dirname(path)
        if parent == path:
            return "not a git repository"
        path = parent
    dot_git = os.path.join(path, ".git")
    try:
        git_dir = dot_git
        if os.path.isfile(dot_git):  # a worktree or submodule: "gitdir: <path>"
            line = _read(dot_git)
            if not line.startswith("gitdir:"):
                return None
            git_dir = os.path.normpath(os.path.join(path, line[len("gitdir:"):].strip()))
        common = git_dir  # where shared refs live; a worktree names it in "commondir"
        if os.path.isfile(os.path.join(git_dir, "commondir")):
            common = os.path.normpath(os.path.join(git_dir, _read(os.path.join(git_dir, "commondir"))))
        head = _read(os.path.join(git_dir, "HEAD"))
        if not head.startswith("ref:"):
            return head if _is_sha(head) else None  # a detached HEAD
        ref = head[len("ref:"):].strip()
        for base in (git_dir, common):
            loose = os.path.join(base, *ref.split("/"))
            if os.path.isfile(loose):
                sha = _read(loose)
                return sha if _is_sha(sha) else None
        packed = os.path.join(common, "packed-refs")
        if os.path.isfile(packed):
            with open(packed, encoding="utf-8") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 2 and parts[1] == ref and _is_sha(parts[0]):
                        return parts[0]
        return None
    except (OSError, UnicodeDecodeError):
        return None


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def platform_string() -> str:
    """``platform.platform()`` without the processor name, which on Linux takes a
    ``uname -p`` process (and is "unknown" there, or the machine name, so it is left
    out of ``platform.platform()`` too): e.g. ``Linux-6.1.0-x86_64-with-glibc2.36``.
    Other systems: ``platform.platform()`` itself."""
    if not sys.platform.startswith("linux"):
        return platform.platform()
    u = os.uname()
    libc, libc_version = platform.libc_ver()
    text = "-".join(part.strip() for part in (u.sysname, u.release, u.machine, "with", libc + libc_version) if part)
    for char in ' /\\:;"()':  # characters platform.platform() replaces, for a file-name-safe string
        text = text.replace(char, "_" if char == " " else "-")
    return text


def _cuda_info() -> dict[str, str]:
    info: dict[str, str] = {"CUDA available": str(torch.cuda.is_available())}
    if torch.version.cuda:
        info["CUDA (torch built with)"] = str(torch.version.cuda)
    if getattr(torch.version, "hip", None):
        info["ROCm/HIP"] = str(torch.version.hip)
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken CUDA install should not stop a run from starting
        cudnn = None
    if cudnn:
        info["cuDNN"] = str(cudnn)
    if torch.cuda.is_available():
        # Group identical GPUs: "GPU 0,1,2,3: NVIDIA H100 80GB HBM3".
        names: dict[str, list[str]] = {}
        for i in range(torch.cuda.device_count()):
            names.setdefault(torch.cuda.get_device_name(i), []).append(str(i))
        for name, ids in names.items():
            info[f"GPU {','.join(ids)}"] = name
    return info


def collect_env(seed: int | None = None, world_size: int = 1) -> dict[str, str]:
    """Python, platform, torch, CUDA/cuDNN and GPU names, CPU threads, numpy, world
    size, seed, treadle version and the git commit of the working directory.

    All values are strings; what cannot be determined reads "unavailable".
    """
    info: dict[str, str] = {
        "python": sys.version.split()[0],
        "platform": platform_string(),
        "torch": torch.__version__,
    }
    info.update(_cuda_info())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        info["MPS available"] = "True"
    info["CPU count"] = str(os.cpu_count() or "unknown")
    info["torch threads"] = str(torch.get_num_threads())
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = "not installed"
    info["world size"] = str(world_size)
    info["seed"] = str(seed)
    info["treadle"] = __version__
    info["git commit"] = _git_commit()
    return info


def format_env(info: dict[str, str]) -> str:
    """``info`` as an aligned two-column text table."""
    if not info:
        return "(no environment information)"
    width = max(len(k) for k in info)
    rule = "-" * width + "  " + "-" * max(len(str(v)) for v in info.values())
    lines = [rule]
    lines += [f"{k:<{width}}  {v}" for k, v in info.items()]
    lines.append(rule)
    return "\n".join(lines)


__all__ = ["collect_env", "format_env", "platform_string"]
