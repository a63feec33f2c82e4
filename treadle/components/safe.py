"""Safe mode: what a config from a less trusted place may name.

By default a config file is trusted like code (as MMEngine's are): a dotted ``type:``
imports its module and calls what it names, ``collate_fn: pkg.fn`` is imported, and
``.py`` configs and ``.py`` bases run. Safe mode (``treadle train --safe``,
``load_config(..., safe=True)``, ``build_trainer(cfg, safe=True)``,
``Trainer(..., safe=True)``) runs no code named by a config. A name may then only be

* a registered name: a key of the dicts in :mod:`treadle.components.registry`, or
* a public class defined in ``torch.nn`` or ``torch.optim`` (their submodules
  included), written as its path from ``torch``: ``torch.nn.CrossEntropyLoss``,
  ``torch.optim.lr_scheduler.StepLR``. It is looked up attribute by attribute in the
  torch that treadle has already imported: nothing is imported, no module-level
  ``__getattr__`` or descriptor runs, and functions (``torch.load``,
  ``torch.hub.load``, ``torch.nn.functional.relu``) are not classes, so they are refused.

Everything else is refused with one :class:`ConfigError` before it is imported:
other dotted paths, a ``collate_fn`` string, ``.py`` config files and ``.py`` bases.
Objects given from Python (a class, a function) are not names: code is trusted.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from treadle.components.errors import ConfigError

#: The torch packages whose classes safe mode accepts by dotted path.
TORCH_PACKAGES = ("torch.nn", "torch.optim")

#: The rule, as every refusal states it.
RULE = "safe mode allows only registered names and torch.nn / torch.optim classes"

#: What to do instead, when a name is refused.
REGISTER_HINT = ("Register it from Python (treadle.components.registry, e.g. MODELS['Net'] = Net) or, if you trust "
                 "the config as code, load it without safe mode.")


def _in_torch_packages(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in TORCH_PACKAGES)


def torch_class(dotted: str) -> type | None:
    """The public class of ``torch.nn`` / ``torch.optim`` that ``dotted`` names, or None.

    Each step must be a public attribute (no leading underscore) found in the object's
    own namespace (``inspect.getattr_static``: no ``__getattr__``, no descriptor runs);
    a step that is a module must be the very submodule the path spells (so
    ``torch.nn.functional.torch`` does not reach all of torch); the end must be a class
    defined in one of :data:`TORCH_PACKAGES`.
    """
    parts = dotted.split(".")
    if len(parts) < 3 or parts[0] != "torch" or not _in_torch_packages(".".join(parts[:2])):
        return None
    if any(not p.isidentifier() or p.startswith("_") for p in parts):
        return None
    obj: Any = sys.modules.get("torch")
    if obj is None:  # treadle imports torch; without it there is nothing to look up
        return None
    for i in range(1, len(parts)):
        try:
            obj = inspect.getattr_static(obj, parts[i])
        except AttributeError:
            return None
        if isinstance(obj, types.ModuleType) and obj.__name__ != ".".join(parts[:i + 1]):
            return None  # a module imported under another name (e.g. torch.nn.functional.importlib)
        if not isinstance(obj, (types.ModuleType, type)):
            return None
    if not inspect.isclass(obj) or not _in_torch_packages(getattr(obj, "__module__", "") or ""):
        return None
    return obj


def refused(path: str, value: Any, expected: str, hint: str = REGISTER_HINT) -> ConfigError:
    """The one-line error for a dotted name safe mode does not allow."""
    return ConfigError(path, f"{RULE}, not this dotted import path", value=value, expected=expected, hint=hint)


def refused_python_file(path: str, *, listed_in: str | None = None) -> ConfigError:
    """The one-line error for a ``.py`` config (``listed_in``: the file whose ``_base_`` names it)."""
    if listed_in is None:
        return ConfigError("", "safe mode refuses Python config files: loading one runs its code",
                           expected="a YAML config (.yaml, .yml)", source=path)
    return ConfigError("_base_", f"safe mode refuses the Python base {path!r}: loading it would run its code",
                       expected="YAML bases (.yaml, .yml)", source=listed_in)


__all__ = ["REGISTER_HINT", "RULE", "TORCH_PACKAGES", "refused", "refused_python_file", "torch_class"]
