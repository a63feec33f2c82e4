"""The GPU check: what a machine with CUDA must show before treadle is called good there.

    python tools/gpu_check.py                  # on a GPU machine (make test-gpu): about 5 minutes on one GPU
    python tools/gpu_check.py --device cpu     # the same steps on the CPU: a dry run of the check itself
    python tools/gpu_check.py --skip fast-tier --out DIR

Steps, each in a fresh process with a time limit, each a row of the table printed last:

1. ``fast-tier``: the test suite less the ``slow`` tests, on whatever device the tests pick
   (CUDA where present: references are built there, tests/support.py ``DEVICE``).
2. ``tests/gpu``: no device sync in the steady state, pinned loaders (skipped without CUDA).
3. ``resume-*``: exact resume after SIGKILL (tools/gpu_resume.py) in bf16, fp16, DDP and
   FSDP over every GPU present (one process per GPU; two gloo processes on the CPU), and
   with ``torch.compile``.
4. ``gpt2``: benchmarks/gpt2.py, GPT-2 124M tokens/s of treadle against a hand loop
   (``--tiny`` on the CPU).
5. ``overhead``: benchmarks/overhead.py on the device, a launch-bound MLP: treadle's per-step
   cost over a hand loop.
6. ``host-time``: benchmarks/host_time.py, the default Trainer fed by a custom map-style
   Dataset against the same hand loop (``host-time-batches``: whole batches made ahead).
7. ``peers``: benchmarks/peers.py --quick, treadle beside Lightning, Accelerate and MMEngine
   (those installed), its table in peers.log.

Each step's whole output goes to ``--out`` (default ``$OUT`` when set, else
``runs/gpu_check``). Exits 1 when a step failed. treadle need not be installed: the
steps run with this checkout on ``PYTHONPATH`` (a GPU image whose Python cannot install
anything runs the check as it is; tests of extras it lacks, such as deepspeed, skip).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(device: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run stays on the CPU on a machine with GPUs too
    return env


def _run(name: str, cmd: list[str], out: Path, device: str, timeout: float) -> tuple[int | None, str, float]:
    """(exit code or None on timeout, the output, seconds); the output is kept in out/name.log."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(device), capture_output=True, text=True, timeout=timeout)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        text += f"\n[gpu_check] timed out after {timeout:.0f} s"
    (out / f"{name.replace('/', '-')}.log").write_text(text)
    return code, text, time.perf_counter() - start


