"""Host time per training step: treadle's default Trainer against a hand-written loop,
both fed by the same custom map-style Dataset through a DataLoader.

On a GPU the host's time per step is the engine's cost: a launch-bound model waits for
Python. On the CPU that cost shows as the training thread's CPU time per step
(``time.thread_time``), which other processes on the machine inflate less than wall time.

Both loops train overhead.py's MLP (128-256-256-10) with SGD (momentum 0.9) on batches
of 64 from a shuffled ``DataLoader`` over ``Pairs``, a Dataset class whose
``__getitem__`` returns an ``(input, target)`` tensor pair (not ``TensorDataset``, which
treadle recognizes); ``--batch-size None``: over ``Batches``, whose ``__getitem__``
returns a whole pre-made batch (``batch_size=None``). treadle runs in its default
configuration (``work_dir``, logger every 50 iterations with its jsonl/csv/TensorBoard
writers, iteration timer, NaN guard, per-sample seeding, final checkpoint); the hand
loop is ``for x, y in loader: loss_fn(model(x), y).backward(); opt.step();
opt.zero_grad()`` with the same model, optimizer and loss function.

Steady state: the loss function (the same plain function in both loops) reads the clock
at its call in the first step of the third epoch and in the first step ``--epochs``
epochs later, so the span holds whole epochs (their ends and starts) and whole log
intervals, and neither the setup, the first two epochs (where per-sample seeding
watches whether the dataset draws) nor the final checkpoint. ``--device cuda``: the
model on the GPU, batches pinned and moved with non_blocking copies, the clock
``perf_counter`` read after a device synchronization at each mark.

Each run is a fresh process that warms both loops up, then times ``--reps`` pairs (one
run of each loop), alternating which goes first. The figure is the median over all pairs
of the per-pair ratio treadle/hand, with its interquartile range.

    python benchmarks/host_time.py [--runs 5] [--reps 6] [--epochs 8] [--batch-size 64|None]
                                   [--device cpu|cuda] [--clock thread|wall]

prints, last, one line: ``host_time ratio X (IQR a-b) hand H us/step treadle T us/step
(+D us/step) ...``.

``--instructions``: instead, instructions per step counted by ``valgrind --tool=callgrind``
(free of timing noise; ``--epochs 2`` takes about 8.5 minutes on 2 cores). Each loop runs in
its own process under callgrind, a warm-up fit and then the measured one, whose marks call
``os.getppid()``: callgrind (``--dump-before=getppid``) writes the count since the previous
mark there, so each timed epoch (50 steps, its end and the next one's start, one log
interval) is counted on its own, in steady state, setup and final checkpoint excluded.
The figure is the median over epochs of treadle's count over the hand loop's for the same
epoch, with the range over epochs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

DIM, HIDDEN, CLASSES, BATCH, STEPS_PER_EPOCH = 128, 256, 10, 64, 50
WARM_EPOCHS = 2  # epochs of each run before the timed span
CLOCKS: dict[str, Callable[[], float]] = {"thread": time.thread_time, "wall": time.perf_counter}
STATS: dict[str, Callable[[list[float]], float]] = {"min": min, "mean": statistics.fmean}


class Marks:
    """The loss function of both loops: cross entropy, and the clock read at the first
    step of each timed epoch (calls ``first``, ``first + STEPS_PER_EPOCH``, ... ``last``)."""

    def __init__(self, first: int, last: int, clock: Callable[[], float], sync: Callable[[], None]) -> None:
        import torch.nn.functional as F

        self.at = frozenset(range(first, last + 1, STEPS_PER_EPOCH))
        self.clock, self.sync = clock, sync
        self.calls = 0
        self.times: list[float] = []
        self.loss = F.cross_entropy

    def __call__(self, outputs: Any, targets: Any) -> Any:
        self.calls += 1
        if self.calls in self.at:
            self.sync()
            self.times.append(self.clock())
        return self.loss(outputs, targets)

    def per_step(self) -> list[float]:
        """The time per step of each timed epoch."""
        t = self.times
        return [(b - a) / STEPS_PER_EPOCH for a, b in itertools.pairwise(t)]


def make_data(batch_size: int | None, device: str) -> Callable[[], Any]:
    """A factory of identical DataLoaders over one custom map-style Dataset."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    g = torch.Generator().manual_seed(1)
    n = BATCH * STEPS_PER_EPOCH
    x, y = torch.randn(n, DIM, generator=g), torch.randint(0, CLASSES, (n,), generator=g)
    pin = device == "cuda"

    class Pairs(Dataset):
        """One sample per index: an (input, target) tensor pair."""

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            return x[i], y[i]

    class Batches(Dataset):
        """One whole pre-made batch per index (pinned on CUDA)."""

        def __init__(self) -> None:
            self.batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, n, BATCH)]
            if pin:
                self.batches = [(a.pin_memory(), b.pin_memory()) for a, b in self.batches]

        def __len__(self) -> int:
            return len(self.batches)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            return self.batches[i]

    if batch_size is None:
        batches = Batches()
        return lambda: DataLoader(batches, batch_size=None, shuffle=True)
    pairs = Pairs()
    return lambda: DataLoader(pairs, batch_size=batch_size, shuffle=True, pin_memory=pin)


