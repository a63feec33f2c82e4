"""treadle beside its peers: a hand-written loop, treadle, Lightning, Accelerate, MMEngine and
Ignite train the same model on the same data with the same settings; one table of the figures.

Every run is a fresh process (``benchmarks/peers_run.py``, which holds the workloads and the
runners); the runners alternate (hand, treadle, ..., then the reverse order in the next
repetition), so a slow drift of the machine falls on all of them. Figures of each run:

* steady state: ms per step from the start of step ``--warmup`` to the end of the last
  step, the clock read after a device synchronization at both marks on CUDA (none between);
  wall time, or with ``--clock process`` (CPU only) the CPU time of the run's process, all
  its threads: on a machine shared with other work, the steadier measure of the work done;
* whole fit: seconds from the process's start to the end of its fit (interpreter start,
  imports, CUDA context, building the data and the model, the framework's setup and its
  fit, device synchronized), process exit left out;
* the loss of the last step, which must be close to the hand loop's: a runner that trains
  something else is flagged below the table.

Each cell is the median over ``--reps`` runs with the range (min to max); a ratio is the
median of the per-repetition ratios to the hand loop's run of the same repetition.

The same settings everywhere: the model built under ``torch.manual_seed(0)``; AdamW with
the same arguments (``fused=True`` on CUDA, given to every runner); fp32 on the CPU
(``--threads`` torch threads, 1 by default), bf16 autocast on CUDA (Lightning
``bf16-mixed``, Accelerate ``mixed_precision="bf16"``, MMEngine ``AmpOptimWrapper``, which
keeps its GradScaler; Ignite through ``model_fn``); no gradient clipping or accumulation; the data a custom map-style
Dataset through a DataLoader, in order (no shuffle, so every runner sees the same batches),
no workers, one epoch. By default each item is a whole batch made ahead (pinned on CUDA:
the engine's work is what is left to time); ``--per-sample`` makes items samples that the
loader collates. Each framework as its user gets it, with its default logging on: treadle's
logger every 50 steps into a work_dir (log.txt, log.jsonl, log.csv, TensorBoard), timer, NaN
guard; Lightning's default logger with ``self.log("loss", ...)`` every step (written every
50); MMEngine's default hooks (logger every 10 steps, with its console output; a
``.item()`` per step in its runtime-info hook); Ignite's ``create_supervised_trainer`` with its
default ``output_transform`` (the loss's ``.item()`` every step); Accelerate and the hand loop log
nothing.
Progress bars off, checkpointing off (treadle ``checkpoint=False``, Lightning
``enable_checkpointing=False``, MMEngine's checkpoint hook None). How batches reach the
device is each framework's default: ``non_blocking=True`` in the hand loop, treadle and
Lightning, a blocking copy in Accelerate and MMEngine.

Workloads (sizes by device, see ``SIZES`` in peers_run.py): ``mlp``, launch-bound
(512-1024-1024-10, batch 512 on CUDA); ``cnn``, a ResNet-18 for 32x32 images written here
(batch 256 on CUDA); ``gpt2``, the decoder of benchmarks/gpt2.py (124M, batch 16 x 1024
on CUDA; a tiny one on the CPU).

    .venv-peers/bin/python benchmarks/peers.py                       # `make peers-venv` first
    .venv-peers/bin/python benchmarks/peers.py --quick --device cuda # no run started after 120 s
    python benchmarks/peers.py --runners hand,treadle --workloads mlp --reps 5

A runner whose package is missing is shown as "not installed"; one that fails, with the
last line of its error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peers_run  # noqa: E402

RUNNERS = tuple(peers_run.RUNNERS)
NAMES = {"hand": "hand loop", "treadle": "treadle", "lightning": "Lightning", "accelerate": "Accelerate",
         "mmengine": "MMEngine", "ignite": "Ignite"}
# (warmup, timed steps) by workload and device type; --quick's are the second pair.
STEPS = {"cuda": {"mlp": ((50, 500), (30, 200)), "cnn": ((20, 100), (10, 40)), "gpt2": ((5, 30), (3, 10))},
         "cpu": {"mlp": ((50, 1000), (10, 60)), "cnn": ((3, 30), (2, 6)), "gpt2": ((10, 200), (5, 30))}}
LOSS_TOLERANCE = {"cpu": 1e-3, "cuda": 3e-2}  # relative to the hand loop's last loss; bf16 on CUDA


def run_once(runner: str, workload: str, warmup: int, steps: int, args: argparse.Namespace) -> dict:
    """One run in a fresh process: its RESULT, with ``whole_s`` added, or ``{"error": ...}``."""
    cmd = [sys.executable, str(HERE / "peers_run.py"), runner, workload, "--device", args.device,
           "--warmup", str(warmup), "--steps", str(steps), "--threads", str(args.threads)]
    if args.per_sample:
        cmd.append("--per-sample")
    if args.clock != "wall":
        cmd += ["--clock", args.clock]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    if args.device == "cpu":
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    started = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {p.returncode}: {last[:160]}"}
    result = json.loads(lines[-1][len("RESULT "):])
    if "fit_end" in result:
        result["whole_s"] = result["fit_end"] - started
    return result


def spread(values: list[float], fmt: str) -> str:
    """Median, and the range when there is more than one value; "" for none."""
    if not values:
        return ""
    med = format(statistics.median(values), fmt)
    if len(values) < 2:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def ratios(runs: list[dict], hand: list[dict], key: str) -> list[float]:
    """Per-repetition ratios of ``key`` to the hand loop's run of the same repetition."""
    return [r[key] / h[key] for r, h in zip(runs, hand) if "error" not in r and "error" not in h]


