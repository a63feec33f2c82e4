"""Run examples/huggingface/train.py's Trainer, optionally killing itself with SIGKILL after
``--kill-at`` iterations (tests/faults.py), for the exact-resume test."""

import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: faults.py
from faults import SigkillAt

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "huggingface" / "train.py"

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("work_dir")
    p.add_argument("--max-iters", type=int, default=8)
    p.add_argument("--kill-at", type=int)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("hf_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    hooks = [SigkillAt(rank=0, at_iter=args.kill_at)] if args.kill_at else []
    # bf16 as on a GPU (the example runs float32 on a CPU): its exact resume is what this checks
    example.build_trainer(args.model, args.work_dir, args.max_iters, args.resume, hooks=hooks, precision="bf16",
                          progress=False).fit()
