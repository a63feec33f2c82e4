"""Jobs of several processes for the tests of failures and hangs (tests/ is on sys.path):
a config over tests/fail_fast_faults.py, the three launchers (``treadle train --nproc``,
torchrun, a SLURM-style launch that starts each task itself), and the processes a job
left behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def job_config(tmp_path: Path, raise_on: int = -1, hooks: list | None = None) -> Path:
    """A job of 400 iterations (each at least 0.1 s) over fail_fast_faults.py's Net."""
    cfg = {"model": {"type": "fail_fast_faults.Net", "raise_on": raise_on},
           "train_dataloader": {"dataset": {"type": "fail_fast_faults.Numbers"}, "batch_size": 4, "shuffle": True,
                                "num_workers": 1, "persistent_workers": True},
           "loss_fn": {"type": "CrossEntropyLoss"}, "optimizer": {"type": "SGD", "lr": 0.1}, "max_iters": 400,
           "log_interval": 5, "seed": 0, "progress": False, "checkpoint": {"interval": 5, "by_epoch": False},
           "hooks": [{"type": "fail_fast_faults.Record", "dir": str(tmp_path)}, *(hooks or [])]}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def hang_config(tmp_path: Path, hang: str, strategy: dict, on: int | list[int] = 1) -> Path:
    """:func:`job_config` whose rank(s) ``on`` hang in their 5th forward (fail_fast_faults.Net's
    ``hang``), the time written to ``tmp_path/fault.rank<r>``, under ``strategy``."""
    path = job_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"].update(hang_on=on, hang_at=5, hang=hang, mark=str(tmp_path / "fault"))
    cfg["strategy"] = strategy
    cfg["checkpoint"] = {"interval": 3, "by_epoch": False}
    path.write_text(yaml.safe_dump(cfg))
    return path


def job_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def left(marker: str, wait_s: float = 10.0) -> list[int]:
    """Processes whose command line holds ``marker`` (the job's work dir), after up to
    ``wait_s`` seconds for them to go."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if marker.encode() in f.read():
                            pids.append(int(entry))
                except OSError:
                    pass
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def run_job(cmd: list[str], tmp_path: Path, merged: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` in a session of its own; ``merged``: stderr into stdout in the order
    they were written (the last line is what a terminal shows last)."""
    start = time.monotonic()
    err = subprocess.STDOUT if merged else subprocess.PIPE
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=300, cwd=tmp_path, env=job_env(),
                          start_new_session=True)
    return proc, time.monotonic() - start


def treadle_cmd(config: Path, work: Path) -> list[str]:
    return [sys.executable, "-m", "treadle", "train", str(config), "--nproc", "2", "--work-dir", str(work)]


def torchrun_cmd(config: Path, work: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "treadle",
            "train", str(config), "--work-dir", str(work)]


def run_slurm_like(config: Path, work: Path, tmp_path: Path, ntasks: int = 2) -> tuple[list[int], list[str]]:
    """A SLURM-style launch: each task started directly with SLURM's variables and no
    TorchElastic agent (as srun does); returns each task's status and output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(ntasks):
        env = {**job_env(), "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(ntasks), "SLURM_LOCALID": str(rank),
               "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "127.0.0.1", "MASTER_PORT": str(port)}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_ERROR_FILE"):
            env.pop(key, None)
        procs.append(subprocess.Popen([sys.executable, "-m", "treadle", "train", str(config), "--work-dir", str(work)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                                      env=env, start_new_session=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outs


def ours(out: str) -> str:
    """A job's output without torchrun's own log lines, traceback and summary of a failure
    (all of it under the other launchers)."""
    at = out.find("ChildFailedError")
    head = out if at < 0 else out[:out.rfind("Traceback (most recent call last):", 0, at)]
    return "".join(line for line in head.splitlines(keepends=True) if "torch/distributed/elastic/" not in line)
