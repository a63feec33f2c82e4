"""Each default hook left out in turn, timed in one process: what each one costs.

``overhead.py`` compares treadle with its default hooks to a hand-written loop. This
runs, in one process and alternating run by run, the hand loop, treadle with the
default hooks, treadle with one piece left out (the NaN guard, the timer, the final
checkpoint, the writers) and treadle with no optional hook, all on ``overhead.py``'s
model and batches, and prints each one's median microseconds per step and its
difference from the hand loop. Left-out work should show as a smaller difference; how
far the figures stray from that (a configuration doing less work measuring slower) is
the size of the effects that depend on where memory happens to lie, not on work done.

    python benchmarks/hook_ablation.py [--reps 8] [--steps 3000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).parent))

import overhead  # the same model, batches and settings


def treadle_run(leave_out: tuple[str, ...] = (), **kwargs: Any) -> Callable[[int], float]:
    """A function running ``fit()`` for ``steps`` iterations; returns us per step."""

    def run(steps: int) -> float:
        import torch
        from torch import nn

        import treadle

        model, batches = overhead.build(steps)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        with tempfile.TemporaryDirectory() as work_dir:
            trainer = treadle.Trainer(model, work_dir=work_dir, train_dataloader=batches,
                                      loss_fn=nn.CrossEntropyLoss(), optimizer=opt, max_iters=steps,
                                      log_interval=50, progress=False, **kwargs)
            if leave_out:
                trainer.hooks = [h for h in trainer.hooks if type(h).__name__ not in leave_out]
                trainer._rebuild_dispatch()
            start = time.perf_counter()
            trainer.fit()
            return (time.perf_counter() - start) / steps * 1e6

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=8, help="runs of each configuration (at least 2 for a range)")
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
    configs: dict[str, Callable[[int], float]] = {
        "hand-written loop": lambda steps: overhead.run_hand(steps) / steps * 1e6,
        "treadle, default hooks": treadle_run(),
        "  without the NaN guard": treadle_run(nan_guard=False),
        "  without the timer": treadle_run(leave_out=("IterTimerHook",)),
        "  without the final checkpoint": treadle_run(checkpoint=False),
        "  without the writers": treadle_run(log_writers=()),
        "treadle, no optional hook": treadle_run(leave_out=("IterTimerHook", "LoggerHook"), nan_guard=False,
                                                 checkpoint=False, log_writers=()),
    }
    names = list(configs)
    for name in names:
        configs[name](max(args.steps // 10, 50))  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            times[name].append(configs[name](args.steps))
    hand = statistics.median(times["hand-written loop"])
    print(f"overhead.py's MLP, {args.steps} steps, {args.reps} runs of each, alternating, one process, CPU, 1 thread")
    for name in names:
        med = statistics.median(times[name])
        q1, _, q3 = statistics.quantiles(times[name], n=4) if len(times[name]) > 1 else (med,) * 3
        print(f"{name:32s} {med:7.1f} us/step  {med - hand:+6.1f}  (interquartile range {q1:.0f}-{q3:.0f})")


if __name__ == "__main__":
    main()
