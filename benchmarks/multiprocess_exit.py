"""Do several processes exit 0, every time? The 2-process CLI training, N times, under load.

Each run is ``python -m treadle train tiny.yaml --nproc 2`` (the tiny config of
tests/test_cli.py: 2 epochs of 2 iterations, validation, a final checkpoint), started
while ``--load`` processes spin on the CPU, so that the ranks' threads are descheduled
at random points, as on a busy CI machine. A rank that aborts at shutdown ("terminate
called without an active exception", exit -6) makes the launcher exit 1 although the
training finished. Prints ``k/N exited 0``, how long each run's launcher took to exit
after the last line the run printed (rank 0's final metrics: the processes' exit, the
agent's and the launcher's own; median and maximum), and, for each failed run, its exit
status and the end of its output (``--keep DIR`` keeps the output and run directory).
``--direct`` starts the two ranks with torchrun's environment instead of ``--nproc``
(rank 0 then hosts the TCPStore, as in tests/support.py's ``run_ranks``).

    python benchmarks/multiprocess_exit.py [--runs 30] [--load 2] [--jobs 1] [--direct]

Exit status 1 when a run failed. tests/test_multiprocess_exit.py runs a few of these.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from cli_support import TINY  # noqa: E402 -- the command-line tests' tiny config (model and data in tests/support.py)

TIMED_OUT = -999


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _start(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    # A session of its own: on a timeout, the whole tree (launcher and ranks) is killed.
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(procs: list[subprocess.Popen], timeout: float) -> tuple[list[int], list[str]]:
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        outs = [p.communicate()[0] for p in procs]
        return [TIMED_OUT] * len(procs), outs
    return [p.returncode for p in procs], outs


def _timed(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    """``proc``'s exit status and output, and the seconds from its last line of output to
    its exit (the output read line by line as it comes)."""
    lines: list[str] = []
    last = [time.monotonic()]

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]  # piped by _start
            lines.append(line)
            last[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
        return TIMED_OUT, "".join(lines), float("nan")
    ended = time.monotonic()
    reader.join(5)  # the rest of the output, already written
    return proc.returncode, "".join(lines), ended - last[0]


def run_once(config: Path, work: Path, direct: bool = False, timeout: float = 300.0,
             exit_after: list[float] | None = None) -> tuple[int, str]:
    """One 2-process training of ``config`` into ``work``; (exit status, output). With
    ``direct``, the status is the first non-zero one of the two ranks, or 0.
    ``exit_after`` (``--nproc 2`` only): gets the seconds from the run's last line of
    output to the launcher's exit."""
    cmd = [sys.executable, "-m", "treadle", "train", str(config), "--work-dir", str(work)]
    if not direct:
        code, out, gap = _timed(_start([*cmd, "--nproc", "2"], work.parent, _env()), timeout)
        if exit_after is not None and code == 0:
            exit_after.append(gap)
        return code, out
    port = str(_free_port())
    procs = [_start(cmd, work.parent, {**_env(), "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for r in range(2)]
    codes, outs = _finish(procs, timeout)
    text = "".join(f"==== rank {r} exited {c}\n{o}" for r, (c, o) in enumerate(zip(codes, outs)))
    return next((c for c in codes if c != 0), 0), text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    p.add_argument("--jobs", type=int, default=1, help="trainings at the same time")
    p.add_argument("--direct", action="store_true", help="torchrun's environment instead of --nproc")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--keep", default=None, help="copy the output and run directory of failed runs here")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="treadle-exit-"))
    config = tmp / "tiny.yaml"
    config.write_text(TINY)
    failures: list[tuple[int, int, str]] = []
    gaps: list[float] = []

    def one(i: int) -> None:
        work = tmp / f"run{i + 1}" / "work"
        work.parent.mkdir()
        mine: list[float] = []
        code, out = run_once(config, work, args.direct, args.timeout, exit_after=mine)
        gaps.extend(mine)
        after = f" ({mine[0]:.2f} s after its last line)" if mine else ""
        print(f"run {i + 1}/{args.runs}: exit {code if code != TIMED_OUT else 'timed out'}{after}", flush=True)
        if code != 0:
            failures.append((i + 1, code, out))
            if args.keep:
                dest = Path(args.keep) / f"run{i + 1}"
                shutil.copytree(work.parent, dest, dirs_exist_ok=True)
                (dest / "output.txt").write_text(out)
        shutil.rmtree(work.parent, ignore_errors=True)

    start = time.perf_counter()
    try:
        with busy(args.load), ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(one, range(args.runs)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    how = "torchrun environment" if args.direct else "--nproc 2"
    print(f"{args.runs - len(failures)}/{args.runs} exited 0 ({how}; {args.load} busy processes, "
          f"{args.jobs} at a time; {time.perf_counter() - start:.0f} s)")
    if gaps:
        print(f"launcher exit after the run's last line: median {statistics.median(gaps):.2f} s, "
              f"max {max(gaps):.2f} s ({len(gaps)} runs)")
    for i, code, out in sorted(failures):
        tail = "\n".join(out.strip().splitlines()[-12:])
        print(f"--- run {i}: exit {code if code != TIMED_OUT else 'timed out'}\n{tail}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