def table(results: dict, args: argparse.Namespace, plan: dict) -> list[str]:
    rows = ["| workload | runner | steady ms/step | x hand | whole fit s | x hand | loss at the last step | vs hand |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    flagged = []
    for workload, by_runner in results.items():
        warmup, steps = plan[workload]
        hand = by_runner.get("hand", [])
        hand_ok = [h for h in hand if "error" not in h and "missing" not in h]
        what = f"{workload}: {peers_run.describe(workload, args.device)}, {warmup}+{steps} steps"
        for runner, runs in by_runner.items():
            name = NAMES[runner]
            ok = [r for r in runs if "error" not in r and "missing" not in r]
            if any("missing" in r for r in runs) or not ok:
                why = ("not installed" if any("missing" in r for r in runs) else
                       f"failed: {runs[0]['error']}".replace("|", "/") if runs else "not run (the time budget ran out)")
                rows.append(f"| {what} | {name} | {why} | | | | | |")
                what = ""
                continue
            name += "" if runner == "hand" else f" {ok[0]['version']}"
            if len(ok) < len(runs):
                name += f" ({len(runs) - len(ok)} of {len(runs)} failed)"
            ms = [r["steady_s"] / r["steady_steps"] * 1e3 for r in ok]
            whole = [r["whole_s"] for r in ok]
            loss = statistics.median(r["loss"] for r in ok)
            cells = [spread(ms, ".3f"), "", spread(whole, ".2f"), "", f"{loss:.6g}", ""]
            if hand_ok and runner != "hand":
                cells[1] = spread(ratios(runs, hand, "steady_s"), ".3f")  # "" when no repetition has both
                cells[3] = spread(ratios(runs, hand, "whole_s"), ".2f")
                hand_loss = statistics.median(h["loss"] for h in hand_ok)
                rel = abs(loss - hand_loss) / max(abs(hand_loss), 1e-12)
                cells[5] = ("0" if rel == 0 else f"{rel:.1e}") + (" (!)" if rel > LOSS_TOLERANCE[args.device] else "")
                if rel > LOSS_TOLERANCE[args.device]:
                    flagged.append(f"{workload}/{runner}: loss {loss:.6g} against the hand loop's {hand_loss:.6g}")
            rows.append(f"| {what} | {name} | " + " | ".join(cells) + " |")
            what = ""  # the workload named once
    if flagged:
        rows += ["", "(!) trained something else than the hand loop (relative loss difference over "
                 f"{LOSS_TOLERANCE[args.device]:g}): " + "; ".join(flagged)]
    return rows


def machine(results: dict, args: argparse.Namespace) -> str:
    """The device (as a run saw it), Python and torch."""
    import torch

    runs = [r for by_runner in results.values() for rs in by_runner.values() for r in rs if "device_name" in r]
    if args.device == "cuda":
        where = runs[0]["device_name"] if runs else "CUDA"
    else:
        cpu = Path("/proc/cpuinfo")
        lines = cpu.read_text().splitlines() if cpu.exists() else []
        model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())
        where = f"CPU ({model}, {os.cpu_count()} cores), {args.threads} torch thread(s)"
    return f"{where}; Python {platform.python_version()}, torch {torch.__version__}"


