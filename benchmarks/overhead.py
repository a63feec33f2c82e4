"""Per-step overhead of treadle against a hand-written loop (CPU, one thread).

Both train the same tiny MLP on the same in-memory batches with SGD. Each run is a
fresh process that times both loops back to back ``--reps`` times, alternating which
goes first; every such pair gives one ratio, taken minutes apart from other pairs but
seconds apart from its partner, so slow drifts of the machine (frequency, other
tenants, memory layout) cancel out of it. The figure is the median ratio over all the
pairs of all the processes, with its interquartile range. Whole runs are timed, so
treadle's fixed cost per run (the environment record, opening the writers, the final
checkpoint) is included in the ratio; it is also measured alone, as the difference on
a 20-step run (wall clock).

    python benchmarks/overhead.py [--runs 7] [--steps 3000] [--hooks default|none] [--clock wall|cpu]
                                  [--reps 8] [--model mlp|linear] [--device cpu|cuda]

``--device cuda``: the model and the batches on the GPU (the batches put there before the
runs, as a prefetching loader would); each loop's clock stops after a device
synchronization. On a GPU the host's time per step is the engine's cost: a launch-bound
model like this one shows it.

``--hooks default``: treadle's default hooks (timer, logger every 50 iterations
writing log.jsonl, log.csv and TensorBoard events, NaN guard, final checkpoint).
``--hooks none``: every optional hook off.

``--clock wall`` (default) times with ``time.perf_counter``. ``--clock cpu`` times the
CPU the process used (``time.process_time``: the training thread and treadle's writer
threads, not time spent waiting for the disk or for a core): on a machine shared with
other work, whose processes take the cores away at random, it is the steadier measure of
the work treadle adds.
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


MODEL = "mlp"  # or "linear": Linear(2, 2) on batches of 4, where treadle's own cost is most of a step
DEVICE = "cpu"


_built: dict = {}


def build(steps: int):
    """The model (its initial weights put back) and the batches: the same tensors for
    every run of both loops, so that where they lie in memory is the same for both."""
    import torch
    from torch import nn

    if not _built:
        torch.manual_seed(0)
        dim, classes, batch = (DIM, CLASSES, BATCH) if MODEL == "mlp" else (2, 2, 4)
        if MODEL == "mlp":
            model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                  nn.Linear(HIDDEN, CLASSES))
        else:
            model = nn.Linear(dim, classes)
        g = torch.Generator().manual_seed(1)
        n_batches = 50
        batches = [(torch.randn(batch, dim, generator=g).to(DEVICE),
                    torch.randint(0, classes, (batch,), generator=g).to(DEVICE)) for _ in range(n_batches)]
        model.to(DEVICE)
        _built.update(model=model, batches=batches, init={k: v.clone() for k, v in model.state_dict().items()})
    model = _built["model"]
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(_built["init"][k])
    return model, _built["batches"]


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def sync() -> None:
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if DEVICE != "cpu":
        import torch

        torch.cuda.synchronize()


def run_hand(steps: int) -> float:
    import torch
    from torch import nn

    model, batches = build(steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    sync()
    start = clock()
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
    sync()
    return clock() - start


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
                                  loss_fn=nn.CrossEntropyLoss(), optimizer=opt, max_iters=steps, log_interval=50,
                                  progress=False, strategy=dict(type="single", device=DEVICE), **off)
        if hooks == "none":  # not even the timer and the logger
            trainer.hooks = [h for h in trainer.hooks if not isinstance(h, (LoggerHook, treadle.hooks.IterTimerHook))]
            trainer._rebuild_dispatch()
            assert trainer.hooks == [], trainer.hooks
        import logging

        logging.getLogger("treadle").setLevel(logging.WARNING)  # time the work, not the terminal
        sync()
        start = clock()
        trainer.fit()
        sync()
        return clock() - start


def child(args: argparse.Namespace) -> None:
    global clock, MODEL, DEVICE
    import torch

    MODEL, DEVICE = args.model, args.device
    torch.set_num_threads(1)
    loops = {"hand": run_hand, "treadle": lambda n: run_treadle(n, args.hooks)}
    for run in loops.values():
        run(max(args.steps // 4, 50))  # warm-up: imports, allocator, caches
    clock = CLOCKS[args.clock]
    times: dict[str, list[float]] = {"hand": [], "treadle": []}
    for rep in range(args.reps):
        for name in (("hand", "treadle") if rep % 2 == 0 else ("treadle", "hand")):
            times[name].append(loops[name](args.steps) / args.steps)
    clock = time.perf_counter  # the fixed cost includes waiting for the disk (fsync)
    fixed = min(loops["treadle"](20) for _ in range(3)) - min(loops["hand"](20) for _ in range(3))
    print(json.dumps({**times, "fixed": fixed}))


def measure(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--hooks", args.hooks,
           "--clock", args.clock, "--reps", str(args.reps), "--model", args.model, "--device", args.device]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parent.parent,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratio_quartiles(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Quartiles (first, median, third) of the ratios ``t / h`` of ``(h, t)`` time pairs."""
    ratios = sorted(t / h for h, t in pairs)
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    return q1, median, q3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--hooks", choices=("default", "none"), default="default")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall")
    p.add_argument("--reps", type=int, default=8, help="pairs of runs (one of each loop) in each process")
    p.add_argument("--model", choices=("mlp", "linear"), default="mlp",
                   help="linear: Linear(2, 2), batch 4, so that the figure is mostly treadle's own per-step cost")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: model and batches on the GPU, clocks read after a synchronization")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    rows = [measure(args) for _ in range(args.runs)]
    pairs = [(h, t) for r in rows for h, t in zip(r["hand"], r["treadle"])]
    q1, ratio, q3 = ratio_quartiles(pairs)
    added = statistics.median(t - h for h, t in pairs)
    h = statistics.median(h for h, _ in pairs)
    fixed = statistics.median(r["fixed"] for r in rows)
    what = f"tiny MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}" if args.model == "mlp" else "Linear(2, 2), batch 4"
    print(f"{what}, SGD, {args.device.upper()}, 1 thread, "
          f"{args.steps} steps, {args.runs} fresh processes x {args.reps} pairs, hooks={args.hooks}, "
          f"clock={args.clock}")
    print(f"hand-written loop {h * 1e6:.1f} us/step; per-process median ratios: "
          + " ".join(f"{statistics.median(t / h for h, t in zip(r['hand'], r['treadle'])):.3f}" for r in rows))
    print(f"treadle/hand per-step ratio {ratio:.4f} (median of {len(pairs)} pairs; interquartile range "
          f"{q1:.4f}-{q3:.4f})   added {added * 1e6:+.1f} us/step")
    print(f"fixed cost of a run about {fixed * 1e3:+.1f} ms (environment record, writers, final checkpoint),"
          f" included above")


if __name__ == "__main__":
    main()
