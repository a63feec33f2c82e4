"""What the first ``fit()`` of a process costs over a hand-written loop.

Every sample is a fresh interpreter (``import torch`` done, the model and batches
built) that times one thing only: the hand-written loop, or ``import treadle`` and then
building a Trainer and its ``fit()`` (with a work_dir: every file of a run is written,
log.txt, log.jsonl, log.csv, TensorBoard events, env.txt and the final checkpoint;
without: none), so nothing is warm but what Python and torch themselves warmed. The
workload is one epoch of the tiny MLP of overhead.py (128-256-256-10, 50 batches of
64, SGD with momentum, CPU, one thread); the treadle logger keeps its level (log.txt is
complete; the console lines go to a pipe).

A round runs each variant once, in a rotated order; the figure for each is its median
over the rounds with the interquartile range, and the difference from the hand loop is
the median of the per-round differences (each taken seconds apart). ``import treadle``
is timed apart (``import_time.py`` measures it in detail); "fit" is Trainer(...) plus
fit(). The process's CPU time (all its threads, import included) is reported too: on a
shared machine it moves less than wall time, though it leaves out waiting for the disk. So is
the time the training thread spent off the CPU during the fit (wall time less that thread's
CPU time): waiting for the disk, for another thread's GIL, or for a core. When it is small,
what the fit costs over the hand loop is work done on the training thread itself.

``--tree DIR`` (repeatable) runs treadle from each source tree in turn (an A/B of two
checkouts in one run); the default is this checkout. Byte-code caching is left on in
the children (``PYTHONDONTWRITEBYTECODE`` is dropped) and one untimed round comes
first, so compiling treadle's files is not counted, as it is not in a user's second run.

    python benchmarks/first_fit.py [--rounds 15] [--tree DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("hand", "work_dir", "no_work_dir")


def child(variant: str) -> None:
    import tempfile

    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 128, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(50)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    with tempfile.TemporaryDirectory() as tmp:
        cpu = time.process_time()
        thread_cpu = time.thread_time()
        start = time.perf_counter()
        if variant == "hand":
            model.train()
            for x, y in batches:
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            imported, thread_imported = start, thread_cpu
        else:
            import treadle

            imported, thread_imported = time.perf_counter(), time.thread_time()
            trainer = treadle.Trainer(model, work_dir=tmp if variant == "work_dir" else None, train_dataloader=batches,
                                      loss_fn=loss_fn, optimizer=opt, max_epochs=1, log_interval=50, progress=False)
            trainer.fit()
        end = time.perf_counter()
        fit_thread_cpu = time.thread_time() - thread_imported
        cpu = time.process_time() - cpu
        files = sorted(str(p.relative_to(tmp)).split(".tfevents.")[0] for p in Path(tmp).rglob("*") if p.is_file())
    print(json.dumps({"import": imported - start, "fit": end - imported, "cpu": cpu,
                      "off_cpu": max(0.0, end - imported - fit_thread_cpu), "files": files}))  # clocks: us apart


def sample(variant: str, tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True, check=True,
                         cwd=tree, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def fmt(values: list[float]) -> str:
    q1, median, q3 = quartiles([v * 1e3 for v in values])
    return f"{median:6.1f} ms (IQR {q1:.1f} to {q3:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--tree", action="append", type=Path, help="treadle source tree (repeatable); default: this one")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    runs = [("hand", trees[0])] + [(v, t) for t in trees for v in VARIANTS[1:]]
    for variant, tree in runs:  # untimed: byte-code caches, page cache
        sample(variant, tree)
    times: dict[tuple[str, Path], list[dict]] = {r: [] for r in runs}
    for i in range(args.rounds):
        k = i % len(runs)
        for run in runs[k:] + runs[:k]:
            times[run].append(sample(*run))
    hand = [s["fit"] for s in times[("hand", trees[0])]]
    print(f"first fit() in a fresh process: 1 epoch, MLP 128-256-256-10, 50 batches of 64, SGD, CPU, 1 thread; "
          f"{args.rounds} rounds, median (IQR)")
    print(f"  hand-written loop          {fmt(hand)}; training thread off-CPU "
          f"{fmt([s['off_cpu'] for s in times[('hand', trees[0])]])}")
    for tree in trees:
        if len(trees) > 1:
            print(f"  tree {tree}")
        for variant in VARIANTS[1:]:
            rows = times[(variant, tree)]
            fit = [s["fit"] for s in rows]
            over = [s["fit"] - h for s, h in zip(rows, hand)]
            total = [s["fit"] + s["import"] - h for s, h in zip(rows, hand)]
            cpu_over = [s["cpu"] - h["cpu"] for s, h in zip(rows, times[("hand", trees[0])])]
            print(f"  treadle, {variant:<12}      fit {fmt(fit)}; over the hand loop {fmt(over)}; "
                  f"with import treadle {fmt(total)}; CPU time (import included) over the hand loop's {fmt(cpu_over)}; "
                  f"training thread off-CPU during fit {fmt([s['off_cpu'] for s in rows])}")
            print(f"    files: {', '.join(rows[-1]['files']) or 'none'}")
        imports = [s["import"] for v in VARIANTS[1:] for s in times[(v, tree)]]
        print(f"  import treadle (after torch) {fmt(imports)}")


if __name__ == "__main__":
    main()
