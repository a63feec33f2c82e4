"""MMEngine, an optional dependency (``pip install 'treadle[mmengine]'``): every use of it in
treadle goes through :func:`import_mmengine`, which imports it where it is needed and, when it
is not installed, says in one line which extra installs it."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

from treadle.components.errors import ConfigError

#: The extra that installs MMEngine (pyproject.toml).
INSTALL = "pip install 'treadle[mmengine]'"


def import_mmengine(why: str, module: str = "registry") -> Any:
    """``mmengine.<module>``, or a ConfigError saying which extra installs it. Every use of
    MMEngine goes through here: it is optional, imported where it is needed."""
    try:
        return importlib.import_module(f"mmengine.{module}" if module else "mmengine")
    except ImportError as e:
        if (e.name or "").split(".")[0] != "mmengine":
            raise  # mmengine is there but fails to import something itself
        raise ConfigError("", f"{why} needs MMEngine, which is not installed: {INSTALL}") from None


@functools.cache
def installed() -> bool:
    """Whether ``mmengine`` can be found (not imported)."""
    return importlib.util.find_spec("mmengine") is not None


__all__ = ["INSTALL", "import_mmengine", "installed"]
