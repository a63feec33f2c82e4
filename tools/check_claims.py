"""Run every example and first-screen snippet as the docs type it, and check what the docs
say of it: the CPU time (user + system of the run and its children: steadier than the
wall clock on a machine shared with other work) and the result.

The figures are read from the pages, not written here: each example's line in Getting
started (``docs/getting-started.md``, "Examples") says "under N s of CPU time" and its
result ("val/acc 0.99"); the example's own docstring or header must say the same
(``tests/test_claims.py`` checks that without running anything). The README's snippets
say their time in the sentence before them.

    .venv/bin/python tools/check_claims.py            # after `make test` (the hf extra); about 5 minutes
    .venv/bin/python tools/check_claims.py --only digits,readme-python

Commands run in a scratch directory laid out as a clone (``examples/`` beside them), with
``.venv/bin/`` replaced by this interpreter's directory; exit status 1 when a figure does
not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
README = ROOT / "README.md"

TIME = re.compile(r"under (\d+) s of CPU time")
RESULT = re.compile(r"\b((?:val|test)/\w+) (\d+\.\d+)")


@dataclass
class Run:
    """One command as the docs type it, and where its result is read."""

    name: str          # the example's folder, or readme-<snippet>
    command: str       # as typed (a shell line)
    key: str           # the result: a metric of its last validation
    log: str = ""      # the run directory whose log.jsonl has it ("" for a printed result)
    printed: str = ""  # a regex whose group 1 is the result, in the output


RUNS = [
    Run("digits", ".venv/bin/treadle train examples/digits/digits.yaml --work-dir runs/digits", "val/acc",
        "runs/digits"),
    Run("digits-iter", ".venv/bin/treadle train examples/digits/digits_iter.yaml", "val/acc", "runs/digits_iter"),
    Run("digits-config", ".venv/bin/treadle train examples/digits/digits_config.py", "val/acc",
        "runs/digits_config"),
    Run("digits-py", ".venv/bin/python examples/digits/train.py", "val/acc", "runs/digits-py"),
    Run("gan", ".venv/bin/treadle train examples/gan/gan.yaml", "val/modes", "runs/gan"),
    Run("detection", ".venv/bin/python examples/detection/train.py", "val/ap50", "runs/detection"),
    Run("huggingface-bert", ".venv/bin/python examples/huggingface/train.py --model bert", "val/acc", "runs/hf-bert"),
    Run("huggingface-gpt2", ".venv/bin/python examples/huggingface/train.py --model gpt2", "val/loss",
        "runs/hf-gpt2"),
    Run("custom_loop", ".venv/bin/python examples/custom_loop/train.py", "val/acc",
        printed=r"val/acc (\d\.\d+)\s*$"),
    Run("mmengine_style", ".venv/bin/treadle train examples/mmengine_style/digits_mmengine.yaml", "val/acc",
        "runs/digits_mmengine"),
    Run("lora", ".venv/bin/python examples/lora/finetune.py", "val/loss", "runs/lora/run"),
]


def bullet(name: str) -> str:
    """The text of Getting started's bullet for ``name`` (``* **name**: ...`` and its indented lines)."""
    lines = GETTING_STARTED.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"* **{name}**")), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return " ".join(ln.strip() for ln in lines[start:end])


def stated(name: str) -> tuple[float | None, tuple[str, float] | None]:
    """The CPU time and the result Getting started states for a run (its bullet)."""
    line = bullet(name)
    t, r = TIME.search(line), RESULT.search(line)
    return (float(t.group(1)) if t else None), ((r.group(1), float(r.group(2))) if r else None)


def readme_snippet(marker: str, page: Path = README) -> tuple[str, float | None]:
    """The code of the page's python block after ``marker``, and the CPU time said before it."""
    before, _, after = page.read_text().partition(marker)
    head = after.split("```python\n", 1)[0]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    t = TIME.search(marker + head)
    return code, float(t.group(1)) if t else None


def run(command: list[str] | str, cwd: Path) -> tuple[int, str, float, float]:
    """Status, output, wall and CPU seconds (user + system of the finished children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(command, shell=isinstance(command, str), cwd=cwd, capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "PYTHONWARNINGS": "default"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.returncode, p.stdout + p.stderr, wall, cpu


def last_val(log_dir: Path, key: str) -> float | None:
    path = log_dir / "log.jsonl"
    if not path.is_file():
        return None
    vals = [json.loads(ln) for ln in path.read_text().splitlines() if '"mode": "val"' in ln]
    return float(vals[-1][key]) if vals and key in vals[-1] else None


def close(value: float, figure: float, text: str) -> bool:
    """``value`` reads as ``figure`` written with ``text``'s digits (0.99: within 0.005)."""
    digits = len(text.split(".")[1]) if "." in text else 0
    return abs(value - figure) <= 0.5 * 10 ** -digits + 1e-12


WARNING = re.compile(r"^\S*Warning\b|\bWarning:|^\[transformers\]", re.M)


def check(name: str, status: int, out: str, cpu: float, budget: float | None, result: tuple[str, float] | None,
          value: float | None) -> list[str]:
    problems = []
    if status != 0:
        problems.append(f"exit {status}: {out.strip().splitlines()[-1] if out.strip() else ''}")
    if budget is None:
        problems.append("no 'under N s of CPU time' stated")
    elif cpu > budget:
        problems.append(f"{cpu:.1f} s of CPU time, over the stated {budget:g} s")
    if result is not None:
        key, figure = result
        text = RESULT.search(f"{key} {figure}")
        if value is None or not close(value, figure, text.group(2) if text else str(figure)):
            problems.append(f"{key} {value} where {figure} is stated")
    warnings = sorted(set(m.group(0) for m in WARNING.finditer(out)))
    if warnings:
        problems.append(f"warnings: {warnings}")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated names (examples' folders, readme-python, readme-hf, "
                                  "getting-started-python)")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else None
    bin_dir = f"{Path(sys.executable).parent}/"
    failed = 0
    with tempfile.TemporaryDirectory(prefix="claims-") as tmp:
        clone = Path(tmp)
        (clone / "examples").symlink_to(ROOT / "examples")
        rows = []
        for r in RUNS:
            if only and r.name not in only:
                continue
            budget, result = stated(r.name)
            status, out, wall, cpu = run(r.command.replace(".venv/bin/", bin_dir), clone)
            if r.log:
                value = last_val(clone / r.log, r.key)
            else:
                found = re.findall(r.printed, out, re.M)  # the last: the end of the run
                value = float(found[-1]) if found else None
            problems = check(r.name, status, out, cpu, budget, result, value)
            if result is None or result[0] != r.key:
                problems.append(f"no '{r.key} X' stated")
            rows.append((r.name, wall, cpu, value, problems))
        snippets = (("readme-python", "## In Python\n", README),
                    ("readme-hf", "A Hugging Face model needs no wrapper", README),
                    ("getting-started-python", "## A first run in Python\n", GETTING_STARTED))
        for name, marker, page in snippets:
            if only and name not in only:
                continue
            code, budget = readme_snippet(marker, page)
            status, out, wall, cpu = run([sys.executable, "-c", code], clone)
            rows.append((name, wall, cpu, None, check(name, status, out, cpu, budget, None, None)))
        for name, wall, cpu, value, problems in rows:
            failed += bool(problems)
            what = f"{value:.4g}" if value is not None else "-"
            print(f"{name:18} {wall:6.1f} s wall {cpu:6.1f} s CPU  result {what:8}  "
                  f"{'; '.join(problems) if problems else 'as stated'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