def settings_differ(results: dict) -> list[str]:
    """Runs whose torch threads or cudnn.benchmark ended unlike the hand loop's (a framework changed them)."""
    out = []
    for w, by_runner in results.items():
        hand = next((r for r in by_runner.get("hand", []) if "threads" in r), None)
        for runner, runs in by_runner.items():
            for r in runs:
                for key in ("threads", "cudnn_benchmark"):
                    if hand and key in r and r[key] != hand[key]:
                        out.append(f"{w}/{runner}: {key} {r[key]} (hand loop: {hand[key]})")
    return sorted(set(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="mlp,cnn,gpt2", help="comma-separated, of: " + ", ".join(peers_run.SIZES))
    p.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, of: " + ", ".join(RUNNERS))
    p.add_argument("--reps", type=int, default=None, help="runs of each runner (default 3; 2 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default by workload and device)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default by workload and device)")
    p.add_argument("--quick", action="store_true", help="fewer steps and 2 reps: about 2 minutes on an H100")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--per-sample", action="store_true", help="items are samples collated by the loader")
    p.add_argument("--clock", choices=("wall", "process"), default="wall",
                   help="steady state in wall time, or in the CPU time of the run's process (CPU only: steadier "
                        "on a machine shared with other work)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run (default 600; 60 with --quick)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds after which no run is started (default none; 120 with --quick)")
    p.add_argument("--json", default=None, help="write every run's result to this file")
    args = p.parse_args()
    workloads, runners = args.workloads.split(","), args.runners.split(",")
    for value, known, what in ((workloads, peers_run.SIZES, "--workloads"), (runners, RUNNERS, "--runners")):
        bad = [v for v in value if v not in known]
        if bad:
            p.error(f"{what} {','.join(bad)}: unknown; expected a comma-separated list of {', '.join(known)}")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.clock == "process" and args.device != "cpu":
        p.error("--clock process: CPU only (on CUDA the process's CPU time leaves out the device's work)")
    reps = args.reps or (2 if args.quick else 3)
    args.timeout = args.timeout or (60 if args.quick else 600)
    if args.budget is None and args.quick:
        args.budget = 120.0
    plan = {}
    for w in workloads:
        warmup, steps = STEPS[args.device][w][1 if args.quick else 0]
        plan[w] = (warmup if args.warmup is None else args.warmup, steps if args.steps is None else args.steps)

    begun = time.perf_counter()
    missing: set[str] = set()
    results: dict[str, dict[str, list[dict]]] = {w: {r: [] for r in runners} for w in workloads}
    done = skipped = 0
    for rep in range(reps):  # repetitions outermost: a budget that runs out leaves every workload a run
        for w in workloads:
            for r in (runners if rep % 2 == 0 else runners[::-1]):
                if r in missing:  # known since an earlier workload or repetition
                    results[w][r][:1] = [{"missing": r}]
                    continue
                if args.budget and time.perf_counter() - begun > args.budget:
                    skipped += 1
                    continue
                res = run_once(r, w, *plan[w], args)
                results[w][r].append(res)
                done += 1
                if "missing" in res:
                    missing.add(r)
                    print(f"  {w} {r}: not installed ({res['missing']})", flush=True)
                elif "error" in res:
                    print(f"  {w} {r} rep {rep + 1}: {res['error']}", flush=True)
                else:
                    print(f"  {w} {r} rep {rep + 1}: {res['steady_s'] / res['steady_steps'] * 1e3:.3f} ms/step, "
                          f"whole fit {res['whole_s']:.2f} s, loss {res['loss']:.6g}", flush=True)
    cut = f"; {skipped} runs left out at the {args.budget:g} s budget" if skipped else ""
    print(f"\n{done} runs ({len(workloads)} workloads, {len(runners)} runners, {reps} reps) in "
          f"{time.perf_counter() - begun:.0f} s{cut}\n")
    print(f"{machine(results, args)}; data: {'samples collated by the loader' if args.per_sample else 'whole batches'}"
          f"; steady state in {args.clock} time; median (min-max) of {reps} runs\n")
    print("\n".join(table(results, args, plan)))
    for line in settings_differ(results):
        print(f"note: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "plan": plan, "results": results}, indent=1))


if __name__ == "__main__":
    main()
