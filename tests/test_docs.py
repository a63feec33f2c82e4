"""The documentation cites files that exist, and its site works opened from disk."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# A path of this repository, or one of its top-level files, as the docs and docstrings cite them.
CITED = re.compile(r"(?<![\w/.-])((?:treadle|tests|benchmarks|examples|docs|tools|notes|\.ci)/[\w./-]*\w"
                   r"|DESIGN\.md|README\.md|CHANGELOG\.md|constraints\.txt|pyproject\.toml|mkdocs\.yml)")
# Files of MMEngine's own repository, which docs/mmengine.md names as such.
ELSEWHERE = {"tools/test.py", "tools/train.py", "tests/test_optim/test_scheduler/"}  # OpenMMLab's own files


def _texts() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "treadle").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.py")),
             *sorted((ROOT / "examples").rglob("*.yaml"))]
    return [p for p in pages if p.is_file()]


def test_the_docs_and_docstrings_cite_only_files_that_exist():
    missing = []
    for path in _texts():
        for m in CITED.finditer(path.read_text(encoding="utf-8")):
            cited = m.group(1)
            if cited in ELSEWHERE or cited.rstrip("/") + "/" in ELSEWHERE:
                continue
            if not ((ROOT / cited).exists() or (path.parent / cited).exists()):
                missing.append(f"{path.relative_to(ROOT)}: {cited}")
    assert not missing, missing


def _mkdocs() -> dict:
    class Loader(yaml.SafeLoader):  # mkdocs.yml names one Python object (the anchors' slugify)
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)  # noqa: S506 (SafeLoader subclass)


def test_the_site_is_configured_to_work_from_disk_without_the_network():
    config = _mkdocs()
    plugins = [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]]
    assert "search" in plugins and "offline" in plugins
    assert config["use_directory_urls"] is False and config["theme"]["font"] is False
    polyfills = config["extra"]["polyfills"]
    # Listing a shim named so stops the offline plugin adding its own from the network.
    assert polyfills == ["javascripts/iframe-worker.js"] and (ROOT / "docs" / polyfills[0]).is_file()
    for css in config["extra_css"]:
        assert (ROOT / "docs" / css).is_file()


@pytest.mark.slow  # builds the site (about 20 s)
def test_the_built_site_reads_from_disk(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = tmp_path / "site"
    index = (site / "search" / "search_index.js").read_text()
    assert index.startswith("var __index = {") and '"location":"getting-started.html"' in index
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"<script[^>]+src=\"https?://", text), page  # nothing fetched
        assert 'href="https://fonts.' not in text, page
    assert 'src="../javascripts/iframe-worker.js"' in (site / "api" / "trainer.html").read_text()
