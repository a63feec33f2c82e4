"""A job of several processes ends at once when one of them fails: a model error, a failed
save, a SIGKILL on either rank (from itself or from outside), under `treadle train --nproc 2`
and torchrun, and a SIGTERM to one rank (a preemption: all stop at one boundary); the failing
rank's message is shown once, with no follow-on lines of the others; no process is left;
and the workers never outlive their launcher (killed with SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from job_support import hang_config, job_config, job_env, left, ours, run_job, run_slurm_like, torchrun_cmd, treadle_cmd
from treadle.checkpoint.io import find_latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")]

BOUND_S = 60  # a job left alone runs 400 x 0.1 s = 40 s per rank at least; a hang ran 1800 s
@pytest.mark.parametrize("launcher", ["nproc", "torchrun"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_model_error_on_either_rank_ends_the_job_at_once(tmp_path, launcher, rank):
    work = tmp_path / "run"
    cmd = (treadle_cmd if launcher == "nproc" else torchrun_cmd)(job_config(tmp_path, raise_on=rank), work)
    proc, took = run_job(cmd, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert took < BOUND_S, (took, out[-3000:])
    assert out.count(f"ValueError: bad sample on rank {rank} (simulated)") == 1, out[-3000:]  # shown once
    if launcher == "nproc":  # torchrun itself prints a traceback of its ChildFailedError
        assert "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []


def test_a_failed_save_on_one_rank_ends_the_job_at_once(tmp_path):
    work = tmp_path / "run"
    config = job_config(tmp_path, hooks=[{"type": "fail_fast_faults.FailSave", "rank": 0, "nth": 2}])
    proc, took = run_job(treadle_cmd(config, work), tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and took < BOUND_S, (took, out[-3000:])
    assert out.count("No space left on device") == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []


@pytest.mark.parametrize("rank", [0, 1])
def test_a_sigkill_of_either_rank_ends_the_job_at_once(tmp_path, rank):
    work = tmp_path / "run"
    config = job_config(tmp_path, hooks=[{"type": "faults.SigkillAt", "rank": rank, "at_iter": 8}])
    proc, took = run_job(treadle_cmd(config, work), tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and took < BOUND_S, (took, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []


def test_the_workers_do_not_outlive_a_killed_launcher(tmp_path):
    work = tmp_path / "run"
    launcher = subprocess.Popen(treadle_cmd(job_config(tmp_path), work), cwd=tmp_path, env=job_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"iter.rank{r}").exists() for r in (0, 1)):  # both train
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    workers = left(str(work), wait_s=0)
    assert len(workers) >= 3  # the launcher, two ranks (and their loader workers)
    launcher.kill()
    launcher.wait()
    assert left(str(work)) == []  # the ranks and their loader workers end with it


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_signal_from_outside_to_one_rank_ends_the_job_at_once(tmp_path, sig, rank):
    """A scheduler's (or a user's) signal to one worker of `treadle train --nproc 2`: SIGTERM is
    a preemption (every rank stops at the same iteration boundary, a checkpoint is saved there,
    status 143); SIGKILL ends the job as a failure."""
    work = tmp_path / "run"
    log = tmp_path / "out.txt"
    with open(log, "w") as f:
        launcher = subprocess.Popen(treadle_cmd(job_config(tmp_path), work), cwd=tmp_path, env=job_env(), stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"iter.rank{r}").exists() for r in (0, 1)):  # both train
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        start = time.monotonic()
        os.kill(int((tmp_path / f"pid.rank{rank}").read_text()), getattr(signal, sig))
        launcher.wait(timeout=BOUND_S)
        took = time.monotonic() - start
    finally:
        if launcher.poll() is None:  # a hang: the test fails below, and leaves no process
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    out = log.read_text()
    assert took < BOUND_S, (took, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []
    if sig == "SIGTERM":
        assert launcher.returncode == 143, out[-3000:]
        stopped_at = int((tmp_path / f"iter.rank{1 - rank}").read_text())  # the other rank stopped with it
        assert stopped_at < 400, out[-3000:]
        latest = find_latest_checkpoint(work / "checkpoints")
        assert latest is not None and latest.name == f"iter_{stopped_at:08d}", (latest, stopped_at)
    else:
        assert launcher.returncode != 0, out[-3000:]


# -- a rank that hangs: the stall watch (treadle/distributed/watch.py) ------------------------
STALL = {"type": "ddp", "stall_warn_s": 3, "stall_timeout_s": 8}


def _clock_s(line: str) -> float:
    """Seconds of the day of a console line's ``HH:MM:SS``."""
    h, m, s = (int(v) for v in line[:8].split(":"))
    return h * 3600 + m * 60 + s


def _of_day(t: float) -> float:
    lt = time.localtime(t)
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + (t % 1)


