"""`treadle train` never loses or touches what is not this run's: config.yaml of a
refused resume or of an earlier run, a work_dir another run holds, Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treadle.checkpoint.io import find_latest_checkpoint, verify_checkpoint
from treadle.engine.run_dir import WorkDirLock

from cli_support import TINY, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("change, message", [
    ("model.classes=4", "resume needs the model the checkpoint was saved from"),
    ("optimizer={type: AdamW, lr: 0.01}", "the checkpoint was saved by SGD, this run has AdamW"),
])
def test_a_refused_resume_leaves_config_yaml_as_it_was(tiny, tmp_path, capsys, change, message):
    work = tmp_path / "run"
    assert run(capsys, "train", tiny, "--work-dir", work)[0] == 0
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    rc, _, err = run(capsys, "train", tiny, "--work-dir", work, "--resume", "--set", change, "max_epochs=3")
    assert rc == 2 and message in err
    after = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    assert after["config.yaml"] == before["config.yaml"] and after["env.txt"] == before["env.txt"]
    assert set(after) == set(before)


def test_a_new_run_moves_the_earlier_config_aside(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    assert run(capsys, "train", tiny, "--work-dir", work)[0] == 0
    first = (work / "config.yaml").read_bytes()
    os.utime(work / "config.yaml", (time.time() - 7200,) * 2)
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "max_epochs=1")[0] == 0
    aside = sorted(work.glob("config.*.yaml"))
    assert len(aside) == 1 and aside[0].read_bytes() == first
    assert b"max_epochs: 1" in (work / "config.yaml").read_bytes()
    # The same config again: nothing to keep aside.
    assert run(capsys, "train", tiny, "--work-dir", work, "--set", "max_epochs=1")[0] == 0
    assert sorted(work.glob("config.*.yaml")) == aside


def test_a_work_dir_in_use_is_refused_in_one_line(tiny, tmp_path, capsys):
    work = tmp_path / "run"
    with WorkDirLock(work, run="the-other-run"):
        rc, _, err = run(capsys, "train", tiny, "--work-dir", work)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert re.match(rf"treadle train: error: work_dir {work} is in use by pid {os.getpid()} on host .* \(run "
                    r"the-other-run, since", err)
    assert sorted(os.listdir(work)) == [".treadle.lock"]


def _env(**extra):
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.slow
def test_two_runs_started_together_in_one_work_dir_one_refuses(tiny, tmp_path):
    work = tmp_path / "run"
    # The winner holds the lock about 3.5 s (3000 tiny epochs), far past any gap between the
    # two processes' starts; 200 epochs held it 0.25 s, and a loaded machine once let the
    # second start after the first had finished (both exit 0).
    cmd = [sys.executable, "-m", "treadle", "train", str(tiny), "--work-dir", str(work), "--set", "max_epochs=3000",
           "log_interval=100"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env())
             for _ in range(2)]
    results = [(p.returncode, out, err) for p in procs for out, err in [p.communicate(timeout=300)]]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], results
    _, _, err = next(r for r in results if r[0] == 2)
    assert "Traceback" not in err and re.search(r"work_dir .* is in use by pid \d+ on host", err)
    verify_checkpoint(find_latest_checkpoint(work / "checkpoints"))


def _ctrl_c_once_it_logs(argv: list[str], work: Path, cwd: Path, **env) -> tuple[int, str, str]:
    """``treadle ARGV`` in a new session, and Ctrl-C as a terminal sends it (SIGINT to the
    whole process group, loader workers included) once the run has logged a little."""
    proc = subprocess.Popen([sys.executable, "-m", "treadle", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=_env(**env), start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (work / "log.jsonl").exists() or (work / "log.jsonl").stat().st_size < 200:
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


LONG = TINY.replace("max_epochs: 2", "max_epochs: 400").replace("batch_size: 8\n  shuffle: true",
                                                                 "batch_size: 8\n  shuffle: true\n  num_workers: 2")


@pytest.mark.slow
def test_ctrl_c_saves_says_where_and_how_to_resume_and_exits_130(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group, loader workers included."""
    config = tmp_path / "long.yaml"
    config.write_text(LONG)
    work = tmp_path / "run"
    returncode, out, err = _ctrl_c_once_it_logs(["train", str(config), "--work-dir", str(work)], work, tmp_path)
    assert returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert err.count("Ctrl-C: stopping after this iteration") == 1  # the loader workers keep quiet
    saved = re.findall(r"interrupted \(Ctrl-C\): saved (\S+) at iteration (\d+); continue with treadle train "
                       rf"{re.escape(str(work / 'config.yaml'))} --resume", out)
    assert len(saved) == 1, out[-2000:]
    verify_checkpoint(saved[0][0])
    assert find_latest_checkpoint(work / "checkpoints", order="created") == Path(saved[0][0])
    # and it resumes from there (briefly: train two more epochs than it had)
    resumed = subprocess.run([sys.executable, "-m", "treadle", "train", str(work / "config.yaml"), "--resume",
                              "--set", f"max_epochs={int(saved[0][1]) // 4 + 2}"],
                             capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resumed from {saved[0][0]}" in resumed.stdout


@pytest.mark.slow
def test_ctrl_c_to_nproc_2_reaches_each_process_once_which_save_and_the_launcher_exits_130(tmp_path):
    """The launcher's agent passes the signal on to the processes (each in its own
    session, so they get it once) and waits for them."""
    config = tmp_path / "long.yaml"
    config.write_text(LONG.replace("num_workers: 2", "num_workers: 0"))
    work = tmp_path / "run"
    returncode, out, err = _ctrl_c_once_it_logs(["train", str(config), "--work-dir", str(work), "--nproc", "2"], work,
                                                tmp_path, CUDA_VISIBLE_DEVICES="")  # gloo: one GPU is not two
    assert returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in out + err
    saved = re.findall(r"interrupted \(Ctrl-C\): saved (\S+) at iteration", out)
    assert len(saved) == 1, out[-2000:]
    verify_checkpoint(saved[0])
    assert {"rng_rank0.pt", "rng_rank1.pt"} <= {p.name for p in Path(saved[0]).iterdir()}
