"""References to a config's bases: ``{{_base_.x}}`` and, in Python configs, ``_base_.x``.

MMEngine's configs reuse values of the files they inherit from in two ways, both read
here as MMEngine reads them:

* ``{{_base_.a.b}}`` (YAML or Python): the text is replaced by a marker string before
  the file is parsed, and each marker by a copy of the merged bases' ``a.b`` once the
  file is read. A marker is data: nothing runs for it, in YAML nor in safe mode.
* ``_base_.a.b`` (Python only): the file runs with the name ``_base_`` bound to the
  merged bases (a dict whose keys also read as attributes). Its own ``_base_ = [...]``
  line is taken out of the code and read as a literal, so the bases are loaded before
  the file runs. A Python config is code that runs anyway (refused in safe mode).
"""

from __future__ import annotations

import ast
import copy
import re
from typing import Any

from treadle.components.errors import ConfigError

BASE_KEY = "_base_"
_REF = re.compile(r"""(["']?)\{\{\s*_base_\.([\w.]+)\s*\}\}\1""")
_MARK = "__treadle_base_reference__:"


def mark_references(text: str) -> str:
    """``text`` with every ``{{_base_.a.b}}`` (quoted or not) replaced by a quoted marker."""
    return _REF.sub(lambda m: f'"{_MARK}{m.group(2)}"', text)


def lookup(base: dict[str, Any], dotted: str, source: str) -> Any:
    """``base``'s value at ``a.b.c`` (a digit indexes a list); an error names the reference."""
    node: Any = base
    for i, part in enumerate(dotted.split(".")):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            where = ".".join(dotted.split(".")[:i]) or "the bases"
            raise ConfigError(f"_base_.{dotted}", f"not found: {where} has no {part!r}",
                              expected="a key that the files in _base_ define", source=source)
    return copy.deepcopy(node)


def substitute(value: Any, base: dict[str, Any], source: str) -> Any:
    """``value`` with each marker string replaced by the base value it names."""
    if isinstance(value, str) and value.startswith(_MARK):
        return plain(lookup(base, value[len(_MARK):], source))
    if isinstance(value, dict):
        return {k: substitute(v, base, source) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, base, source) for v in value]
    if isinstance(value, tuple):
        return tuple(substitute(v, base, source) for v in value)
    return value


class BaseView(dict):  # type: ignore[type-arg]
    """The merged bases as a Python config sees them: ``_base_.model.backbone`` reads
    (and, as in MMEngine, writes and deletes) keys as attributes; nested dicts are views too."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__({k: _view(v) for k, v in data.items()})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"_base_ has no key {name!r} (the keys the files in _base_ define: "
                                 f"{', '.join(sorted(map(str, self))) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:  # ``del _base_.model``: the file gives its own
        try:
            del self[name]
        except KeyError:
            raise AttributeError(f"_base_ has no key {name!r}") from None


def _view(value: Any) -> Any:
    if isinstance(value, dict):
        return BaseView(value)
    if isinstance(value, list):
        return [_view(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """``value`` with every :class:`BaseView` turned back into a plain dict."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value


def take_base_assignment(tree: ast.Module, source: str) -> Any:
    """Remove the module-level ``_base_ = ...`` from ``tree`` and return its value (a
    literal: a path or a list of paths), or None when the file has none."""
    value: Any = None
    body = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == BASE_KEY for t in targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(BASE_KEY, f"must be a literal path or list of paths (line {node.lineno})",
                                  expected="e.g. _base_ = ['../_base_/default_runtime.py']", source=source) from None
            continue
        body.append(node)
    tree.body = body
    return value


__all__ = ["BASE_KEY", "BaseView", "lookup", "mark_references", "plain", "substitute", "take_base_assignment"]
