"""Per-step overhead of treadle against a hand-written loop (CPU, one thread).

Both train the same tiny MLP on the same in-memory batches with SGD; each
measurement runs in a fresh process, alternating the two, and the medians of the
runs are compared. A process times a short and a long run (after a warm-up): the
slope between them is the steady per-step time, the intercept the fixed cost of a
run (for treadle: the environment record, opening the writers, the final checkpoint).

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
        trainer = treadle.Trainer(model, work_dir=work_dir if hooks == "default" else None, train_dataloader=batches,
                                  loss_fn=nn.CrossEntropyLoss(), optimizer=opt, max_iters=steps, log_interval=50)
        if hooks == "none":
            trainer.hooks = [h for h in trainer.hooks if not isinstance(h, (LoggerHook, treadle.hooks.IterTimerHook))]
            trainer._rebuild_dispatch()
        import logging

        logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
        start = time.perf_counter()
        trainer.fit()
        return time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    short = max(args.steps // 4, 50)
    run = run_hand if args.mode == "hand" else (lambda n: run_treadle(n, args.hooks))
    run(short)  # warm-up: imports, allocator, caches
    t_short = run(short)
    t_long = run(args.steps)
    per_step = (t_long - t_short) / (args.steps - short)
    print(json.dumps({"per_step": per_step, "fixed": t_short - short * per_step, "total_long": t_long}))


def measure(mode: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--steps", str(args.steps), "--hooks", args.hooks]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--hooks", choices=("default", "none"), default="default")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("hand", "treadle"), default="hand", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    hand, tread = [], []
    for _ in range(args.runs):  # alternate so drift affects both equally
        hand.append(measure("hand", args))
        tread.append(measure("treadle", args))

    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    h, t = med(hand, "per_step"), med(tread, "per_step")
    fixed = med(tread, "fixed") - med(hand, "fixed")
    whole = med(tread, "total_long") / med(hand, "total_long")
    print(f"tiny MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD, CPU, 1 thread, {args.steps} steps x {args.runs} runs")
    print(f"hand-written loop : {h * 1e6:8.1f} us/step (median of the per-step slope)")
    print(f"treadle ({args.hooks:7s}): {t * 1e6:8.1f} us/step")
    print(f"per-step ratio {t / h:.4f}   overhead {(t - h) * 1e6:+.1f} us/step")
    print(f"fixed cost per run {fixed * 1e3:+.1f} ms; whole {args.steps}-step run ratio {whole:.4f}")


if __name__ == "__main__":
    main()
