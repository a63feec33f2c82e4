"""The README stays a front page: at most 200 lines, the two commands first, and every
link in it leads to a file of the repository (the reference lives in docs/, a site)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200, "move the detail to a page under docs/"


def test_readme_opens_with_the_two_commands():
    first_block = README.split("```", 2)[1]
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
