"""The robustness tests of ``benchmarks/peers_compare.py``, one engine at a time: each runs
the engine's own script under ``benchmarks/peers_engines/`` in fresh processes, under the
engine's own launcher, and reads what happened from outside (exit status, files, the
processes left, the output).

* :func:`resume_trial`: an uninterrupted run, then a run that SIGKILLs itself before a
  given step and its resume; the final weights compared.
* :func:`job`: 2 processes on gloo, one of which raises or hangs in its 3rd step; the time
  from the fault until the launcher has exited, its status, the processes left, whether
  the output names the stuck rank and when.
* :func:`pickle_trials`: a checkpoint whose files each get, in turn, a pickled call that
  writes a marker file; the engine resumes from it; did the marker appear?
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
ENGINES_DIR = HERE / "peers_engines"
ENGINES = ("treadle", "lightning", "accelerate", "mmengine", "ignite")
STUCK_RANK = 1
# What each engine needs to load its own checkpoint under torch >= 2.6, whose torch.load
# defaults to weights_only=True: MMEngine 0.10.7 and Ignite's DeterministicEngine save
# objects (a HistoryBuffer, numpy RNG states) that it refuses. torch's documented switch.
TRUSTED_LOAD = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def env_for(peers_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of an engine's processes: one torch thread, peers_common importable."""
    path = os.pathsep.join(filter(None, [str(ENGINES_DIR), str(HERE.parent), os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEERS_", "TORCH_FORCE_"))}
    env.update(PYTHONPATH=path, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PEERS_DIR=str(peers_dir),
               PYTHONWARNINGS="ignore", **extra)
    return env


def script(engine: str) -> list[str]:
    return [sys.executable, str(ENGINES_DIR / f"run_{engine}.py")]


# -- SIGKILL, then resume ------------------------------------------------------------------
def train(engine: str, work: Path, out: Path, log: Path, resume: bool = False, **env: str) -> int:
    """One single-process run of ``engine``'s script; its exit status (-9 when it killed itself)."""
    work.parent.mkdir(parents=True, exist_ok=True)
    cmd = script(engine) + ["train", "--work-dir", str(work), "--out", str(out)] + (["--resume"] if resume else [])
    with open(log, "ab") as f:
        return subprocess.run(cmd, cwd=ENGINES_DIR, env=env_for(work.parent, **env), stdout=f, stderr=subprocess.STDOUT,
                              timeout=900).returncode


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Bit-equal, and the largest absolute difference, of two weight files."""
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    diff = max((x[k].double() - y[k].double()).abs().max().item() for k in x)
    return {"equal": all(torch.equal(x[k], y[k]) for k in x), "max_diff": diff}


def last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^\w*(Error|Exception)\b", ln)]
    return (errors or lines or ["no output"])[-1][:300]


def reference(engine: str, root: Path, runs: int = 2) -> dict[str, Any]:
    """Uninterrupted runs: the reference weights, and (with 2 runs) whether the engine
    repeats itself (``repeats``: None with one run)."""
    outs = []
    for i in range(1, runs + 1):
        out = root / f"ref{i}.pt"
        status = train(engine, root / f"ref{i}", out, root / f"ref{i}.log")
        if status != 0:
            return {"error": f"uninterrupted run: exit {status}: {last_line(root / f'ref{i}.log')}"}
        outs.append(out)
    return {"weights": str(outs[0]), "repeats": compare(*outs) if runs > 1 else None}


def resume_trial(engine: str, root: Path, kill_at: int, ref: Path, trusted: bool = False) -> dict[str, Any]:
    """Killed before step ``kill_at + 1``, resumed the engine's way (with torch's defaults,
    then, if that load fails, with :data:`TRUSTED_LOAD`; ``trusted``: with it at once);
    compared with ``ref``."""
    work, out, log = root / f"kill{kill_at}", root / f"kill{kill_at}.pt", root / f"kill{kill_at}.log"
    status = train(engine, work, out, log, PEERS_KILL_AT=str(kill_at))
    if status != -signal.SIGKILL:
        return {"kill_at": kill_at, "error": f"the run to kill ended with status {status}: {last_line(log)}"}
    result: dict[str, Any] = {"kill_at": kill_at}
    status = 1 if trusted else train(engine, work, out, log, resume=True)
    if status != 0:
        if not trusted:
            result["default_load"] = f"exit {status}: {last_line(log)}"
        status = train(engine, work, out, log, resume=True, **TRUSTED_LOAD)
        result["env"] = TRUSTED_LOAD
        if status != 0:
            return {**result, "error": f"resume: exit {status}: {last_line(log)}"}
    return {**result, **compare(ref, out)}


# -- a failing or hanging process ---------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(engine: str, work: Path, timeout: float | None) -> list[str]:
    """The command that starts ``engine``'s 2-process job with its own launcher."""
    run = script(engine) + ["dist", "--work-dir", str(work)] + (["--timeout", f"{timeout:g}"] if timeout else [])
    port = str(free_port())
    if engine == "treadle":
        cmd = [sys.executable, "-m", "treadle", "train", str(ENGINES_DIR / "treadle_job.yaml"), "--nproc", "2",
               "--work-dir", str(work)]
        return cmd + (["--set", f"strategy.stall_timeout_s={timeout:g}", f"strategy.stall_warn_s={timeout / 3:g}"]
                      if timeout else [])
    if engine == "accelerate":
        return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", port, *run[1:]]
    if engine == "mmengine":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-port", port, *run[1:], "--launcher", "pytorch"]
    return run  # Lightning and Ignite start the second process themselves


def alive(peers_dir: Path) -> list[int]:
    """Processes (not zombies) started with ``PEERS_DIR=peers_dir``: ranks, workers, agents."""
    mark = f"PEERS_DIR={peers_dir}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes() + b"\0" and " Z " not in (proc / "stat").read_text():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


NAMES_STUCK = re.compile(rf"\brank[ :=#]*{STUCK_RANK}\b.*\b(stuck|hang|hung|stall|stalled|no progress|not responding)\b"
                         rf"|\b(stuck|hang|hung|stall|stalled|no progress|not responding)\b.*\brank[ :=#]*{STUCK_RANK}\b",
                         re.IGNORECASE)


def job(engine: str, root: Path, fault: str, timeout: float | None, cap: float) -> dict[str, Any]:
    """Run the 2-process job with rank 1 failing (``fault="raise"``) or hanging
    (``"hang"``) in its 3rd step; watch it for ``cap`` seconds after the fault."""
    name = f"{fault}-{'default' if timeout is None else f'{timeout:g}s'}"
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    cmd = launch(engine, work / "run", timeout)
    env = env_for(work, PEERS_FAULT=fault, PEERS_FAULT_AT="3", PEERS_FAULT_RANK=str(STUCK_RANK), PEERS_WORKERS="0")
    lines: list[tuple[float, str]] = []
    p = subprocess.Popen(cmd, cwd=ENGINES_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    reader = threading.Thread(target=lambda: lines.extend((time.time(), ln.decode(errors="replace").rstrip())
                                                          for ln in p.stdout), daemon=True)
    reader.start()
    started, fault_file = time.time(), work / "fault.time"
    result: dict[str, Any] = {"command": " ".join(cmd[1:] if cmd[0] == sys.executable else cmd), "cap_s": cap}
    while p.poll() is None:
        faulted = float(fault_file.read_text()) if fault_file.is_file() and fault_file.read_text() else None
        if (faulted or started) + (cap if faulted else cap + 300) < time.time():
            break
        time.sleep(0.1)
    ended = time.time()
    faulted = float(fault_file.read_text()) if fault_file.is_file() and fault_file.read_text() else None
    result["faulted"] = faulted is not None
    if p.poll() is not None:
        result.update(ended=True, seconds=round(ended - (faulted or started), 1), status=p.returncode)
        time.sleep(3)  # what normal teardown leaves for a moment is not counted
    else:
        result.update(ended=False, status=None)
    left = alive(work)
    result["left"] = len(left)
    for pid in left + ([p.pid] if p.poll() is None else []):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    p.wait()
    reader.join(timeout=5)
    (work / "output.log").write_text("".join(f"{t - started:8.1f} {ln}\n" for t, ln in lines))
    named = [(t, ln) for t, ln in lines if NAMES_STUCK.search(ln)]
    if fault == "hang":
        result["named"] = bool(named)
        if named:
            result["named_after_s"] = round(named[0][0] - faulted, 1) if faulted else None
            result["named_line"] = named[0][1][:300]
    result["tail"] = [ln[:300] for _, ln in lines[-12:]]
    return result


# -- a checkpoint that would run code -----------------------------------------------------
class Payload:
    """Unpickled, it runs ``exec(code)``: what a malicious checkpoint file does."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code,))


def pickled(path: Path) -> str | None:
    """"torch" for torch.save's zip format, "pickle" for a plain pickle, else None."""
    head = path.read_bytes()[:2]
    return "torch" if head == b"PK" else "pickle" if head[:1] == b"\x80" else None


def plant(path: Path, marker: Path) -> None:
    """Adds a payload to the pickled dict in ``path`` (same format), and updates a
    manifest beside it that lists the file, so that a hash check does not stop it first."""
    kind = pickled(path)  # the engine's own file, just written by a run of this harness: trusted
    obj = torch.load(path, weights_only=False) if kind == "torch" else pickle.loads(path.read_bytes())  # noqa: S301
    payload = Payload(f"open({str(marker)!r}, 'w').write('ran')")
    obj = {**obj, "_payload": payload} if isinstance(obj, dict) else {"_payload": payload, "_was": obj}
    if kind == "torch":
        torch.save(obj, path)
    else:
        path.write_bytes(pickle.dumps(obj))
    manifest = path.parent / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if path.name in m.get("files", {}):
            data = path.read_bytes()
            m["files"][path.name].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
            manifest.write_text(json.dumps(m, indent=2))


def pickle_trials(engine: str, root: Path) -> dict[str, Any]:
    """A run killed after its first checkpoint; then, for each pickled file of its work_dir
    in turn, the payload put in that file and the run resumed (with torch's defaults, and
    with :data:`TRUSTED_LOAD` where the engine needs it to load its own checkpoint). The
    work_dir keeps its path (a checkpoint may name itself by it), restored in between."""
    base, pristine, log = root / "run", root / "pristine", root / "base.log"
    status = train(engine, base, root / "base.pt", log, PEERS_KILL_AT="6")
    if status != -signal.SIGKILL:
        return {"error": f"the run to kill ended with status {status}: {last_line(log)}"}
    shutil.copytree(base, pristine)
    files = sorted(p.relative_to(base) for p in base.rglob("*") if p.is_file() and pickled(p))
    trials = []
    for i, rel in enumerate(files):
        for env in ({}, TRUSTED_LOAD) if engine in ("mmengine", "ignite") else ({},):
            name = f"{i}{'-trusted' if env else ''}"
            shutil.rmtree(base)
            shutil.copytree(pristine, base)
            marker = root / f"marker-{name}"
            plant(base / rel, marker)
            log = root / f"resume-{name}.log"
            status = train(engine, base, root / f"resume-{name}.pt", log, resume=True, **env)
            trials.append({"file": str(rel), "env": env, "ran_code": marker.exists(), "status": status,
                           "resumed": status == 0, "last_line": "" if status == 0 else last_line(log)})
    return {"trials": trials}
