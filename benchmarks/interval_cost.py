"""What the iteration that logs costs, and what it costs the iterations after it.

Whole-run ratios (``overhead.py``) cannot say where treadle's added time goes. This
trains ``overhead.py``'s MLP with treadle's default hooks (log every 50 iterations),
stamps the start of every iteration with a hook that runs first, and groups iteration
durations by their position after the last log: position 0 is the iteration that logs
(the record, the host read, the writers, the NaN guard's look), 1 the one after it, and
so on. Each position's median minus the median of all positions is its excess; their sum
over positions 0-9 is the cost of one log interval to the training thread, the part
that a timing of the logging code alone misses (the steps after it find their code and
data pushed out of the caches). In this benchmark an epoch is 50 batches, so the epoch
boundary falls on the same iteration.

    python benchmarks/interval_cost.py [--runs 5] [--steps 3000] [--writers jsonl,csv,tensorboard] [--no-nan-guard]
                                      [--compare-stack-read] [--floor]

``--compare-stack-read`` alternates, run by run in the same process, the store's read of
CPU values (``item()`` each) with the read it does for device values (one ``stack`` and
one ``tolist``, which CPU values also took before the fourth round), and reports both.
``--floor`` adds runs that log only at their last iteration: the measure is not zero
without a log, since the list of 50 batches restarts at the same position (a hand-written
loop over it shows the same); the log's own cost is the difference.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import overhead  # the same model, batches and settings

INTERVAL = 50


def run(steps: int, writers: tuple[str, ...], nan_guard: bool, interval: int = INTERVAL) -> list[float]:
    """Start times of every iteration of one default-hooks run."""
    import torch
    from torch import nn

    import treadle

    stamps: list[float] = []
    clock = time.perf_counter

    class Stamp(treadle.Hook):
        priority = 0  # before every other hook

        def before_train_iter(self, trainer: treadle.Trainer, batch: object) -> None:
            stamps.append(clock())

    model, batches = overhead.build(steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with tempfile.TemporaryDirectory() as work_dir:
        treadle.Trainer(model, work_dir=work_dir, train_dataloader=batches, loss_fn=nn.CrossEntropyLoss(),
                        optimizer=opt, max_iters=steps, log_interval=interval, progress=False, hooks=[Stamp()],
                        log_writers=writers, nan_guard=nan_guard).fit()
    return stamps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--writers", default="jsonl,csv,tensorboard", help="comma-separated; empty for none")
    p.add_argument("--no-nan-guard", action="store_true")
    p.add_argument("--compare-stack-read", action="store_true",
                   help="alternate the store's CPU read (item each) with its device read (one stack), run by run")
    p.add_argument("--floor", action="store_true",
                   help="also runs that log only at the end: what the measure reads with no log in the interval")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
    writers = tuple(w for w in args.writers.split(",") if w)
    run(500, writers, not args.no_nan_guard)  # warm-up
    from treadle.logging import store

    on_host = store._on_host
    # name -> (the store's host check, the log interval); each run alternates the order
    variants = {"default": (on_host, INTERVAL)}
    if args.compare_stack_read:
        variants["stack"] = (lambda values: False, INTERVAL)
    if args.floor:
        variants["floor"] = (on_host, args.steps)
    labels = {"default": "as shipped:", "stack": "the store reads CPU values with one stack (as on a device):",
              "floor": "floor: no log until the last iteration (the batch list still restarts every 50):"}
    by_position = {name: [[] for _ in range(INTERVAL)] for name in variants}
    for r in range(args.runs):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            store._on_host, interval = variants[name]
            try:
                stamps = run(args.steps, writers, not args.no_nan_guard, interval)
            finally:
                store._on_host = on_host
            for i in range(2 * INTERVAL, len(stamps) - 1):  # iteration i has done i + 1 iterations when it ends
                by_position[name][(i + 1) % INTERVAL].append(stamps[i + 1] - stamps[i])
    print(f"overhead.py's MLP, treadle's default hooks, log every {INTERVAL} iterations, writers={writers}, "
          f"NaN guard {'off' if args.no_nan_guard else 'on'}; {args.runs} runs x {args.steps} steps, CPU, 1 thread")
    totals = {}
    for name, positions in by_position.items():
        medians = [statistics.median(d) for d in positions]
        base = statistics.median(medians)
        excess = [(m - base) * 1e6 for m in medians]
        if len(variants) > 1:
            print(labels[name])
        print(f"median iteration {base * 1e6:.1f} us; excess by position after the log (0 = the iteration that logs):")
        print("  " + "  ".join(f"{k}: {e:+.0f}" for k, e in enumerate(excess[:10])) + " us")
        totals[name] = total = sum(excess[:10])
        print(f"cost of one log interval to the training thread: {total:.0f} us = {total / INTERVAL:.1f} us per iteration")
    if "floor" in totals:
        extra = totals["default"] - totals["floor"]
        print(f"the log itself, above the floor: {extra:.0f} us = {extra / INTERVAL:.1f} us per iteration")


if __name__ == "__main__":
    main()
