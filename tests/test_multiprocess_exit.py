"""Several processes exit cleanly and promptly at the end of a run: the process group is
freed (gloo's threads joined) while the interpreter is whole, so no rank aborts at shutdown
("terminate called without an active exception") and turns a finished run into a failed
job; what is left of the run is frozen before the interpreter's teardown, which then does
not go over it. benchmarks/multiprocess_exit.py runs the stress test many times and prints
the time from the last line to the launcher's exit."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support import run_ranks

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")]


def _bench():
    spec = importlib.util.spec_from_file_location("multiprocess_exit", ROOT / "benchmarks" / "multiprocess_exit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Runs `treadle train` and, as the very last exit handler (registered before treadle
# registers its own), prints the threads of the process group that are still alive.
_RANK_SCRIPT = """\
import atexit, os, sys

def group_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(n for n in names if "gloo" in n or "tcpstore" in n)

atexit.register(lambda: print("group threads at exit:", group_threads(), flush=True))
from treadle.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_group_threads_are_gone_before_interpreter_teardown(tmp_path):
    """The deterministic half of the story: once the exit handlers have run, no gloo
    worker, gloo event loop or TCPStore thread is left. One left alive is torn down
    during interpreter finalization, where a worker that needs the GIL to free the
    tensors of its last collective is ended by Python in the middle of a C++
    destructor: std::terminate. (Before the fix: every rank still had
    gloo_tcp_loop and two pt_gloo_runloop threads here, because torch.distributed.nn's
    default arguments and the finished Trainer's DDP reducer kept the group.)"""
    config, script = tmp_path / "tiny.yaml", tmp_path / "rank.py"
    config.write_text(_bench().TINY)
    script.write_text(_RANK_SCRIPT)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    results = run_ranks(str(script), ["train", str(config), "--work-dir", str(tmp_path / "run")], env=env)
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank}:\n{out[-3000:]}"
        assert "group threads at exit: []" in out, f"rank {rank}:\n{out[-3000:]}"


def test_two_process_training_exits_0_every_time_under_load(tmp_path, monkeypatch):
    """`treadle train --nproc 2`, three times, while every core is kept busy: each run
    exits 0 (the launcher reports 1 if any rank aborts at shutdown)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the runs inherit it: gloo, as a GPU machine's one GPU is not two
    bench = _bench()
    config = tmp_path / "tiny.yaml"
    config.write_text(bench.TINY)
    with bench.busy(os.cpu_count() or 2):
        for i in range(3):
            work = tmp_path / f"run{i}" / "work"
            work.parent.mkdir()
            code, out = bench.run_once(config, work, timeout=120)
            assert code == 0, f"run {i + 1} exited {code}:\n{out[-3000:]}"
            assert (work / "log.jsonl").exists()


# Runs `treadle train` and, as the very last exit handler, prints how many objects are
# frozen and how many the interpreter's teardown would still go over.
_HEAP_SCRIPT = """\
import atexit, gc, sys

atexit.register(lambda: print(f"heap at exit: {gc.get_freeze_count()} frozen, {len(gc.get_objects())} not",
                              flush=True))
from treadle.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_finished_runs_objects_are_frozen_before_interpreter_teardown(tmp_path):
    """The processes of a finished run end promptly: by the last exit handler, what is left
    of the run is frozen (gc.freeze), so the interpreter's teardown frees it by reference
    counts instead of going over all of it in several collections (seconds per process on
    a busy machine between the last step and the launcher's exit; benchmarks/
    multiprocess_exit.py prints that time). Each rank (torchrun's environment), and the
    launcher of --nproc 2."""
    config, script = tmp_path / "tiny.yaml", tmp_path / "run.py"
    config.write_text(_bench().TINY)
    script.write_text(_HEAP_SCRIPT)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    outs = [out for _, out in run_ranks(str(script), ["train", str(config), "--work-dir", str(tmp_path / "a")], env=env)]
    launcher = subprocess.run([sys.executable, str(script), "train", str(config), "--work-dir", str(tmp_path / "b"),
                               "--nproc", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300, env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert launcher.returncode == 0, launcher.stdout[-3000:]
    for who, out in (("rank 0", outs[0]), ("rank 1", outs[1]), ("the launcher", launcher.stdout)):
        heap = re.search(r"heap at exit: (\d+) frozen, (\d+) not", out)
        assert heap is not None and int(heap[1]) > 20 * int(heap[2]), f"{who}:\n{out[-3000:]}"
