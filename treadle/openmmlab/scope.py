"""An OpenMMLab project's registries: the type names of its config (``ImageClassifier``,
``MNIST``, ``Accuracy``) built by MMEngine's own registries, in the config's
``default_scope``, as MMEngine's Runner builds them.

:class:`ProjectScope` is the :class:`~treadle.components.registry.Scope` that
:mod:`treadle.config.assemble` hands the builders of :mod:`treadle.components.build`: they ask it
for each type name treadle's own registries lack (a name both know is treadle's). It
imports ``mmengine`` only then, so a config whose every type is treadle's runs without it.

============  ==================  ===========================================================
kind          MMEngine registry   built as the Runner builds it
============  ==================  ===========================================================
model         ``MODELS``          ``MODELS.build(cfg)`` (nested parts: by the model itself)
dataset       ``DATASETS``        ``DATASETS.build(cfg)``, then ``full_init()``
sampler       ``DATA_SAMPLERS``   with ``dataset`` and ``seed`` as default arguments
collate_fn    ``FUNCTIONS``       the function, with the spec's other keys bound
metric        ``METRICS``         ``METRICS.build(cfg)`` (inside an evaluator)
evaluator     ``EVALUATOR``       ``{metrics: [...]}`` specs (treadle/openmmlab/evaluator.py)
hook          ``HOOKS``           ``HOOKS.build(cfg)``, then adapted: treadle/openmmlab/hooks.py
optimizer     ``OPTIMIZERS``      the class, which treadle's optimizer wrapper builds as torch's
optim_        ``OPTIM_WRAPPER_    the torch optimizer the project's constructor builds over the
constructor   CONSTRUCTORS``      model (its parameter groups), which treadle wraps
============  ==================  ===========================================================

``custom_imports`` (``{imports: [...], allow_failed_imports: false}``) are imported when the
scope is made, before anything is built, as MMEngine's ``Config`` imports them; safe mode
refuses them (:func:`check_custom_imports`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from typing import Any, Iterator

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.mm import import_mmengine, installed
from treadle.suggest import did_you_mean

#: treadle's kind of component -> the name of MMEngine's registry (mmengine.registry).
REGISTRY_OF = {"model": "MODELS", "dataset": "DATASETS", "sampler": "DATA_SAMPLERS", "collate_fn": "FUNCTIONS",
               "metric": "METRICS", "evaluator": "EVALUATOR", "hook": "HOOKS", "transform": "TRANSFORMS",
               "optimizer": "OPTIMIZERS", "optim_constructor": "OPTIM_WRAPPER_CONSTRUCTORS"}


def check_custom_imports(spec: Any, *, safe: bool = False) -> list[str]:
    """``custom_imports``' module names, checked (a mapping with ``imports``: a name or a list
    of names, and ``allow_failed_imports``); safe mode refuses any."""
    if spec is None:
        return []
    if safe:
        raise ConfigError("custom_imports", "safe mode imports no module a config names", value=spec,
                          expected="no custom_imports (load a trusted config without --safe, or import the "
                                   "project's modules from Python first)")
    if not isinstance(spec, dict) or "imports" not in spec or not set(spec) <= {"imports", "allow_failed_imports"}:
        raise ConfigError("custom_imports", "not a custom_imports mapping", value=spec,
                          expected="{imports: [my_project.models, ...], allow_failed_imports: false}")
    names = [spec["imports"]] if isinstance(spec["imports"], str) else spec["imports"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError("custom_imports.imports", "not a list of module names", value=spec["imports"],
                          expected="[my_project.models, ...]")
    if not isinstance(spec.get("allow_failed_imports", False), bool):
        raise ConfigError("custom_imports.allow_failed_imports", "not a bool", value=spec["allow_failed_imports"],
                          expected="true or false")
    return names


def run_custom_imports(spec: Any) -> None:
    """Import ``custom_imports``' modules (checked first); a module that fails to import is
    an error naming it, or a warning with ``allow_failed_imports: true``."""
    names = check_custom_imports(spec)
    for i, name in enumerate(names):
        try:
            importlib.import_module(name)
        except Exception as e:
            line = f"cannot import {name!r}: {type(e).__name__}: {e}"
            if spec.get("allow_failed_imports", False):
                warnings.warn(f"custom_imports: {line} (allow_failed_imports: true)", UserWarning, stacklevel=2)
                continue
            raise ConfigError(join_path("custom_imports.imports", i), line,
                              expected="an importable module (is the project installed, or on PYTHONPATH?)") from e


class ProjectScope:
    """MMEngine's registries in scope ``name`` (a config's ``default_scope``; None: MMEngine's
    root scope, ``mmengine``), as a :class:`~treadle.components.registry.Scope`."""

    def __init__(self, name: str | None) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError("default_scope", "not a scope name", value=name, expected="e.g. mmpretrain")
        self.name = name or "mmengine"
        self.given = name is not None
        self.used = False  # whether these registries built anything (the run then keeps MMEngine's hub)
        self._registry: Any = None  # mmengine.registry, imported on first use

    def __repr__(self) -> str:
        return f"ProjectScope({self.name!r})"

    # -- MMEngine ------------------------------------------------------------------------
    def _mm(self) -> Any:
        if self._registry is None:
            registry = import_mmengine(f"default_scope {self.name!r} (an OpenMMLab project's registries)"
                                       if self.given else "a type name treadle does not know")
            self._check_scope(registry)
            registry.init_default_scope(self.name)  # as the Runner: later builds (a head's loss...) see it too
            self._registry = registry
        return self._registry

    def _check_scope(self, registry: Any) -> None:
        """A scope MMEngine cannot import (``default_scope: mmpretrain`` without mmpretrain)."""
        if self.name == "mmengine":
            return
        try:
            importlib.import_module(self.name)
        except ImportError as e:
            raise ConfigError("default_scope", f"the scope's package does not import ({type(e).__name__}: {e})",
                              value=self.name, expected="an installed OpenMMLab package (pip install "
                                                        f"{self.name}), or a scope its code registers") from None

    @contextlib.contextmanager
    def active(self) -> Iterator[Any]:
        """Inside: this scope is MMEngine's default one (nested builds see it); yields
        ``mmengine.registry``."""
        registry = self._mm()
        with registry.DefaultScope.overwrite_default_scope(self.name):
            yield registry

    def registry(self, kind: str) -> Any:
        """MMEngine's root registry for ``kind`` (see the module's table)."""
        return getattr(self._mm(), REGISTRY_OF[kind])

    @contextlib.contextmanager
    def scoped(self, kind: str) -> Iterator[Any]:
        """Inside :meth:`active`: ``kind``'s registry of this scope (the project's child of the
        root registry, whose ``get`` also searches its parents)."""
        with self.active(), self.registry(kind).switch_scope_and_registry(self.name) as registry:
            yield registry

    def names(self, kind: str) -> list[str]:
        """Every name ``kind``'s registry knows in this scope (its own, then its parents')."""
        with self.scoped(kind) as node:
            out: list[str] = []
            while node is not None:
                node.import_from_location()
                out += [n for n in node.module_dict if n not in out]
                node = node.parent
        return out

    # -- the Scope protocol --------------------------------------------------------------
    def knows(self, kind: str, type_: Any) -> bool:
        if kind not in REGISTRY_OF or not isinstance(type_, str):
            return False
        if not self.given and not installed():  # no default_scope: MMEngine's registries only where installed
            return False
        try:
            return self._get(kind, type_) is not None
        except (KeyError, ImportError):  # a scope prefix MMEngine cannot import ('mmdet.X' without mmdet)
            return False

    def _get(self, kind: str, type_: str) -> Any:
        """The class (function) ``type_`` names in ``kind``'s registry of this scope. Functions
        are looked up in the root registry first, as the Runner's ``build_dataloader`` does
        (most projects have no ``FUNCTIONS`` registry of their own)."""
        if kind == "collate_fn":
            with self.active():
                found = self.registry(kind).get(type_)
            if found is not None:
                return found
        with self.scoped(kind) as registry:
            return registry.get(type_)

    def build(self, kind: str, spec: dict[str, Any], path: str, **defaults: Any) -> Any:
        if kind == "collate_fn":
            return self._function(spec, path)
        self.used = True
        priority = spec.get("priority") if kind == "hook" else None
        if kind == "hook":  # MMEngine's register_hook takes it off the spec and sets it on the hook
            spec = {k: v for k, v in spec.items() if k != "priority"}
        with self.scoped(kind) as registry:
            cls = registry.get(spec["type"])
            try:
                obj = registry.build(dict(spec), default_args=_defaults_taken(cls, spec, defaults) or None)
                if kind == "dataset" and callable(getattr(obj, "full_init", None)):
                    obj.full_init()  # the Runner's build_dataloader does it
            except ConfigError:
                raise
            except Exception as e:
                name = getattr(cls, "__name__", spec["type"])
                raise ConfigError(path, f"{name} failed to build in scope {self.name!r}: {type(e).__name__}: {e}") from e
        if kind == "hook":
            from treadle.openmmlab.hooks import adapt_hook

            if priority is not None:
                obj.priority = priority

            return adapt_hook(obj, path)
        return obj

    def unknown(self, kind: str, type_: Any, path: str) -> ConfigError:
        from treadle.components.registry import REGISTRIES

        ours = sorted(REGISTRIES.get(kind, {}))
        known = ", ".join(ours[:8]) + (", ..." if len(ours) > 8 else "")
        if not self.given and not installed():  # a treadle config: treadle's own words
            return ConfigError(path, f"unknown {kind} type", value=type_,
                               expected=f"a registered name ({known}) or a dotted import path such as "
                                        "my_pkg.models.Net", hint=did_you_mean(str(type_), ours))
        registry = REGISTRY_OF.get(kind, kind)
        names = self.names(kind) if kind in REGISTRY_OF else []  # no mmengine with a default_scope: that error
        return ConfigError(path, f"unknown {kind} type in scope {self.name!r}", value=type_,
                           expected=f"a name of MMEngine's {registry} registry in scope {self.name!r}, one of "
                                    f"treadle's ({known}), or a dotted import path",
                           hint=did_you_mean(str(type_), [*names, *ours]))

    def constructed_optimizer(self, spec: dict[str, Any], optimizer: dict[str, Any], model: Any, path: str) -> Any:
        """The torch optimizer a project's optimizer wrapper constructor (``spec``: its ``type`` and
        ``paramwise_cfg``) builds over ``model`` for ``optimizer`` (MMEngine's spec: type, lr, ...),
        as MMEngine's ``build_optim_wrapper`` builds it; treadle wraps that optimizer."""
        kind = spec.get("type")
        if not self.knows("optim_constructor", kind):
            raise self.unknown("optim_constructor", kind, join_path(path, "type"))
        with self.scoped("optim_constructor") as registry:
            try:
                constructor = registry.build({"type": kind, "optim_wrapper_cfg": {"type": "OptimWrapper",
                                                                                   "optimizer": dict(optimizer)},
                                              "paramwise_cfg": spec.get("paramwise_cfg")})
                return constructor(model).optimizer
            except Exception as e:
                raise ConfigError(path, f"{kind} failed to build the optimizer in scope {self.name!r}: "
                                        f"{type(e).__name__}: {e}") from e

    def optimizer_class(self, type_: str) -> Any:
        """The optimizer class a name of the ``OPTIMIZERS`` registry gives (``Lamb``, ``LARS``), which
        treadle builds over the model's parameter groups as it builds torch's."""
        return self._get("optimizer", type_)

    def _function(self, spec: dict[str, Any], path: str) -> Any:
        """A function of the ``FUNCTIONS`` registry (``collate_fn``), the spec's other keys bound."""
        fn = self._get("collate_fn", spec["type"])
        if fn is None:
            raise self.unknown("collate_fn", spec["type"], join_path(path, "type"))
        kwargs = {k: v for k, v in spec.items() if k != "type"}
        return functools.partial(fn, **kwargs) if kwargs else fn


def _defaults_taken(cls: Any, spec: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` that ``cls`` takes and ``spec`` does not give (MMEngine's ``default_args``
    are passed only where a constructor has the parameter: a project's sampler without a
    ``seed`` gets none)."""
    import inspect

    if not defaults:
        return {}
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {k: v for k, v in defaults.items() if k not in spec}
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in defaults.items() if k not in spec and v is not None and (open_kwargs or k in params)}


def project_scope(cfg: dict[str, Any]) -> ProjectScope:
    """The scope a resolved config's type names are looked up in: its ``default_scope``, else
    MMEngine's root scope (used only for a name treadle does not know, mmengine installed)."""
    return ProjectScope(cfg.get("default_scope"))


__all__ = ["ProjectScope", "REGISTRY_OF", "check_custom_imports", "project_scope", "run_custom_imports"]
