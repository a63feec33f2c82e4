"""Several processes exit cleanly at the end of a run: the process group is freed (gloo's
threads joined) while the interpreter is whole, so no rank aborts at shutdown
("terminate called without an active exception") and turns a finished run into a
failed job. benchmarks/multiprocess_exit.py runs the stress test many times."""

from __future__ import annotations

import importlib.util
import os
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
