"""The layers of treadle/, as docs/architecture.md writes them (the one place): no import
climbs a layer, and no two files import each other, however indirectly. Every import
counts: at the top of a file, inside a function, under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "treadle"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def layers(text: str) -> dict[str, int]:
    """``{module prefix: layer}`` from the table's rows (``| 3 | `treadle.data`, ... | ... |``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for name in re.findall(r"`([\w.]+)`", row.group(2)):
                out[name] = int(row.group(1))
    return out


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the longest prefix of ``module`` in the table."""
    best = max((p for p in table if module == p or module.startswith(p + ".")), key=len, default=None)
    return table[best] if best is not None else None


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """``(module imported, line)`` for every import of a treadle module in ``path``: ``from
    pkg import name`` counts as ``pkg.name`` when that is a module, else as ``pkg``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found += [(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, node.lineno) for a in node.names]
    return [(m, line) for m, line in found if m.split(".")[0] == "treadle"]


def climbing(root: Path = PACKAGE, table: dict[str, int] | None = None) -> list[str]:
    """Every import of ``root``'s files that climbs a layer of ``table``, as a line naming both."""
    table = table if table is not None else layers(ARCHITECTURE.read_text())
    known = modules(root)
    out = []
    for name, path in sorted(known.items()):
        mine = layer_of(name, table)
        for target, line in imports(name, path, known):
            theirs = layer_of(target, table)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{path.relative_to(root.parent)}:{line}: {name} (layer {mine}) imports {target} "
                           f"(layer {theirs})")
    return out


def circles(root: Path = PACKAGE) -> list[list[str]]:
    """Files that import each other, directly or through others (Tarjan's components)."""
    known = modules(root)
    edges = {m: {t for t, _ in imports(m, p, known) if t in known and t != m} for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))
    for v in sorted(known):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    table = layers(ARCHITECTURE.read_text())
    assert len(set(table.values())) >= 8, table  # the table was read
    assert [m for m in modules() if layer_of(m, table) is None] == []


def test_no_import_climbs_a_layer() -> None:
    assert climbing() == []


def test_no_import_circle() -> None:
    assert circles() == []


@pytest.fixture
def house(tmp_path: Path) -> Path:
    """A package of three layers, as the checks see a tree."""
    pkg = tmp_path / "treadle"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    for f in ("__init__.py", "low/__init__.py", "high/__init__.py", "low/a.py", "high/b.py"):
        (pkg / f).write_text("")
    return pkg


def test_a_climbing_import_is_found_wherever_it_is_written(house: Path) -> None:
    table = {"treadle": 3, "treadle.high": 2, "treadle.low": 1}
    assert climbing(house, table) == []
    (house / "high" / "b.py").write_text("from treadle.low import a\n")  # down: fine
    assert climbing(house, table) == []
    (house / "low" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from treadle.high.b import Thing\n\ndef f():\n    import treadle.high\n")
    assert climbing(house, table) == [
        "treadle/low/a.py:3: treadle.low.a (layer 1) imports treadle.high.b (layer 2)",
        "treadle/low/a.py:6: treadle.low.a (layer 1) imports treadle.high (layer 2)"]
    assert circles(house) == [["treadle.high.b", "treadle.low.a"]]
