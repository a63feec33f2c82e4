"""Read config files (YAML or Python), follow ``_base_``, apply ``--set`` overrides.

YAML is read with a safe loader only: the YAML parser creates no Python objects
(the config built from it still can: a dotted ``type:`` imports and calls what it
names, see :mod:`treadle.components.safe`). A Python config is code that runs: it is
executed like a script (its directory first on ``sys.path``) and its module-level
names become the keys (with ``safe=True`` it is refused instead, as a base too).
Names starting with an underscore, modules, classes and functions are not keys
(they are imports and helpers); ``_base_`` is the one underscore name that is read.

``_base_: path`` (or a list of paths, relative to the file) names configs this one
builds on; they are read first, so that ``{{_base_.x}}`` and, in Python, ``_base_.x``
reuse their values (:mod:`treadle.config.base_refs`). Bases are merged in order, then the file itself: dicts merge key by key,
anything else (lists included) is replaced by the later value, and a dict holding
``_delete_: true`` replaces the inherited dict instead of merging into it.
"""

from __future__ import annotations

import ast
import copy
import re
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Iterable

import yaml

from treadle.config.base_refs import BaseView, mark_references, plain, substitute, take_base_assignment
from treadle.components.errors import ConfigError
from treadle.components.safe import refused_python_file

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"
SUFFIXES = (".yaml", ".yml", ".py")


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` as a float.

    YAML 1.1 (PyYAML) wants ``1.0e-3`` and reads ``1e-3`` as the *string* "1e-3",
    a classic trap for learning rates. It also refuses a key given twice in one mapping.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refusing a key given twice (PyYAML would keep the last one silently).

        Keys merged in with ``<<:`` may be overridden, as YAML intends; only keys written
        in this mapping are compared."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not key_node:
                    raise DuplicateKeyError(key, first.start_mark, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A mapping key given twice (see ``_Loader.construct_mapping``)."""

    def __init__(self, key: Any, first: Any, again: Any) -> None:
        super().__init__(problem=f"duplicate key {key!r}", problem_mark=again)
        self.key, self.first, self.again = key, first, again


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text safely; a syntax error becomes a ConfigError with line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 -- _Loader is a SafeLoader
    except DuplicateKeyError as e:
        raise ConfigError(str(e.key), f"duplicate key at line {e.again.line + 1}, column {e.again.column + 1} (first "
                          f"given at line {e.first.line + 1}); each key may appear once in a mapping, or the "
                          "later value would silently replace the earlier one", source=source) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError("", f"malformed YAML at {where}: {problem}", source=source) from None
    except yaml.YAMLError as e:
        raise ConfigError("", f"malformed YAML: {e}", source=source) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = parse_yaml(mark_references(path.read_text(encoding="utf-8")), source=str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("", "the top level of a config must be a mapping of keys", value=data,
                          expected="'key: value' lines", source=str(path))
    return data


def _is_helper(value: Any) -> bool:
    return isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType))


def _parse_python(path: Path) -> tuple[ast.Module, Any]:
    """The file's code, its ``{{_base_.x}}`` marked, without its ``_base_ = ...`` line,
    and that line's value (None: no bases)."""
    try:
        tree = ast.parse(mark_references(path.read_text(encoding="utf-8")), str(path))
    except SyntaxError as e:
        raise ConfigError("", f"Python syntax error at line {e.lineno}, column {e.offset}: {e.msg}",
                          source=str(path)) from None
    return tree, take_base_assignment(tree, str(path))


def _run_python(path: Path, tree: ast.Module, base: BaseView) -> dict[str, Any]:
    """Run the file's code; ``base`` (the merged bases) is what ``_base_`` names in it."""
    code_globals: dict[str, Any] = {"__file__": str(path), "__name__": f"treadle_config_{path.stem}", BASE_KEY: base}
    sys.path.insert(0, str(path.parent))  # like `python file.py`: siblings are importable
    try:
        exec(compile(tree, str(path), "exec"), code_globals)  # noqa: S102 -- a Python config is documented as code that runs
    except ConfigError:
        raise
    except Exception as e:
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f" at line {lines[-1]}" if lines else ""
        raise ConfigError("", f"running the Python config failed{where}: {type(e).__name__}: {e}",
                          source=str(path)) from e
    finally:
        try:
            sys.path.remove(str(path.parent))
        except ValueError:
            pass
    return plain({k: v for k, v in code_globals.items() if not k.startswith("_") and not _is_helper(v)})


def _check_path(path: Path, safe: bool) -> None:
    if not path.is_file():
        problem = "is a directory, not a config file" if path.is_dir() else "no such config file"
        raise ConfigError("", problem, source=str(path))
    if path.suffix not in SUFFIXES:
        raise ConfigError("", f"unsupported config file type {path.suffix!r}",
                          expected=" or ".join(SUFFIXES), source=str(path))
    if safe and path.suffix == ".py":
        raise refused_python_file(str(path))


def merge(base: Any, override: Any) -> Any:
    """``override`` on top of ``base``: dicts merge recursively, the rest is replaced;
    a dict with ``_delete_: true`` replaces the base dict instead of merging."""
    if isinstance(base, dict) and isinstance(override, dict) and not override.get(DELETE_KEY, False):
        out = dict(base)
        for k, v in override.items():
            if k == DELETE_KEY:
                continue
            out[k] = merge(base[k], v) if k in base else strip_delete(v)
        return out
    return strip_delete(override)


def strip_delete(value: Any) -> Any:
    """Remove ``_delete_`` markers that have nothing left to replace."""
    if isinstance(value, dict):
        return {k: strip_delete(v) for k, v in value.items() if k != DELETE_KEY}
    if isinstance(value, list):
        return [strip_delete(v) for v in value]
    return value


def load_file(path: str | Path, _chain: tuple[Path, ...] = (), *, safe: bool = False) -> dict[str, Any]:
    """A config file with its ``_base_`` chain merged in (errors name the file).
    ``safe``: ``.py`` files are refused, the top-level one and every base, before any runs.
    The bases are read first, so that ``{{_base_.x}}`` and (in Python) ``_base_.x`` find
    their values (:mod:`treadle.config.base_refs`)."""
    path = Path(path).resolve() if _chain else Path(path)
    if path.resolve() in [p.resolve() for p in _chain]:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise ConfigError(BASE_KEY, f"inheritance cycle: {cycle}", source=str(_chain[0]))
    _check_path(path, safe)
    if path.suffix == ".py":
        tree, bases = _parse_python(path)
    else:
        data = _read_yaml(path)
        bases = data.pop(BASE_KEY, None)
    if isinstance(bases, str):
        bases = [bases]
    if bases is not None and (not isinstance(bases, list) or not all(isinstance(b, str) for b in bases)):
        raise ConfigError(BASE_KEY, "must be a path or a list of paths", value=bases,
                          expected="e.g. _base_: ../base.yaml", source=str(path))
    if safe:  # every base of this file is checked before the first is read
        for base in bases or []:
            if Path(base).suffix == ".py":
                raise refused_python_file(base, listed_in=str(path))
    merged: dict[str, Any] = {}
    for base in bases or []:
        base_path = (path.parent / base)
        if not base_path.is_file():
            raise ConfigError(BASE_KEY, f"base config {base!r} not found (looked at {base_path})", source=str(path))
        merged = merge(merged, load_file(base_path, (*_chain, path), safe=safe))
    if path.suffix == ".py":
        view = BaseView(merged)
        data = _run_python(path, tree, view)
        merged = plain(view)  # the file may have set keys of _base_ (MMEngine merges them too)
    data = substitute(data, merged, str(path))
    return strip_delete(data) if bases is None else merge(merged, data)


def has_variables(path: str | Path) -> bool:
    """Whether the config at ``path`` may hold variables: it is a Python file, or one of its
    ``_base_`` files is (whose helper names the merge brings in); a YAML chain has none."""
    path = Path(path)
    if path.suffix == ".py":
        return True
    try:
        bases = _read_yaml(path).get(BASE_KEY) or []
    except (ConfigError, OSError):
        return False  # the load says what is wrong
    bases = [bases] if isinstance(bases, str) else bases
    return any(isinstance(b, str) and (path.parent / b).is_file() and has_variables(path.parent / b)
               for b in bases)


# -- --set overrides --------------------------------------------------------------------
def parse_override(text: str) -> tuple[list[str | int], Any]:
    """``"optimizer.lr=0.1"`` -> ``(["optimizer", "lr"], 0.1)``; the value is read as YAML
    (so ``3`` is an int, ``[1, 2]`` a list, ``null`` None); ``hooks[0].x`` or ``hooks.0.x``
    index lists."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text}", "an override must look like KEY=VALUE", expected="e.g. optimizer.lr=0.01")
    parts: list[str | int] = []
    for seg in re.sub(r"\[(\d+)\]", r".\1", key).split("."):
        if not seg:
            raise ConfigError(f"--set {text}", f"empty segment in the key {key!r}", expected="e.g. a.b.c=1")
        parts.append(int(seg) if seg.isdigit() else seg)
    try:
        value = parse_yaml(raw, source=f"--set {key}") if raw.strip() else None
    except ConfigError as e:
        raise ConfigError(f"--set {key}", f"cannot read the value {raw!r} as YAML ({e.problem})") from None
    return parts, value


def blamed_on(path: str, file: str, overrides: Iterable[str]) -> str:
    """Where a config error at the key ``path`` comes from, for its line: ``--set`` when an
    override set that key, a key inside it or the section it is in; else the config ``file``."""
    def norm(key: str) -> str:
        return re.sub(r"\[(\d+)\]", r".\1", key.strip())

    at = norm(path)
    for text in overrides:
        key = norm(text.partition("=")[0])
        if key and (at == key or at.startswith(key + ".") or key.startswith(at + ".")):
            return "--set"
    return file


def apply_overrides(cfg: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``cfg`` with each ``KEY=VALUE`` set (missing dicts are created)."""
    cfg = copy.deepcopy(cfg)
    for text in overrides:
        parts, value = parse_override(text)
        node: Any = cfg
        for i, seg in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(map(str, parts[:i])) or "the config"
            if isinstance(node, list):
                if not isinstance(seg, int) or not -len(node) <= seg < len(node):
                    raise ConfigError(f"--set {text.partition('=')[0]}", f"{where} is a list of {len(node)} items; "
                                      f"{seg!r} is not an index in it")
            elif isinstance(node, dict):
                seg = str(seg)
            else:
                raise ConfigError(f"--set {text.partition('=')[0]}", f"{where} is {node!r}, not a mapping or list")
            if last:
                node[seg] = value
            else:
                if isinstance(node, dict) and node.get(seg) is None:
                    if isinstance(parts[i + 1], int):
                        raise ConfigError(f"--set {text.partition('=')[0]}",
                                          f"{'.'.join(map(str, parts[:i + 1]))} is not set, so it has no item {parts[i + 1]}")
                    node[seg] = {}
                node = node[seg]
    return cfg


__all__ = ["apply_overrides", "blamed_on", "has_variables", "load_file", "merge", "parse_override", "parse_yaml"]
