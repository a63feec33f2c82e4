"""How long ``treadle --help`` and ``treadle train --help`` take, as a user types them.

Each sample is a fresh process running the installed ``treadle`` command (the console
script next to this Python, else ``python -m treadle``), timed from start to exit; the
median and the range over ``--runs`` samples are printed per command. The help is
printed without importing torch (treadle/__init__.py imports it on first use), which is
checked once per command: the script exits 1 if torch was loaded.

    python benchmarks/help_time.py [--runs 9]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (["--help"], ["train", "--help"])
PROBE = "import sys; from treadle.cli import main; main({argv!r}); print('torch' in sys.modules)"


def command() -> list[str]:
    """The ``treadle`` console script beside this interpreter, else ``python -m treadle``."""
    script = Path(sys.executable).with_name("treadle")
    if script.is_file():
        return [str(script)]
    found = shutil.which("treadle")
    return [found] if found else [sys.executable, "-m", "treadle"]


def sample(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([*command(), *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def imports_torch(argv: list[str]) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    status = 0
    for argv in COMMANDS:
        sample(argv)  # a first run warms the file cache
        times = [sample(argv) for _ in range(args.runs)]
        torch_loaded = imports_torch(argv)
        status |= torch_loaded
        print(f"treadle {' '.join(argv)}: median {statistics.median(times) * 1000:.0f} ms "
              f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {args.runs} runs); "
              f"torch imported: {'yes' if torch_loaded else 'no'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
