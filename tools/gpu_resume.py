"""Exact resume after SIGKILL, on the device a run trains on: one check of tools/gpu_check.py.

    python tools/gpu_resume.py --precision bf16 [--strategy single|ddp|fsdp] [--compile] [--device cuda|cpu]

Runs the same training three times in fresh processes: uninterrupted; killed with
SIGKILL at iteration ``--kill-at`` (after a checkpoint at ``--save-every``, inside an
accumulation window and an epoch); resumed from its latest checkpoint. The last
checkpoints of the first and the third must hold the same model and optimizer state,
bit for bit. The workload has what makes resuming hard: BatchNorm and dropout, two loader
workers drawing a random augmentation per sample, a shuffled epoch, accumulation,
clipping, a warmup scheduler, deterministic algorithms. ``ddp`` and ``fsdp`` run under
torchrun with one process per GPU (two on the CPU, over gloo). Prints one JSON line:
``{"equal": bool, "tensors": N, "differ": [...], "seconds": s}``; exits 1 when they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- the run (a child process) -----------------------------------------------------------
def train(args: argparse.Namespace) -> None:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    import treadle

    class Images(Dataset):
        """Fixed 3x16x16 images with a random flip and noise drawn per sample."""

        def __init__(self, n: int = 96) -> None:
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 3, 16, 16, generator=g)
            self.y = torch.randint(0, 10, (n,), generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int):
            x = self.x[i]
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
            return x + 0.1 * torch.randn_like(x), self.y[i]

    class Kill(treadle.Hook):
        priority = "LOWEST"  # after the checkpoint hook saved this iteration

        def after_train_iter(self, trainer, batch, outputs):
            if trainer.state.iter + 1 == args.kill_at and trainer.strategy.rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Dropout(0.2), nn.Linear(32, 10))
    cuda = args.device == "cuda"
    loader = DataLoader(Images(), batch_size=8, shuffle=True, num_workers=2, pin_memory=cuda)
    strategy = {"single": dict(type="single", device=args.device), "ddp": dict(type="ddp"),
                "fsdp": dict(type="fsdp")}[args.strategy]
    trainer = treadle.Trainer(
        model, work_dir=args.work_dir, train_dataloader=loader, loss_fn=nn.CrossEntropyLoss(),
        optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.01), max_iters=args.iters, accumulate=2,
        clip_grad=dict(max_norm=1.0), schedulers=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=8)],
        precision=args.precision, strategy=strategy, compile=args.compile, seed=0, deterministic=True,
        checkpoint=dict(interval=args.save_every, by_epoch=False), hooks=[Kill()] if args.kill_at else [],
        resume=args.resume, log_interval=4, progress=False)
    trainer.fit()


# -- the check (the parent) --------------------------------------------------------------
def _state(work_dir: Path) -> dict:
    """The model and optimizer state of the run's last checkpoint, as flat {name: tensor}."""
    import torch

    from treadle.checkpoint.io import load_checkpoint
    from treadle.checkpoint.sharded import consolidate, is_sharded_checkpoint

    ckpts = sorted((work_dir / "checkpoints").glob("iter_*"))
    if not ckpts:
        raise SystemExit(f"no checkpoint in {work_dir}")
    last = ckpts[-1]
    state = consolidate(last, key=None) if is_sharded_checkpoint(last) else load_checkpoint(last)["state.pt"]
    flat: dict = {}

    def walk(obj, name: str) -> None:
        if isinstance(obj, torch.Tensor):
            flat[name] = obj.cpu()
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{name}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{name}/{i}")
    for key in ("model", "optim"):
        walk(state.get(key), key)
    return flat


def run(args: argparse.Namespace, work_dir: Path, kill_at: int, resume: bool) -> int:
    iters = args.iters + (args.resume_extra if resume else 0)
    child = [str(Path(__file__).resolve()), "--child", "--work-dir", str(work_dir), "--precision", args.precision,
             "--strategy", args.strategy, "--device", args.device, "--iters", str(iters),
             "--save-every", str(args.save_every), "--kill-at", str(kill_at)]
    child += ["--compile"] * args.compile + ["--resume"] * resume
    if args.strategy == "single":
        cmd = [sys.executable, *child]
    else:
        import torch

        nproc = torch.cuda.device_count() if args.device == "cuda" else 2
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *child]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo and the CPU, even on a machine with GPUs
    log = work_dir.parent / f"{work_dir.name}{'-resumed' if resume else ''}.log"
    with open(log, "w") as out:
        # A session of its own: what the run leaves behind when it is killed (its loader
        # workers) goes with it, as on a preempted node, instead of holding the work_dir.
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=args.timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def check(args: argparse.Namespace) -> dict:
    import torch

    start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="treadle-resume-"))
    try:
        codes = {"uninterrupted": run(args, root / "ref", 0, False),
                 "killed": run(args, root / "run", args.kill_at, False),
                 "resumed": run(args, root / "run", 0, True)}
        killed = codes["killed"] in (-signal.SIGKILL, 1)  # torchrun exits 1 when a worker is killed
        if codes["uninterrupted"] or codes["resumed"] or not killed:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(root.glob("*.log")))
            return {"equal": False, "error": f"exit codes {codes}", "logs": logs,
                    "seconds": time.perf_counter() - start}
        ref, got = _state(root / "ref"), _state(root / "run")
        differ = sorted(k for k in ref.keys() | got.keys()
                        if k not in ref or k not in got or not torch.equal(ref[k], got[k]))
        return {"equal": not differ and bool(ref), "tensors": len(ref), "differ": differ[:10],
                "seconds": time.perf_counter() - start}
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=("32", "bf16", "16"), default="bf16")
    p.add_argument("--strategy", choices=("single", "ddp", "fsdp"), default="single")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--iters", type=int, default=16)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--kill-at", type=int, default=7)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--keep", action="store_true", help="keep the run directories and logs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work-dir", help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--resume-extra", type=int, default=0,
                   help=argparse.SUPPRESS)  # a negative control: the resumed run trains this many more iterations
    args = p.parse_args()
    if args.child:
        train(args)
        return 0
    result = check(args)
    print(json.dumps(result))
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
