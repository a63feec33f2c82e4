"""Submodules as attributes: after a bare ``import treadle``, every dotted name the
documentation writes (``treadle.seeding.seed_everything``,
``treadle.checkpoint.sharded.consolidate``) resolves, its module imported on first use,
as the public names are (treadle/__init__.py), so that nothing is imported before it is
needed."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def import_submodule(package: str, name: str) -> ModuleType:
    """``package.name`` imported, for a package's ``__getattr__`` (PEP 562); an
    AttributeError when ``name`` is no submodule of ``package``."""
    if not name.startswith("_"):
        full = f"{package}.{name}"
        try:
            found = importlib.util.find_spec(full) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return importlib.import_module(full)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


__all__ = ["import_submodule"]
