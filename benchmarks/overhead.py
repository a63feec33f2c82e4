"""Per-step overhead of treadle against a hand-written loop (CPU, one thread).

Both train the same tiny MLP on the same in-memory batches with SGD for the same
number of steps; each measurement runs in a fresh process, alternating the two,
and the median of the runs is compared.

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
    warm = max(args.steps // 10, 50)
    if args.mode == "hand":
        run_hand(warm)
        elapsed = run_hand(args.steps)
    else:
        run_treadle(warm, args.hooks)
        elapsed = run_treadle(args.steps, args.hooks)
    print(json.dumps({"seconds": elapsed}))


def measure(mode: str, args: argparse.Namespace) -> float:
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--steps", str(args.steps), "--hooks", args.hooks]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"] / args.steps


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
    h, t = statistics.median(hand), statistics.median(tread)
    print(f"tiny MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD, CPU, 1 thread, {args.steps} steps x {args.runs} runs")
    print(f"hand-written loop : {h * 1e6:8.1f} us/step (median)")
    print(f"treadle ({args.hooks:7s}): {t * 1e6:8.1f} us/step (median)")
    print(f"ratio {t / h:.4f}   overhead {(t - h) * 1e6:+.1f} us/step")


if __name__ == "__main__":
    main()
