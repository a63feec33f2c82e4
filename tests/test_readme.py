"""The README stays a front page: at most 200 lines, the two commands first, and every
link in it leads to a file of the repository (the reference lives in docs/, a site). It
and the docs speak of the software (no word of how it is developed), give one figure per
claim, and their commands work as typed after `make demo`."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200, "move the detail to a page under docs/"


def test_readme_opens_with_the_two_commands():
    first_block = README.split("```", 2)[1].split("\n", 1)[1]  # (after the language tag)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"], first_block


def test_readme_links_lead_to_files():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to the docs pages"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_docs_page_is_in_the_site_nav():
    # mkdocs.yml holds one tag of pymdownx (its anchor slugs); the nav is plain YAML.
    text = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    pages = _nav_pages(yaml.safe_load("nav:\n" + text)["nav"])
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk


# -- what the README and the docs say ------------------------------------------------------
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Words about how the project is made, not about the software: history goes to CHANGELOG.md.
DEVELOPMENT = re.compile(r"\bsessions?\b|\bissues? ?#?\d|\bcampaign|\brounds? of\b|\bevery round\b|\bwas \d+(\.\d+)?x"
                         r"|\bfixed after\b|\bbefore the rework\b", re.IGNORECASE)


def test_no_page_speaks_of_how_the_project_is_developed():
    found = [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for p in PAGES for m in DEVELOPMENT.finditer(p.read_text())]
    assert not found, found


def _row(page: Path, starts: str) -> str:
    return next(line for line in page.read_text().splitlines() if line.startswith(starts))


def test_one_figure_per_claim_everywhere():
    """The host cost per step: the README and the docs' home page give the figure of
    docs/performance.md's table. The engines side by side: the README's rows, the
    comparison page's table and performance.md's speed figures are those of
    docs/comparison.json, which benchmarks/peers_compare.py wrote."""
    perf = ROOT / "docs" / "performance.md"
    host = re.search(r"\| (\d\.\d+x) \(IQR", _row(perf, "| default `Trainer` against a hand loop")).group(1)
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        said = re.findall(r"(\d\.\d+x) a hand-written\s+loop's", page.read_text())
        assert said == [host], (page.name, said, host)
    results = json.loads((ROOT / "docs" / "comparison.json").read_text())
    for line in results["readme_table"]:
        assert line in README.splitlines(), line
    page = (ROOT / "docs" / "comparison.md").read_text().splitlines()
    for line in results["table"]:
        assert line in page, line
    speed = _row(perf, "| beside Lightning, Accelerate, MMEngine, Ignite")
    for engine, cell in results["readme"]["speed"].items():
        assert cell in speed, (engine, cell, speed)


def _bash_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(the text before it, its command lines) of each ```bash block."""
    parts = text.split("```bash\n")
    return [(before, [ln.split("#")[0].strip() for ln in block.split("```")[0].splitlines() if ln.split("#")[0].strip()])
            for before, block in itertools.pairwise(parts)]


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_commands_work_as_typed_after_make_demo(page):
    """No bare `treadle`, `python` or `pytest`: make demo activates nothing. A bare pip
    only where the page says it is for an environment of one's own."""
    for before, commands in _bash_blocks((ROOT / page).read_text()):
        for command in commands:
            assert not command.startswith(("treadle ", "python ", "pytest ")), command
            if command.startswith("pip "):
                assert "environment of your own" in before.rsplit("```", 1)[-1], command


def _readme_block(title: str) -> list[str]:
    section = README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    return _bash_blocks(section)[0][1]


@pytest.mark.slow  # subprocesses: two short trainings and a report
def test_the_readme_commands_after_make_demo_run(tmp_path):
    """The README's lines after `make demo`, as typed, in a directory laid out as a clone
    (examples/ beside them), with this environment's commands for .venv's."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = f"{Path(sys.executable).parent}/"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    commands = _readme_block("After `make demo`")
    assert [c.split()[0] for c in commands] == [".venv/bin/treadle"] * len(commands)
    outputs = []
    for command in commands:
        proc = subprocess.run(command.replace(".venv/bin/", bin_dir), shell=True, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
        outputs.append(proc.stdout + proc.stderr)
    assert "resume: optimizer.lr = 0.001 from the checkpoint, not 0.002 as configured" in outputs[1]
    assert yaml.safe_load((tmp_path / "runs" / "first" / "config.yaml").read_text())["optimizer"]["lr"] == 0.001
    assert (tmp_path / "runs" / "first" / "report" / "summary.md").is_file()
    # `treadle --help`'s examples hold on that run (the first one is the README's own first line, run above);
    # the demo's runs/digits, which one of them reads, stands in as a copy of it.
    from treadle.cli import EPILOG

    shutil.copytree(tmp_path / "runs" / "first", tmp_path / "runs" / "digits")
    examples = [line.split("#")[0].strip() for line in EPILOG.splitlines() if line.startswith("  treadle ")]
    assert examples[0] == commands[0].replace(".venv/bin/", ""), examples[0]
    for example in examples[1:]:
        proc = subprocess.run(bin_dir + example, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (example, proc.stdout[-2000:], proc.stderr[-2000:])


@pytest.mark.slow  # the snippet trains as it is
@pytest.mark.parametrize("page, title", [("README.md", "## In Python"),
                                         ("docs/getting-started.md", "## A first run in Python")])
def test_the_python_snippet_runs_as_typed(tmp_path, monkeypatch, page, title):
    code = (ROOT / page).read_text().split(title, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, page, "exec"), {})
    work = tmp_path / re.search(r'work_dir="([^"]+)"', code).group(1)
    vals = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines() if '"mode": "val"' in line]
    assert vals and vals[-1]["val/acc"] > 0.6  # chance: 0.25


@pytest.mark.slow  # the snippet trains as it is
def test_the_readme_hugging_face_snippet_trains_and_saves(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    section = README.split("A Hugging Face model needs no wrapper", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        torch.set_num_threads(threads)  # the snippet sets one thread
    records = [json.loads(line) for line in (tmp_path / "runs" / "llama" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["mode"] == "train"]
    assert losses[-1] < losses[0] / 4  # it learns the counting
    assert (tmp_path / "runs" / "llama" / "checkpoints" / "iter_00000300").is_dir()
