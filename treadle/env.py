"""What a run ran on: versions, devices, threads, seed and git commit, for the log.

``collect_env`` never raises: anything it cannot find out is reported as such, so
calling it at the start of every run is safe.

Two of its values take most of its time and do not change while a process runs: the
platform string (``platform.platform()`` starts ``uname -p``, 1.5 ms and more on a busy
machine) and treadle's installed version (a scan of the installed distributions, 0.7
ms). :func:`prefetch_env` finds them out in a background thread, which the Trainer
starts when it is built with a work_dir, so that ``fit()`` finds them ready when it
writes ``env.txt``; ``collect_env`` waits for that thread, or finds them out itself.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import threading

import torch


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


@functools.lru_cache(maxsize=1)  # the installed version does not change while running
def _treadle_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("treadle")
    except metadata.PackageNotFoundError:  # running from a checkout that is not installed
        import treadle

        return str(getattr(treadle, "__version__", "unknown"))


@functools.lru_cache(maxsize=1)
def _process_constants() -> tuple[str, str]:
    """``(platform string, treadle version)``: the slow values of :func:`collect_env`,
    the same for the whole process."""
    return platform.platform(), _treadle_version()


_prefetch: threading.Thread | None = None
_prefetch_lock = threading.Lock()


def prefetch_env() -> None:
    """Start finding out, in a daemon thread, the values of :func:`collect_env` that are
    slow and do not change while the process runs (see the module's docstring). Only
    the first call starts a thread; the values are the same with or without it."""
    global _prefetch
    with _prefetch_lock:
        if _prefetch is None:
            _prefetch = threading.Thread(target=_process_constants, name="treadle-env", daemon=True)
            _prefetch.start()


def _constants() -> tuple[str, str]:
    thread = _prefetch
    if thread is not None:
        thread.join()  # then the cache holds them (unless the thread failed: computed here)
    return _process_constants()


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
    platform_string, version = _constants()
    info: dict[str, str] = {
        "python": sys.version.split()[0],
        "platform": platform_string,
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
    info["treadle"] = version
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


__all__ = ["collect_env", "format_env", "prefetch_env"]
