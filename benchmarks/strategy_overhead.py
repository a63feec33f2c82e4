"""Per-step cost of treadle's Strategy API against the same loop on raw torch (CPU, gloo).

One hand-written training loop, written twice:

* raw: the model (wrapped by hand in ``DistributedDataParallel`` for 2 processes),
  ``torch.optim.AdamW``, a ``DataLoader`` (a ``DistributedSampler`` for 2 processes,
  ``set_epoch`` each epoch), ``loss.backward()``, ``optimizer.step()``,
  ``optimizer.zero_grad(set_to_none=True)``;
* treadle: ``treadle.build_strategy("single" | "ddp", seed=0)``, ``strategy.prepare(model,
  optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3)))``,
  ``strategy.prepare_dataloader(loader)`` (a ``ResumableLoader``) and
  ``optim_wrapper.update_params(loss)``. No checkpoint is saved.

With 2 processes the raw loop runs twice: with torch's DDP defaults (what a hand-written
loop gets), and with ``gradient_as_bucket_view=True``, the one DDP option whose default
treadle's DDPStrategy changes; treadle's own cost is its ratio to the second. A control
(``--no-control`` leaves it out): the raw loop (torch's defaults) built a second time and
timed like the others, against the first; its ratio, which would be 1 on a quiet machine,
shows how far the ratios stray on this one.

All train copies of one MLP (``--dim``-``--hidden``-``--hidden``-10, 0.4 M parameters by
default, a few ms a step on one thread) on the same in-memory data, ``--batch`` samples
per process and step, ``--steps`` steps per epoch and process. For each number of
processes (``--worlds``) the script starts fresh processes of itself (for 2: torchrun's
variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; gloo; one intra-op
thread each, as the machine has 2 cores). Each process builds every loop, then times
whole epochs of them in turn, the order reversed every other round (raw, treadle,
treadle, raw, ...): ``--warmup`` rounds left out, then ``--reps`` rounds. With 2
processes an epoch is timed between two barriers and the slower rank's time is kept.
Reported per number of processes: each loop's median time per step, the ratio of those
medians, and the median over rounds of the ratio within a round with its interquartile
range (a round's epochs run back to back, so slow drifts of the machine cancel out of
it). ``--runs`` repeats it all in fresh processes, the numbers of processes taking turns.
Last, treadle's own per-step work is timed apart from any model (see :func:`isolated`): a
few microseconds, far below what the ratios can resolve on a shared machine.

    python benchmarks/strategy_overhead.py [--runs 2] [--reps 20] [--warmup 3] [--steps 100]
                                           [--worlds 1,2] [--clock wall|cpu]

``--clock cpu`` times the CPU each process used (``time.process_time``), which other
work on a shared machine disturbs less than the wall clock; waiting for the other rank
is not counted then.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]  # this checkout's treadle, here and in the children

import overhead  # noqa: E402  (its clocks and ratio quartiles)

GOALS = {1: 1.02, 2: 1.03}  # treadle/raw per step, stated in the issue
LR = 1e-3


def make_data(args: argparse.Namespace, world: int) -> Any:
    """Every process's share of ``--steps`` batches per epoch, in memory."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1)
    n = args.steps * args.batch * world
    return TensorDataset(torch.randn(n, args.dim, generator=g), torch.randint(0, 10, (n,), generator=g))


def make_model(args: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                         nn.Linear(args.hidden, 10))


def raw_loop(module: Any, data: Any, args: argparse.Namespace, world: int, bucket_view: bool = False
             ) -> Callable[[], int]:
    """The loop on torch alone; returns a function that trains one epoch and returns its steps."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler

    model = module
    sampler = None
    if world > 1:
        model = nn.parallel.DistributedDataParallel(module, gradient_as_bucket_view=bucket_view)
        sampler = DistributedSampler(data, shuffle=True, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(data, batch_size=args.batch, shuffle=sampler is None, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    epoch = 0

    def train_epoch() -> int:
        nonlocal epoch
        if sampler is not None:
            sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            loss_fn(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return len(loader)

    return train_epoch


def treadle_loop(strategy: Any, module: Any, data: Any, args: argparse.Namespace) -> Callable[[], int]:
    """The same loop through treadle's Strategy API."""
    from torch import nn
    from torch.utils.data import DataLoader

    model, optim_wrapper = strategy.prepare(module, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=LR)))
    loader = strategy.prepare_dataloader(DataLoader(data, batch_size=args.batch, shuffle=True))
    loss_fn = nn.CrossEntropyLoss()

    def train_epoch() -> int:
        for x, y in loader:
            optim_wrapper.update_params(loss_fn(model(x), y))
        return len(loader)

    return train_epoch


