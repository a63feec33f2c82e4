"""How long a checkpoint save blocks the training thread: synchronous against asynchronous.

The state is about ``--mb`` MB of float32 CPU tensors (a model's weights and two Adam
moments, in 64 tensors). A synchronous save (``treadle.checkpoint.io.save_checkpoint``:
torch.save, sha256, fsync, manifest, rename) blocks for the whole write. An
``AsyncCheckpointer.save`` blocks only while it copies the state to CPU memory; the
write goes on in a background thread. Later saves reuse the first one's buffers (the
steady state of periodic checkpoints). The first save is reported twice: with its
buffers reserved beforehand (``AsyncCheckpointer.reserve``, which
``CheckpointHook(async_save=True)`` calls in the background after the first training
iteration) and without (allocating and faulting in its memory during the save).
Saves alternate (sync, async, ...), ``--reps`` of each; medians.

    python benchmarks/async_checkpoint.py [--mb 500] [--reps 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def build_state(mb: int):
    import torch

    n_tensors = 64
    per = mb * 2**20 // 4 // n_tensors
    g = torch.Generator().manual_seed(0)
    third = n_tensors // 3
    model = {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n_tensors - 2 * third)}
    optim = {"state": {i: {"exp_avg": torch.randn(per, generator=g), "exp_avg_sq": torch.rand(per, generator=g),
                           "step": torch.tensor(100.0)} for i in range(third)},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(third))}]}
    nbytes = sum(t.numel() * 4 for t in model.values()) + sum(
        s["exp_avg"].numel() * 8 for s in optim["state"].values())
    return {"state.pt": {"model": model, "optim": optim}, "rng_rank0.pt": {"torch": torch.get_rng_state()}}, nbytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=500)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = p.parse_args()

    import shutil

    import torch

    from treadle.checkpoint.async_save import AsyncCheckpointer
    from treadle.checkpoint.io import save_checkpoint

    payloads, nbytes = build_state(args.mb)
    sync_s: list[float] = []
    async_first = 0.0
    async_s: list[float] = []
    async_total: list[float] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        cold = AsyncCheckpointer()  # a first save without a reservation
        start = time.perf_counter()
        cold.save(Path(root) / "cold", payloads)
        async_cold = time.perf_counter() - start
        cold.close()
        shutil.rmtree(Path(root) / "cold")
        saver = AsyncCheckpointer()
        start = time.perf_counter()
        saver.reserve(payloads)  # in a run: after the first iteration, overlapping training
        reserve_call = time.perf_counter() - start
        saver.reserve(payloads, wait=True)  # (already reserving: only waits)
        for rep in range(args.reps + 1):  # rep 0: the first async save (into the reserved buffers)
            path = Path(root) / f"sync_{rep}"
            start = time.perf_counter()
            save_checkpoint(path, payloads, meta={"iter": rep})
            if rep:
                sync_s.append(time.perf_counter() - start)
            shutil.rmtree(path)

            path = Path(root) / f"async_{rep}"
            start = time.perf_counter()
            saver.save(path, payloads, meta={"iter": rep})
            blocked = time.perf_counter() - start
            saver.wait()
            total = time.perf_counter() - start
            if rep:
                async_s.append(blocked)
                async_total.append(total)
            else:
                async_first = blocked
            shutil.rmtree(path)
        saver.close()
    sync_med, async_med = statistics.median(sync_s), statistics.median(async_s)
    print(f"state: {nbytes / 1e6:.0f} MB of CPU tensors; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.reps} saves of each kind, medians")
    print(f"synchronous save: blocks {sync_med * 1e3:.0f} ms (min {min(sync_s) * 1e3:.0f}, max {max(sync_s) * 1e3:.0f})")
    print(f"asynchronous save: blocks {async_med * 1e3:.0f} ms (min {min(async_s) * 1e3:.0f}, max {max(async_s) * 1e3:.0f}) "
          f"= {async_med / sync_med:.1%} of a synchronous save")
    print(f"first asynchronous save: {async_first * 1e3:.0f} ms = {async_first / sync_med:.1%} with its buffers reserved "
          f"(the reserve() call itself {reserve_call * 1e3:.1f} ms); {async_cold * 1e3:.0f} ms = "
          f"{async_cold / sync_med:.1%} without (allocating and faulting in its buffers)")
    print(f"asynchronous save until written: {statistics.median(async_total) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
