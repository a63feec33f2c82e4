"""`make demo` installs what the demo needs and no more; `make test` the rest on top."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = (ROOT / "Makefile").read_text()


def _rule(target: str) -> tuple[list[str], list[str]]:
    """(prerequisites, recipe lines) of ``target``'s rule."""
    head, _, rest = MAKEFILE.partition(f"\n{target}:")
    assert rest, target
    first, *lines = rest.split("\n")
    recipe = []
    for line in lines:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return first.split(), recipe


def _pyproject_extras() -> dict[str, str]:
    """``{extra: its list, as written}`` of pyproject.toml (no tomllib on Python 3.10)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r"^(\w+) = (\[[^\]]*\])", section, re.M))


def _extras(recipe: list[str]) -> set[str]:
    return {e for line in recipe for group in re.findall(r"-e '\.\[([^\]]*)\]'", line) for e in group.split(",")}


def test_make_demo_installs_torch_treadle_and_the_examples_extra_only():
    prerequisites, recipe = _rule("demo")
    assert prerequisites == ["$(DEMO_STAMP)"]  # not the full install
    _, install = _rule("$(DEMO_STAMP)")
    assert _extras(install) == {"examples"}
    assert _pyproject_extras()["examples"] == '["scikit-learn"]'


def test_make_test_installs_the_rest_on_top():
    prerequisites, install = _rule("$(STAMP)")
    assert prerequisites == ["$(DEMO_STAMP)"]
    # vision: .venv-vision; mmengine: the packages of make test-mm, in .venv/openmmlab
    assert _extras(install) == set(_pyproject_extras()) - {"examples", "vision", "mmengine"} == {
        "dev", "trackers", "deepspeed", "hf", "docs", "streams"}
    for target in ("lint", "test-fast", "docs"):  # what make test runs needs the full install
        assert "$(STAMP)" in _rule(target)[0], target


def test_make_test_runs_the_vision_tests_in_their_own_venv():
    """timm and torchvision never enter .venv (torchvision there breaks transformers): the vision
    extra goes to .venv-vision, whose tests `make test` runs too."""
    _, recipe = _rule("test")
    assert "$(MAKE) test-vision" in recipe and "$(MAKE) test-mm" in recipe
    # A prerequisite is expanded where its rule is read: the stamps are defined below `test`, so
    # `test` reaches them through the recipe, where make expands every variable.
    prerequisites, recipe = _rule("test-vision")
    assert "$(VSTAMP)" in prerequisites and "$(VPY) -m pytest tests/vision -p no:cacheprovider" in recipe
    _, install = _rule("$(VSTAMP)")
    assert _extras(install) == {"dev", "vision"}
    assert _pyproject_extras()["vision"] == '["timm", "torchvision"]'