@pytest.mark.parametrize("launcher, hang", [("nproc", "sleep"), ("nproc", "collective"), ("torchrun", "sleep")])
def test_a_stuck_rank_is_named_with_its_stack_and_the_job_ended_naming_it(tmp_path, launcher, hang):
    """Rank 1 sleeps forever in its 5th forward, or enters a collective rank 0 never enters:
    within stall_warn_s (3 s, and the time rank 0 takes to reach its wait) a warning names
    rank 1, its phase and iteration, with its stack; after stall_timeout_s (8 s) the job
    ends, status 1, its last line naming rank 1; no process is left."""
    work = tmp_path / "run"
    config = hang_config(tmp_path, hang, STALL)
    proc, took = run_job((treadle_cmd if launcher == "nproc" else torchrun_cmd)(config, work), tmp_path, merged=True)
    ended = time.time()
    out = proc.stdout
    fault = float((tmp_path / "fault.rank1").read_text())
    assert proc.returncode == 1, out[-3000:]
    assert ended - fault < 8 + 12, (ended - fault, out[-3000:])  # the deadline, and the polling around it
    warning = next(line for line in out.splitlines() if "WARNING stall:" in line)
    assert "stall: rank 1 has made no progress for 3 s, in forward at iteration 5 (Net.forward, " \
           "fail_fast_faults.py:" in warning, warning
    assert "rank 0 waits (in backward at iteration 5)" in warning, warning
    assert (_clock_s(warning) - _of_day(fault)) % 86400 < 3 + 4, (warning, fault)
    stack = out[out.index("Python stack of rank 1"):]
    assert ("time.sleep(10**9)" if hang == "sleep" else "torch.distributed.barrier(group=self.group)") in stack
    if hang == "collective":
        assert "waiting in torch.distributed's barrier" in warning, warning
    lines = [line for line in out.splitlines() if line.strip()]
    verdicts = [line for line in lines if "rank 1 made no progress for" in line and "WARNING" not in line]
    if launcher == "nproc":  # said once, by the launcher, last
        assert verdicts == [lines[-1]], lines[-3:]
        assert "process of rank 1 was ended (exit code 1): rank 1 made no progress for" in lines[-1], lines[-3:]
        assert "Traceback" not in out, out[-3000:]
    else:  # said once by the job, and in torchrun's own summary: the root cause is rank 1, with the watch's line
        cause = out[out.index("Root Cause"):]
        assert "rank      : 1 (local_rank: 1)" in cause and "rank 1 made no progress for" in cause, cause
        assert len([line for line in verdicts if line.startswith("treadle: rank 1 made no progress")]) == 1, verdicts
    assert "stopped on rank 0" not in ours(out) and "SIGTERM" not in ours(out), out[-3000:]  # no follow-on lines
    assert left(str(work)) == []


def test_by_default_a_stuck_rank_is_named_before_the_process_group_timeout_would_blame_a_waiting_one(tmp_path):
    """No stall setting (warning after 300 s, no stall timeout), the process group's
    timeout_s 12: the job ends just before those 12 s, naming rank 1 (torch's own timeout
    blamed rank 0, which waited)."""
    work = tmp_path / "run"
    config = hang_config(tmp_path, "sleep", {"type": "ddp", "timeout_s": 12})
    proc, took = run_job(treadle_cmd(config, work), tmp_path, merged=True)
    ended = time.time()
    out = proc.stdout
    fault = float((tmp_path / "fault.rank1").read_text())
    assert proc.returncode == 1 and ended - fault < 12 + 10, (ended - fault, out[-3000:])
    assert "the process group's timeout_s=12 is near" in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert "process of rank 1 was ended (exit code 1): rank 1 made no progress for" in lines[-1], lines[-3:]
    assert "Timed out waiting" not in out and "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []


def test_a_rank_that_ends_without_a_python_error_is_named_by_the_launcher(tmp_path):
    """os._exit(3) on rank 1: the launcher's last line says rank 1 exited with status 3 and
    printed no Python error; rank 0 does not claim an error was shown."""
    work = tmp_path / "run"
    config = hang_config(tmp_path, "exit", {"type": "ddp"})
    proc, took = run_job(treadle_cmd(config, work), tmp_path, merged=True)
    out = proc.stdout
    assert proc.returncode == 3 and took < BOUND_S, (took, out[-3000:])
    lines = [line for line in out.splitlines() if line.strip()]
    assert "process of rank 1 exited with status 3 and printed no Python error" in lines[-1], lines[-3:]
    assert "its error is shown by it" not in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert left(str(work)) == []


# -- failures outside the user's code: one line with the cause and what was saved --------------
def _one_process(config: Path, work: Path) -> list[str]:
    return [sys.executable, "-m", "treadle", "train", str(config), "--work-dir", str(work)]


