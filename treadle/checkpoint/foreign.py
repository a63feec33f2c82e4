"""Reading the weights out of another tool's checkpoint file whose other entries hold
objects of classes ``weights_only`` refuses (an MMEngine ``.pth``: ``message_hub`` holds
``HistoryBuffer`` objects and numpy scalars beside a plain ``state_dict``).

The file is still read by ``torch.load(weights_only=True)``; each class or function it
names that torch does not allow is stood in for by an inert placeholder registered under
that name for this one load (``torch.serialization.safe_globals``). The placeholder takes
any arguments and any state and keeps nothing, so nothing the file names is imported or
run. The weights are then usable only if no placeholder sits inside them; the caller
checks that with :func:`holds_placeholder`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from treadle.compat import class_allowed_as, unsafe_globals_in


class Placeholder:
    """Stands in for a class or function a checkpoint names: built from anything, keeps nothing."""

    replaces = ""  # the full name in the file

    def __new__(cls, *args: Any, **kwargs: Any) -> "Placeholder":
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass  # the pickled state is dropped: nothing of it is kept or run

    def __repr__(self) -> str:
        return f"<placeholder for {self.replaces}>"


def _placeholder(name: str) -> type[Placeholder]:
    return class_allowed_as(name, Placeholder, {"replaces": name})


def unsafe_names(path: Path) -> list[str]:
    """The globals in ``path`` that ``weights_only`` does not allow (read from the pickle's
    opcodes, nothing run)."""
    return unsafe_globals_in(str(path))


def load_with_placeholders(path: Path, map_location: Any = "cpu") -> tuple[Any, list[str]]:
    """``torch.load(path, weights_only=True)`` with every global it does not allow read as
    a :class:`Placeholder`; returns the object and the names replaced."""
    names = unsafe_names(path)
    with torch.serialization.safe_globals([_placeholder(n) for n in names]):
        obj = torch.load(path, map_location=map_location, weights_only=True)
    return obj, names


def holds_placeholder(obj: Any, depth: int = 0) -> bool:
    """Whether a placeholder is ``obj`` or inside its dicts, lists and tuples."""
    if isinstance(obj, Placeholder):
        return True
    if depth > 32:  # weights are shallow; deeper nesting is not a state dict
        return True
    if isinstance(obj, Mapping):
        return any(holds_placeholder(k, depth + 1) or holds_placeholder(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(holds_placeholder(v, depth + 1) for v in obj)
    return False


def entries_with_placeholders(obj: Any) -> list[str]:
    """The top-level entries of a checkpoint dict that hold placeholders (what was skipped)."""
    if not isinstance(obj, Mapping):
        return []
    return [str(k) for k, v in obj.items() if holds_placeholder(v)]


__all__ = ["Placeholder", "entries_with_placeholders", "holds_placeholder", "load_with_placeholders", "unsafe_names"]
