"""Per-step overhead of treadle against a hand-written loop (CPU, one thread).

Both train the same tiny MLP on the same in-memory batches with SGD. Each run is a
fresh process that times both loops, alternating them three times and keeping each
loop's fastest run (the least disturbed), so that what differs between processes
(core, frequency, memory layout) cancels out of its ratio; the median over the
processes is reported. Whole runs are timed, so treadle's fixed cost per run (the
environment record, opening the writers, the final checkpoint) is included in the
ratio; it is also measured alone, as the difference on a 20-step run.

    python benchmarks/overhead.py [--runs 7] [--steps 2000] [--hooks default|none]

``--hooks default``: treadle's default hooks (timer, logger every 50 iterations
writing log.jsonl). ``--hooks none``: every optional hook off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DIM, HIDDEN, CLASSES, BATCH = 128, 256, 10, 64


def build(steps: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    g = torch.Generator().manual_seed(1)
    n_batches = 50
    batches = [(torch.randn(BATCH, DIM, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(n_batches)]
    return model, batches


def run_hand(steps: int) -> float:
    import torch
    from torch import nn

    model, batches = build(steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    start = time.perf_counter()
    done = 0
    while done < steps:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    return time.perf_counter() - start


def run_treadle(steps: int, hooks: str) -> float:
    import torch
    from torch import nn

    import treadle
    from treadle.hooks.logger import LoggerHook

    model, batches = build(steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with tempfile.TemporaryDirectory() as work_dir:
        off = dict(nan_guard=False, checkpoint=False, log_writers=()) if hooks == "none" else {}
        trainer = treadle.Trainer(model, work_dir=work_dir if hooks == "default" else None, train_dataloader=batches,
                                  loss_fn=nn.CrossEntropyLoss(), optimizer=opt, max_iters=steps, log_interval=50, **off)
        if hooks == "none":  # not even the timer and the logger
            trainer.hooks = [h for h in trainer.hooks if not isinstance(h, (LoggerHook, treadle.hooks.IterTimerHook))]
            trainer._rebuild_dispatch()
            assert trainer.hooks == [], trainer.hooks
        import logging

        logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
        start = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    loops = {"hand": run_hand, "treadle": lambda n: run_treadle(n, args.hooks)}
    for run in loops.values():
        run(max(args.steps // 4, 50))  # warm-up: imports, allocator, caches
    times: dict[str, list[float]] = {"hand": [], "treadle": []}
    for rep in range(3):
        for name in (("hand", "treadle") if rep % 2 == 0 else ("treadle", "hand")):
            times[name].append(loops[name](args.steps) / args.steps)
    fixed = min(loops["treadle"](20) for _ in range(3)) - min(loops["hand"](20) for _ in range(3))
    print(json.dumps({"hand": min(times["hand"]), "treadle": min(times["treadle"]), "fixed": fixed}))


def measure(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--hooks", args.hooks]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--hooks", choices=("default", "none"), default="default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    rows = [measure(args) for _ in range(args.runs)]
    ratio = statistics.median(r["treadle"] / r["hand"] for r in rows)
    added = statistics.median(r["treadle"] - r["hand"] for r in rows)
    fixed = statistics.median(r["fixed"] for r in rows)
    h = statistics.median(r["hand"] for r in rows)
    print(f"tiny MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD, CPU, 1 thread, "
          f"{args.steps} steps, {args.runs} fresh processes, hooks={args.hooks}")
    print(f"hand-written loop {h * 1e6:.1f} us/step; per-process ratios: "
          + " ".join(f"{r['treadle'] / r['hand']:.3f}" for r in rows))
    print(f"treadle/hand per-step ratio {ratio:.4f} (median)   added {added * 1e6:+.1f} us/step")
    print(f"fixed cost of a run about {fixed * 1e3:+.1f} ms (environment record, writers, final checkpoint),"
          f" included above")


if __name__ == "__main__":
    main()