def _fault_config(tmp_path: Path, hook: dict, log_writers: list[str] | None = None) -> Path:
    path = job_config(tmp_path, hooks=[hook])
    cfg = yaml.safe_load(path.read_text())
    cfg["train_dataloader"]["num_workers"] = 2
    if log_writers is not None:
        cfg["log_writers"] = log_writers
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_loader_worker_killed_from_outside_ends_the_run_in_one_line(tmp_path, nproc):
    """SIGKILL to a DataLoader worker (the out-of-memory killer's way) after the 7th
    iteration, while a hook runs: torch raises from its SIGCHLD handler there, outside the
    step. One line says so, where, and that the checkpoint of iteration 5 is the last one;
    no traceback (before: 55 lines)."""
    work = tmp_path / "run"
    config = _fault_config(tmp_path, {"type": "fail_fast_faults.KillWorker", "at": 7, "rank": nproc - 1})
    proc, took = run_job((_one_process if nproc == 1 else treadle_cmd)(config, work), tmp_path, merged=True)
    out = proc.stdout
    assert proc.returncode == 1 and took < BOUND_S, (took, out[-3000:])
    assert "Traceback" not in out, out[-3000:]
    said = [line for line in out.splitlines() if "a DataLoader worker died" in line]
    assert len(said) == 1, out[-3000:]
    assert said[0].startswith("treadle train: error: a DataLoader worker died in epoch 1, iteration 7 (DataLoader "
                              "worker (pid "), said
    assert "is killed by signal: Killed" in said[0], said
    assert said[0].endswith(f"the last checkpoint, {work / 'checkpoints' / 'iter_00000005'}, is intact; nothing after "
                            "it was saved"), said
    if nproc == 2:  # said once, by the launcher, last; no follow-on line of rank 0
        lines = [line for line in out.splitlines() if line.strip()]
        assert lines[-1] == said[0], lines[-3:]
        assert "stopped on rank 0" not in out, out[-3000:]
    assert find_latest_checkpoint(work / "checkpoints").name == "iter_00000005"
    assert left(str(work)) == []


@pytest.mark.parametrize("writer, file", [("treadle.logging.writers.JsonlWriter", "log.jsonl"),
                                          ("treadle.logging.backends.CsvWriter", "log.csv"),
                                          ("treadle.logging.backends.TensorBoardWriter", "events.out.tfevents.")])
def test_a_full_disk_met_first_by_a_log_writer_is_one_line_saying_what_was_saved(tmp_path, writer, file):
    """From iteration 7 on, one log writer's writes fail with ENOSPC; it meets the full
    disk when the checkpoint of iteration 10 syncs the logs. One line names the cause and
    the file, says the checkpoint of iteration 5 is the last one and intact; no traceback
    and no "also failed" from the writers closing on the same full disk (before: 91 lines,
    three chained tracebacks)."""
    work = tmp_path / "run"
    hook = {"type": "fail_fast_faults.FullDisk", "writer": writer, "at": 7, "checkpoint": False}
    config = _fault_config(tmp_path, hook, log_writers=["jsonl", "csv", "tensorboard"])
    proc, took = run_job(_one_process(config, work), tmp_path, merged=True)
    out = proc.stdout
    assert proc.returncode == 1 and took < BOUND_S, (took, out[-3000:])
    assert "Traceback" not in out and "also failed" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1].startswith(f"treadle train: error: No space left on device writing {work}/"), lines[-1]
    assert file in lines[-1] and " in epoch 1, iteration 10; " in lines[-1], lines[-1]
    assert lines[-1].endswith(f"the last checkpoint, {work / 'checkpoints' / 'iter_00000005'}, is intact; nothing "
                              "after it was saved"), lines[-1]
    latest = find_latest_checkpoint(work / "checkpoints")
    assert latest.name == "iter_00000005"
    torch.load(latest / "state.pt", weights_only=True)  # intact: it loads
    assert left(str(work)) == []


def test_under_slurm_a_stuck_rank_ends_itself_naming_it_and_the_other_follows(tmp_path):
    """srun starts each task itself (no TorchElastic agent): rank 1 stuck in its step ends
    with status 1 and its own line after stall_timeout_s; rank 0, whose peer is gone, stops
    naming rank 1; both within the deadline, no process left."""
    work = tmp_path / "run"
    config = hang_config(tmp_path, "sleep", STALL)
    statuses, outs = run_slurm_like(config, work, tmp_path)
    ended = time.time()
    fault = float((tmp_path / "fault.rank1").read_text())
    assert ended - fault < 8 + 15, (ended - fault, outs[1][-2000:])
    assert statuses == [1, 1], [o[-2000:] for o in outs]
    both = outs[0] + outs[1]
    verdicts = [line for line in both.splitlines() if line.startswith("treadle: rank 1 made no progress for")]
    assert len(verdicts) == 1, both[-3000:]  # said once for the job; the other rank's stop is not said
    assert "stopped on rank" not in both and "Traceback" not in both, both[-3000:]
    assert left(str(work)) == []
