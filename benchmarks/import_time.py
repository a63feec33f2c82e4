"""What ``import treadle`` costs on top of ``import torch``, with its public names loaded.

``import treadle`` alone imports almost nothing (the public names load on first use, so
that ``treadle --help`` needs no torch: benchmarks/help_time.py); what is timed here is
``import treadle`` and ``treadle.Trainer``, the engine a script uses.

Each sample is a fresh interpreter that imports torch, then treadle, timing each with
``time.perf_counter`` (so the interpreter's own start-up is not counted); the median
over the samples is reported. One more run with ``-X importtime`` lists the modules
under treadle that take the longest, and the check at the end names any heavy
optional package (tensorboard, matplotlib, rich, yaml, ...) that the import pulled in:
those must only be imported by the feature that needs them.

    python benchmarks/import_time.py [--runs 15] [--top 12]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Packages treadle uses for optional features: none may be imported by `import treadle`.
LAZY = ("tensorboard", "torch.utils.tensorboard", "matplotlib", "rich", "yaml", "safetensors", "mlflow", "wandb",
        "google.protobuf", "PIL", "sklearn", "torchmetrics")

CHILD = f"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import treadle
treadle.Trainer
t2 = time.perf_counter()
print(json.dumps({{"torch": t1 - t0, "treadle": t2 - t1, "loaded": [m for m in {LAZY!r} if m in sys.modules]}}))
"""


def sample() -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def slowest_under_treadle(top: int) -> list[tuple[int, str]]:
    """(cumulative us, module) of the slowest imports made while importing treadle."""
    code = "import torch; import treadle; treadle.Trainer"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    rows: list[tuple[int, str]] = []
    seen_treadle = False
    for line in out.stderr.splitlines():  # "import time: self | cumulative | name", children first
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if name.strip() == "treadle":
            seen_treadle = True
        rows.append((int(cumulative), name))
    if not seen_treadle:
        return []
    # Everything after torch's own top-level line was imported because of treadle.
    start = max(i for i, (_, n) in enumerate(rows) if n == "torch") + 1
    mine = [(us, n.strip()) for us, n in rows[start:] if n.strip() != "treadle"]
    return sorted(mine, reverse=True)[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    samples = [sample() for _ in range(args.runs)]
    torch_ms = statistics.median(s["torch"] for s in samples) * 1e3
    treadle_ms = statistics.median(s["treadle"] for s in samples) * 1e3
    spread = sorted(s["treadle"] * 1e3 for s in samples)
    print(f"import torch: {torch_ms:.0f} ms (median of {args.runs} fresh processes)")
    print(f"import treadle after torch: {treadle_ms:.1f} ms (median; min {spread[0]:.1f}, max {spread[-1]:.1f})")
    print("slowest imports under treadle (-X importtime, cumulative):")
    for us, name in slowest_under_treadle(args.top):
        print(f"  {us / 1e3:7.1f} ms  {name}")
    loaded = sorted({m for s in samples for m in s["loaded"]})
    print("optional packages imported by `import treadle`: " + (", ".join(loaded) if loaded else "none"))
    if loaded:
        sys.exit(1)


if __name__ == "__main__":
    main()
