"""Instructions per training step, treadle against a hand-written loop, counted by valgrind.

Wall-clock ratios (``overhead.py``) mix the work each loop does with where its memory
happens to lie (cache sets, page offsets, allocator state), which moves a 0.6 ms step by
tens of microseconds either way. An instruction count has no timing noise: this runs
each loop under ``valgrind --tool=callgrind`` for ``--short`` and ``--long`` steps
(after a warm-up, so imports and first-use work cancel out) and reports
``(count(long) - count(short)) / (long - short)`` per step for each, and treadle's fixed
cost per run (its ``fit()`` at ``--short`` steps, less the hand loop's). The count of one
loop still moves by a few percent between runs (the allocator takes different paths), so
compare repeated runs. Needs valgrind (not a Python package: ``apt install valgrind``);
slow, several minutes per run, two runs at a time.

    python benchmarks/overhead_instructions.py [--short 50] [--long 150] [--hooks default|none]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def child(loop: str, steps: int, hooks: str) -> None:
    """Run ``overhead.py``'s loop (the same model, batches and settings) under the counter."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import overhead

    torch.set_num_threads(1)
    run = overhead.run_hand if loop == "hand" else (lambda n: overhead.run_treadle(n, hooks))
    run(60)  # warm-up: first-use imports and caches, the same in both counts
    run(steps)


def count(loop: str, steps: int, hooks: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={Path(tmp) / 'cg.out'}",
                              sys.executable, __file__, "--child", loop, str(steps), "--hooks", hooks],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    match = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(match.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--short", type=int, default=50)
    p.add_argument("--long", type=int, default=150)
    p.add_argument("--hooks", choices=("default", "none"), default="default")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.hooks)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    jobs = [(loop, n) for loop in ("hand", "treadle") for n in (args.short, args.long)]
    with ThreadPoolExecutor(2) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: count(j[0], j[1], args.hooks), jobs)))
    span = args.long - args.short
    per = {loop: (counts[(loop, args.long)] - counts[(loop, args.short)]) / span for loop in ("hand", "treadle")}
    fixed = counts[("treadle", args.short)] - counts[("hand", args.short)] - args.short * (per["treadle"] - per["hand"])
    print(f"tiny MLP 128-256-256-10, batch 64, SGD, CPU, 1 thread, hooks={args.hooks}; "
          f"steps {args.short} and {args.long}, after a 60-step warm-up fit")
    print(f"instructions per step: hand {per['hand'] / 1e6:.3f} M, treadle {per['treadle'] / 1e6:.3f} M, "
          f"ratio {per['treadle'] / per['hand']:.4f} ({(per['treadle'] - per['hand']) / 1e3:+.1f} k per step)")
    print(f"treadle's fixed cost per fit(): {fixed / 1e6:.1f} M instructions (writers, env.txt, final checkpoint)")


if __name__ == "__main__":
    main()