def time_loops(args: argparse.Namespace, world: int) -> dict[str, Any] | None:
    """Build every loop in this process and time them in turn; rank 0's results."""
    import copy

    import torch.distributed as dist

    import treadle
    from treadle.env import collect_env

    clock = overhead.CLOCKS[args.clock]
    # treadle starts the process group (as it would for its user); the raw loops' DDP uses it too
    strategy = treadle.build_strategy("ddp" if world > 1 else "single", seed=0)
    data, module = make_data(args, world), make_model(args)
    loops = {"raw": raw_loop(copy.deepcopy(module), data, args, world)}
    if world > 1:
        loops["raw_bucket_view"] = raw_loop(copy.deepcopy(module), data, args, world, bucket_view=True)
    if args.control:  # the raw loop once more: what the ratio of two identical loops reads here
        loops["raw_again"] = raw_loop(copy.deepcopy(module), data, args, world)
    loops["treadle"] = treadle_loop(strategy, copy.deepcopy(module), data, args)
    sync = dist.barrier if world > 1 else (lambda: None)

    def timed(name: str) -> float:
        sync()
        start = clock()
        steps = loops[name]()
        sync()
        return (clock() - start) / steps

    times: dict[str, list[float]] = {name: [] for name in loops}
    for rep in range(args.warmup + args.reps):
        for name in (list(loops) if rep % 2 == 0 else list(loops)[::-1]):
            t = timed(name)
            if rep >= args.warmup:
                times[name].append(t)
    if world > 1:  # an epoch ends when its slower rank's does
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, times)
        times = {k: [max(ts) for ts in zip(*(g[k] for g in gathered))] for k in times}
    if strategy.rank != 0:
        return None
    params = sum(p.numel() for p in module.parameters())
    return {"times": times, "params": params, "env": collect_env(seed=0, world_size=world)}


def child(args: argparse.Namespace) -> None:
    import logging

    import torch

    torch.set_num_threads(1)
    logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
    world = int(os.environ.get("WORLD_SIZE", "1"))
    result = time_loops(args, world)
    if world > 1:
        # After time_loops has returned: its DDP models' reducers hold the process group,
        # and one freed after shutdown() drops the group's last reference holding the GIL,
        # which hangs when a gloo worker is waiting for the GIL (see comm.shutdown).
        from treadle.distributed import comm

        comm.shutdown()
    if result is not None:
        print(json.dumps(result))


def measure(args: argparse.Namespace, world: int) -> dict[str, Any]:
    """Run ``world`` fresh processes of this script; rank 0's JSON."""
    cmd = [sys.executable, __file__, "--child", *args.passed]
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if world > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port))
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**base, **({"RANK": str(r), "LOCAL_RANK": str(r)} if world > 1 else {})})
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"{world} process(es): not done after {args.timeout} s; command {shlex.join(cmd)}") from None
    failed = [r for r, p in enumerate(procs) if p.returncode]
    if failed:
        raise SystemExit(f"{world} process(es): rank(s) {failed} failed; command {shlex.join(cmd)}")
    return json.loads(outs[0].strip().splitlines()[-1])