class Bench:
    """The model, the data and the two loops; ``run(epochs)`` returns the time per step."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        from torch import nn

        self.device, self.epochs = args.device, args.epochs
        self.clock = CLOCKS[args.clock]
        self.loader = make_data(args.batch_size, args.device)
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                   nn.Linear(HIDDEN, CLASSES)).to(args.device)
        self.init = {k: v.clone() for k, v in self.model.state_dict().items()}

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def fresh(self, epochs: int) -> tuple[Any, Any, Marks]:
        """The model (initial weights put back), its optimizer and the marking loss."""
        import torch

        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.init[k])
        opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        first = WARM_EPOCHS * STEPS_PER_EPOCH + 1  # the first step after the warm epochs
        last = first + STEPS_PER_EPOCH * (epochs - WARM_EPOCHS - 1)
        return opt, self.model, Marks(first, last, self.clock, self.sync)

    def hand(self, epochs: int) -> list[float]:
        opt, model, loss_fn = self.fresh(epochs)
        loader = self.loader()
        device, cuda = self.device, self.device == "cuda"
        model.train()
        for _ in range(epochs):
            for x, y in loader:
                if cuda:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss_fn(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        return loss_fn.per_step()

    def treadle(self, epochs: int) -> list[float]:
        import treadle

        opt, model, loss_fn = self.fresh(epochs)
        with tempfile.TemporaryDirectory() as work_dir:
            trainer = treadle.Trainer(model, work_dir=work_dir, train_dataloader=self.loader(), loss_fn=loss_fn,
                                      optimizer=opt, max_epochs=epochs, progress=False,
                                      strategy=dict(type="single", device=self.device))
            trainer.fit()
        return loss_fn.per_step()


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    # treadle's log lines (console and log.txt, every 50 steps) are part of the default: kept.
    bench = Bench(args)
    loops = {"hand": bench.hand, "treadle": bench.treadle}
    if args.count:  # under callgrind: one loop, a warm-up fit, then the counted one
        run = loops[args.count]
        run(WARM_EPOCHS + 1)
        # Each mark of the counted fit calls getppid, where callgrind dumps its count.
        bench.clock = lambda: float(os.getppid())
        run(args.epochs + WARM_EPOCHS + 1)
        return
    for run in loops.values():
        run(WARM_EPOCHS + 1)  # warm-up: imports, allocator, caches
    times: dict[str, list[list[float]]] = {"hand": [], "treadle": []}
    for rep in range(args.reps):
        for name in (("hand", "treadle") if (rep + args.offset) % 2 == 0 else ("treadle", "hand")):
            times[name].append(loops[name](args.epochs + WARM_EPOCHS + 1))
    print("RESULT " + json.dumps(times))


def _child_cmd(args: argparse.Namespace, *extra: str) -> list[str]:
    return [sys.executable, __file__, "--child", "--batch-size", str(args.batch_size), "--device", args.device,
            "--clock", args.clock, *extra]


_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measure(args: argparse.Namespace, offset: int) -> dict[str, list[list[float]]]:
    cmd = _child_cmd(args, "--reps", str(args.reps), "--epochs", str(args.epochs), "--offset", str(offset))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent, env=_ENV)
    if out.returncode:
        sys.exit(f"the child process failed:\n{out.stderr[-3000:]}")
    return json.loads(next(line[7:] for line in out.stdout.splitlines() if line.startswith("RESULT ")))


def count(args: argparse.Namespace, loop: str) -> list[int]:
    """Instructions of each timed epoch of one loop, from its own process under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out_file}",
               *_child_cmd(args, "--count", loop, "--epochs", str(args.epochs))]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent, env=_ENV)
        if out.returncode:
            sys.exit(f"the callgrind run of the {loop} loop failed:\n{out.stderr[-3000:]}")
        # cg.out.1 holds everything up to the first mark; cg.out.2 ... one timed epoch each.
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda f: int(f.suffix[1:]))
        counts = []
        for f in dumps[1:]:
            match = re.search(r"^summary:\s*(\d+)", f.read_text(), re.M)
            if match is None:
                sys.exit(f"no instruction count in callgrind's {f.name}")
            counts.append(int(match.group(1)))
    if len(counts) != args.epochs:
        sys.exit(f"expected {args.epochs} timed epochs from callgrind, got {len(counts)}: does something else in the "
                 f"{loop} loop call getppid()?")
    return counts