def _pytest_summary(text: str) -> str:
    lines = [ln.strip("= ") for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    return lines[-1] if lines else "no pytest summary"


def steps(args: argparse.Namespace) -> list[tuple[str, list[str], float, Callable[[str, int], tuple[bool, str]]]]:
    """(name, command, time limit in s, how to read its output: (text, exit code) -> (ok, figure))."""
    py, cuda = sys.executable, args.device == "cuda"

    def pytest_result(text: str, code: int) -> tuple[bool, str]:
        return code == 0, _pytest_summary(text)

    def resume_result(text: str, code: int) -> tuple[bool, str]:
        try:
            r = json.loads(text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return False, "no result line"
        if r.get("error"):
            return False, r["error"]
        return r["equal"], (f"bit-exact, {r['tensors']} tensors" if r["equal"]
                            else f"{len(r['differ'])}+ tensors differ: {', '.join(r['differ'][:3])}")

    def gpt2_result(text: str, code: int) -> tuple[bool, str]:
        m = re.search(r"treadle/hand throughput ratio ([\d.]+)", text)
        rates = re.findall(r"^(hand|treadle)\s+([\d,]+) tokens/s", text, re.M)
        if code != 0 or not m:
            return False, "no ratio"
        return True, f"treadle/hand {m.group(1)} ({', '.join(f'{n} {r}' for n, r in rates)} tokens/s)"

    def overhead_result(text: str, code: int) -> tuple[bool, str]:
        m = re.search(r"treadle/hand per-step ratio ([\d.]+) .*added ([+-][\d.]+) us/step", text)
        hand = re.search(r"hand-written loop ([\d.]+) us/step", text)
        if code != 0 or not m:
            return False, "no ratio"
        return True, f"{m.group(1)}x, {m.group(2)} us/step on {hand.group(1) if hand else '?'} us"

    def host_time_result(text: str, code: int) -> tuple[bool, str]:
        m = re.search(r"host_time ratio ([\d.]+) \(IQR ([\d.]+-[\d.]+)\) hand ([\d.]+) us/step .*\(([+-][\d.]+) us/step\)",
                      text)
        if code != 0 or not m:
            return False, "no ratio"
        return True, f"{m.group(1)}x (IQR {m.group(2)}), {m.group(4)} us/step on {m.group(3)} us"

    def peers_result(text: str, code: int) -> tuple[bool, str]:
        rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
        return code == 0 and len(rows) > 1, f"table in peers.log ({max(len(rows) - 1, 0)} rows)"

    resume = [py, "tools/gpu_resume.py", "--device", args.device]
    out = [
        ("fast-tier", [py, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"], 900, pytest_result),
        ("tests/gpu", [py, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", "-rs"], 300, pytest_result),
        ("resume-bf16", [*resume, "--precision", "bf16"], 300, resume_result),
        ("resume-fp16", [*resume, "--precision", "16"], 300, resume_result),
        ("resume-ddp-bf16", [*resume, "--precision", "bf16", "--strategy", "ddp"], 300, resume_result),
        # FSDP restarts an open accumulation window on resume (its sharded gradients are not
        # saved: docs/strategy.md): its checkpoint falls between windows.
        ("resume-fsdp", [*resume, "--precision", "32", "--strategy", "fsdp", "--save-every", "4"], 300,
         resume_result),
        ("resume-compile", [*resume, "--precision", "bf16" if cuda else "32", "--compile"], 600, resume_result),
        ("gpt2", [py, "benchmarks/gpt2.py", *([] if cuda else ["--tiny", "--device", "cpu"])], 600, gpt2_result),
        ("overhead", [py, "benchmarks/overhead.py", "--device", args.device, "--runs", "2", "--reps", "4",
                      "--steps", "1000" if cuda else "300"], 600, overhead_result),
        # The default Trainer fed by a custom map-style Dataset against a hand loop (issue #33):
        # samples collated by the loader, and whole batches made ahead (batch_size=None).
        ("host-time", [py, "benchmarks/host_time.py", "--device", args.device,
                       *([] if cuda else ["--runs", "2", "--reps", "2", "--epochs", "3"])], 300, host_time_result),
        ("host-time-batches", [py, "benchmarks/host_time.py", "--device", args.device, "--batch-size", "None",
                               *([] if cuda else ["--runs", "2", "--reps", "2", "--epochs", "3"])], 300,
         host_time_result),
        # The same, on the training thread's CPU clock: the host's work without the device's
        # waits, to tell host cost from how the wall clock overlaps with the GPU.
        ("host-time-batches-thread", [py, "benchmarks/host_time.py", "--device", args.device, "--batch-size", "None",
                                      "--clock", "thread", "--stat", "min",
                                      *([] if cuda else ["--runs", "2", "--reps", "2", "--epochs", "3"])], 300,
         host_time_result),
        # treadle beside Lightning and Accelerate (MMEngine where installed): one table.
        ("peers", [py, "benchmarks/peers.py", "--quick", "--device", args.device], 300, peers_result),
    ]
    return [s for s in out if s[0] not in args.skip]


def describe_machine(device: str) -> str:
    code = ("import torch, platform; c = torch.cuda.is_available(); "
            "print(f'torch {torch.__version__}, Python {platform.python_version()}, ' + "
            "(f'{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}' "
            "if c else 'no CUDA device'))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(device), capture_output=True, text=True)
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--skip", nargs="*", default=[], help="step names to leave out (e.g. fast-tier gpt2)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "runs" / "gpu_check"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(args.device)
    if args.device == "cuda" and "no CUDA" in machine:
        print(f"gpu_check: {machine}; run it on a machine with a GPU, or pass --device cpu for a dry run")
        return 2
    print(f"gpu_check on {args.device}: {machine}", flush=True)
    rows = []
    for name, cmd, limit, read in steps(args):
        code, text, seconds = _run(name, cmd, out, args.device, limit)
        ok, figure = read(text, code) if code is not None else (False, f"timed out after {limit} s")
        rows.append((name, "ok" if ok else "FAILED", figure, seconds))
        print(f"  {name:16s} {'ok' if ok else 'FAILED':6s} {seconds:6.0f} s  {figure}", flush=True)
    total = sum(r[3] for r in rows)
    table = [f"GPU check ({args.device}): {machine}", "", "| step | result | figure | seconds |",
             "| --- | --- | --- | --- |", *(f"| {n} | {r} | {f} | {s:.0f} |" for n, r, f, s in rows),
             f"| total | {'ok' if all(r[1] == 'ok' for r in rows) else 'FAILED'} | | {total:.0f} |"]
    (out / "summary.md").write_text("\n".join(table) + "\n")
    print("\n" + "\n".join(table))
    return 0 if all(r[1] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