def isolated(reps: int = 201, n: int = 100) -> dict[str, tuple[float, float]]:
    """treadle's own Python per step, apart from any model: ``(raw, treadle)`` us per
    step for taking a batch (a DataLoader of batch size 1 over ``n`` samples, an epoch at
    a time; treadle: the same loader through ``prepare_dataloader``) and for the update
    (backward, step, zero_grad of a one-element parameter with SGD; treadle: ``update_params``).
    Medians of ``reps`` epochs of ``n`` steps, the two variants alternating."""
    import logging

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import treadle

    torch.set_num_threads(1)
    logging.getLogger("treadle").setLevel(logging.WARNING)
    strategy = treadle.build_strategy("single", seed=0)
    param = torch.nn.Parameter(torch.zeros(1, 1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    model, optim_wrapper = strategy.prepare(torch.nn.Linear(1, 1, bias=False),
                                            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    data = TensorDataset(torch.zeros(n, 1))
    loader = DataLoader(data, batch_size=1, shuffle=True)
    prepared = strategy.prepare_dataloader(DataLoader(data, batch_size=1, shuffle=True))

    def update_raw() -> None:
        for _ in range(n):
            loss = (param * 2).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def update_treadle() -> None:
        for _ in range(n):
            optim_wrapper.update_params((model.weight * 2).sum())

    cases = {"batch": ((lambda: [None for _ in loader]), (lambda: [None for _ in prepared])),
             "update": (update_raw, update_treadle)}
    out = {}
    for name, fns in cases.items():
        times: tuple[list[float], list[float]] = ([], [])
        for rep in range(reps):
            for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
                start = time.perf_counter()
                fns[i]()
                times[i].append((time.perf_counter() - start) / n * 1e6)
        out[name] = (statistics.median(times[0]), statistics.median(times[1]))
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor() or "unknown"
    except OSError:
        return platform.processor() or "unknown"


def summary(rows: list[dict[str, Any]], raw: str, other: str = "treadle") -> dict[str, Any]:
    """The loop ``other`` against the raw loop ``raw``, over every round of every run."""
    runs = [list(zip(r["times"][raw], r["times"][other])) for r in rows]
    pairs = [pair for run in runs for pair in run]
    q1, med, q3 = overhead.ratio_quartiles(pairs)
    h, t = statistics.median(h for h, _ in pairs), statistics.median(t for _, t in pairs)
    return {"raw": h, "other": t, "pairs": len(pairs), "ratio_of_medians": t / h, "pair_ratio": med, "q1": q1,
            "q3": q3, "per_run": [overhead.ratio_quartiles(run)[1] for run in runs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default, text in (
            ("runs", 2, "fresh sets of processes per number of processes"),
            ("reps", 20, "timed rounds (an epoch of each loop) in each run"),
            ("warmup", 3, "rounds run first and left out"),
            ("steps", 100, "steps per epoch and process"),
            ("batch", 64, "samples per step and process"),
            ("dim", 256, "the MLP's input width"),
            ("hidden", 512, "the MLP's hidden width")):
        p.add_argument(f"--{name}", type=int, default=default, help=text)
    p.add_argument("--worlds", default="1,2", help="numbers of processes, comma-separated")
    p.add_argument("--clock", choices=tuple(overhead.CLOCKS), default="wall")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="leave out the control: the raw loop timed twice, against itself")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a set of processes may take")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    args.passed = [a for a in sys.argv[1:] if a != "--child"]
    worlds = [int(w) for w in args.worlds.split(",")]
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    rows: dict[int, list[dict[str, Any]]] = {w: [] for w in worlds}
    for _ in range(args.runs):
        for w in worlds:
            rows[w].append(measure(args, w))
    from treadle.env import format_env

    env = dict(rows[worlds[0]][0]["env"])
    for key in ("world size", "seed", "CUDA available"):
        env.pop(key, None)
    env.update({"CPU": cpu_model(), "load average at start": " ".join(f"{x:.2f}" for x in load),
                "date": time.strftime("%Y-%m-%d %H:%M")})
    print(format_env(env))
    params = rows[worlds[0]][0]["params"]
    print(f"MLP {args.dim}-{args.hidden}-{args.hidden}-10 ({params / 1e6:.2f} M parameters), AdamW, batch "
          f"{args.batch} per process, {args.steps} steps per epoch, CPU, 1 thread per process, gloo, "
          f"clock={args.clock}; {args.runs} run(s) x {args.reps} rounds of one epoch of each loop "
          f"({args.warmup} warm-up rounds left out)")
    print()
    print("| processes | loop | against raw loop | raw ms/step | loop ms/step | loop/raw (medians) "
          "| per-round ratio, median [IQR] | per-run medians | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w in worlds:
        for other, raw, label in (("treadle", "raw", "torch defaults" if w > 1 else "raw"),
                                  ("treadle", "raw_bucket_view", "DDP gradient_as_bucket_view=True, as treadle's"),
                                  ("raw_again", "raw", "itself (control)")):
            if raw not in rows[w][0]["times"] or other not in rows[w][0]["times"]:
                continue
            s = summary(rows[w], raw, other)
            goal = GOALS.get(w) if other == "treadle" else None
            met = "" if goal is None else f"<= {goal:.2f}: {'met' if s['pair_ratio'] <= goal else 'NOT met'}"
            print(f"| {w} | {'raw' if other == 'raw_again' else other} | {label} | {s['raw'] * 1e3:.3f} | "
                  f"{s['other'] * 1e3:.3f} | {s['ratio_of_medians']:.4f} | "
                  f"{s['pair_ratio']:.4f} [{s['q1']:.4f}-{s['q3']:.4f}], {s['pairs']} rounds | "
                  f"{' '.join(f'{r:.3f}' for r in s['per_run'])} | {met} |")
    print()
    alone = isolated()
    added = sum(t - h for h, t in alone.values())
    print("treadle's own per-step work, measured alone (one process, alternating, medians of 201 epochs of 100 steps): "
          + "; ".join(f"{name} {h:.2f} -> {t:.2f} us ({t - h:+.2f})" for name, (h, t) in alone.items())
          + f"; together {added:+.2f} us/step = {added / (summary(rows[worlds[0]], 'raw')['raw'] * 1e6):.2%} of a "
          f"{worlds[0]}-process step")


if __name__ == "__main__":
    main()