def instructions(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        hand, tread = pool.map(lambda loop: count(args, loop), ("hand", "treadle"))
    ratios = sorted(t / h for h, t in zip(hand, tread))
    per_hand, per_tread = (statistics.median(c) / STEPS_PER_EPOCH for c in (hand, tread))
    data = "pre-made batches (batch_size=None)" if args.batch_size is None else f"batch {args.batch_size}"
    print(f"MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD, {data} from a custom map-style Dataset, CPU, 1 thread; "
          f"instructions (callgrind) of {args.epochs} timed epochs x {STEPS_PER_EPOCH} steps per loop; "
          f"{time.perf_counter() - start:.0f} s")
    print("per-epoch k instructions/step: hand " + " ".join(f"{c / STEPS_PER_EPOCH / 1e3:.1f}" for c in hand)
          + "; treadle " + " ".join(f"{c / STEPS_PER_EPOCH / 1e3:.1f}" for c in tread))
    print(f"instructions ratio {statistics.median(ratios):.4f} (range {ratios[0]:.4f}-{ratios[-1]:.4f}) hand "
          f"{per_hand / 1e3:.1f} k/step treadle {per_tread / 1e3:.1f} k/step ({(per_tread - per_hand) / 1e3:+.1f} "
          f"k/step) median of {len(ratios)} epochs")


def batch_size(text: str) -> int | None:
    if text == "None":
        return None
    if text != str(BATCH):
        raise argparse.ArgumentTypeError(f"--batch-size must be {BATCH} or None, got {text}")
    return BATCH


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="fresh processes (default 5 on cpu, 3 on cuda)")
    p.add_argument("--reps", type=int, default=None, help="pairs per process (default 6 on cpu, 4 on cuda)")
    p.add_argument("--epochs", type=int, default=8, help=f"epochs timed in each run ({STEPS_PER_EPOCH} steps each)")
    p.add_argument("--batch-size", type=batch_size, default=BATCH,
                   help=f"{BATCH}, or None: whole pre-made batches from the dataset, DataLoader(batch_size=None)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--clock", choices=tuple(CLOCKS), default=None,
                   help="thread: the training thread's CPU time (default on cpu); wall: perf_counter (cuda)")
    p.add_argument("--stat", choices=tuple(STATS), default=None,
                   help="each run's figure from its epochs' times per step: min, the fastest epoch (default on cpu, "
                        "where other processes only ever add time), or mean, the whole span (default on cuda)")
    p.add_argument("--instructions", action="store_true", help="count instructions with valgrind instead")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--count", choices=("hand", "treadle"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    cuda = args.device == "cuda"
    args.clock = args.clock or ("wall" if cuda else "thread")
    args.stat = args.stat or ("mean" if cuda else "min")
    args.runs = args.runs or (3 if cuda else 5)
    args.reps = args.reps or (4 if cuda else 6)
    if args.child:
        child(args)
        return
    if args.instructions:
        instructions(args)
        return
    start = time.perf_counter()
    rows = [measure(args, i) for i in range(args.runs)]  # the first loop alternates between processes too
    stat = STATS[args.stat]
    pairs = [(stat(h), stat(t)) for r in rows for h, t in zip(r["hand"], r["treadle"])]
    ratios = sorted(t / h for h, t in pairs)
    q1, ratio, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    hand = statistics.median(h for h, _ in pairs)
    tread = statistics.median(t for _, t in pairs)
    added = statistics.median(t - h for h, t in pairs)
    data = "pre-made batches (batch_size=None)" if args.batch_size is None else f"batch {args.batch_size}"
    print(f"MLP {DIM}-{HIDDEN}-{HIDDEN}-{CLASSES}, SGD, {data} from a custom map-style Dataset, "
          f"{args.device.upper()}, 1 thread, clock={args.clock}; {args.epochs} x {STEPS_PER_EPOCH} steps timed per "
          f"run ({args.stat} of the epochs), {args.runs} fresh processes x {args.reps} pairs; "
          f"{time.perf_counter() - start:.0f} s")
    print("per-process median ratios: " + " ".join(
        f"{statistics.median(stat(t) / stat(h) for h, t in zip(r['hand'], r['treadle'])):.3f}" for r in rows))
    print(f"host_time ratio {ratio:.4f} (IQR {q1:.4f}-{q3:.4f}) hand {hand * 1e6:.1f} us/step treadle "
          f"{tread * 1e6:.1f} us/step ({added * 1e6:+.1f} us/step) median of {len(pairs)} pairs")


if __name__ == "__main__":
    main()
