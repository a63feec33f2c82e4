"""The ``treadle`` command: ``treadle env`` and (as the config layer grows) more."""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Sequence


def collect_env() -> dict[str, str]:
    """Versions and devices, the first thing to paste into a bug report."""
    import torch

    import treadle

    info = {
        "treadle": treadle.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda available": str(torch.cuda.is_available()),
        "cpu threads": str(torch.get_num_threads()),
    }
    if torch.cuda.is_available():
        info["cuda"] = str(torch.version.cuda)
        info["cudnn"] = str(torch.backends.cudnn.version())
        for i in range(torch.cuda.device_count()):
            info[f"gpu {i}"] = torch.cuda.get_device_name(i)
    return info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="treadle", description="A small, exact and fast training engine for PyTorch.",
                                     epilog="example: treadle env")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("env", help="print versions and devices")
    args = parser.parse_args(argv)
    if args.command == "env":
        for k, v in collect_env().items():
            print(f"{k:<16} {v}")
        return 0
    parser.print_help()
    return 2
