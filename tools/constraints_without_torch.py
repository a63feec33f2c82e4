"""Print a constraints file less its pins of torch and of what the installed torch requires.

    python tools/constraints_without_torch.py constraints.txt > other.txt

`make test-torch TORCH=X` installs torch X first, then treadle with the result: the project's
pins stay, except those the other release decides itself (torch 2.6 requires sympy==1.13.1,
where constraints.txt pins 1.14.0 for 2.13).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys


def _name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def main(path: str) -> int:
    required = importlib.metadata.requires("torch") or []
    skip = {"torch"} | {_name(r) for r in required if "extra ==" not in r}
    with open(path) as f:
        for line in f:
            text = line.strip()
            if text and not text.startswith("#") and _name(text) in skip:
                continue
            sys.stdout.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
