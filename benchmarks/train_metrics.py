"""The per-step cost of ``train_metrics=``: whole runs with and without them, and the
update timed apart.

In one process, alternating run by run, on ``overhead.py``'s model and batches (MLP
128-256-256-10, batch 64, CPU, one thread), ``fit()`` with the default hooks and no train
metrics, with ``train_metrics={"acc": Accuracy()}``, and with ``Accuracy()`` and
``Accuracy(topk=5)``; the median microseconds per step of each and the difference from the
first. Then ``TrainMetrics.update`` alone on one batch's outputs (64 x 10), the work each
step adds, free of the run-to-run noise.

    python benchmarks/train_metrics.py [--reps 8] [--steps 3000]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from hook_ablation import treadle_run  # overhead.py's model and batches


def update_alone(topks: tuple[int, ...], number: int = 20000) -> float:
    """Microseconds per ``TrainMetrics.update`` call on 64 x 10 outputs (median of 5)."""
    import torch

    import treadle
    from treadle.hooks.train_metrics import TrainMetrics

    metrics = TrainMetrics({f"top{k}": treadle.Accuracy(topk=k) for k in topks})
    outputs, targets = torch.randn(64, 10), torch.randint(0, 10, (64,))
    times = timeit.repeat(lambda: metrics.update(outputs, targets), number=number, repeat=5)
    return statistics.median(times) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=8, help="runs of each configuration (at least 2 for a range)")
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
    configs = {
        "no train metrics": treadle_run(),
        "train_metrics acc": treadle_run(train_metrics={"acc": {"type": "Accuracy"}}),
        "train_metrics acc + top5": treadle_run(train_metrics={"acc": {"type": "Accuracy"},
                                                               "top5": {"type": "Accuracy", "topk": 5}}),
    }
    names = list(configs)
    for name in names:
        configs[name](max(args.steps // 10, 50))  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            times[name].append(configs[name](args.steps))
    base = statistics.median(times[names[0]])
    print(f"overhead.py's MLP, {args.steps} steps, {args.reps} runs of each, alternating, one process, CPU, 1 thread")
    for name in names:
        med = statistics.median(times[name])
        q1, _, q3 = statistics.quantiles(times[name], n=4) if len(times[name]) > 1 else (med,) * 3
        print(f"{name:26s} {med:7.1f} us/step  {med - base:+6.1f}  (interquartile range {q1:.0f}-{q3:.0f})")
    print(f"TrainMetrics.update alone, 64 x 10 outputs: acc {update_alone((1,)):.1f} us, "
          f"acc + top5 {update_alone((1, 5)):.1f} us")


if __name__ == "__main__":
    main()
