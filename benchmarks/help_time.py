"""How long ``treadle --help``, ``treadle train --help`` and a config error
(``treadle train`` of a YAML file with a misspelt key) take, as a user types them.

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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAD_CONFIG = "_base_: {base}\nmax_epoch: 3\n"  # a misspelt key: status 2, said before torch is imported
COMMANDS = ((["--help"], 0), (["train", "--help"], 0), (["train", "{bad}"], 2))
PROBE = "import sys; from treadle.cli import main; main({argv!r}); print('torch' in sys.modules)"


def command() -> list[str]:
    """The ``treadle`` console script beside this interpreter, else ``python -m treadle``."""
    script = Path(sys.executable).with_name("treadle")
    if script.is_file():
        return [str(script)]
    found = shutil.which("treadle")
    return [found] if found else [sys.executable, "-m", "treadle"]


def sample(argv: list[str], status: int) -> float:
    start = time.perf_counter()
    p = subprocess.run([*command(), *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if p.returncode != status:
        raise SystemExit(f"treadle {' '.join(argv)}: exit {p.returncode}, expected {status}")
    return elapsed


def imports_torch(argv: list[str]) -> bool:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.yaml"
        bad.write_text(BAD_CONFIG.format(base=ROOT / "examples" / "digits" / "digits.yaml"))
        for argv, expected in COMMANDS:
            status |= measure([a.format(bad=bad) for a in argv], expected, args.runs)
    return status


def measure(argv: list[str], expected: int, runs: int) -> int:
    """Print the command's times; 1 when it imported torch."""
    sample(argv, expected)  # a first run warms the file cache
    times = [sample(argv, expected) for _ in range(runs)]
    torch_loaded = imports_torch(argv)
    print(f"treadle {' '.join(argv)}: median {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {runs} runs); "
          f"torch imported: {'yes' if torch_loaded else 'no'}")
    return int(torch_loaded)


if __name__ == "__main__":
    sys.exit(main())
