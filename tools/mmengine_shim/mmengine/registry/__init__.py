"""The least of MMEngine's registry the optimizer tests touch: named classes, a parent with
scoped children, and a current scope. treadle itself resolves optimizers by
``torch.optim`` name or dotted path (:mod:`treadle.optim.builder`)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch


class DefaultScope:
    """The scope in which a registry looks first."""

    current: str | None = None

    @classmethod
    @contextlib.contextmanager
    def overwrite_default_scope(cls, scope: str | None) -> Iterator[None]:
        """Make ``scope`` current inside the ``with`` block."""
        saved, cls.current = cls.current, scope
        try:
            yield
        finally:
            cls.current = saved


class Registry:
    """Name → class, looked up in the current scope's child first, then here, then ``fallback``."""

    def __init__(self, name: str, scope: str | None = None, parent: Registry | None = None,
                 fallback: Callable[[str], Any] | None = None, **_: Any) -> None:
        self.name, self.scope, self.parent, self.fallback = name, scope, parent, fallback
        self.children: dict[str, Registry] = {}
        self.modules: dict[str, Any] = {}
        if parent is not None and scope is not None:
            parent.children[scope] = self

    def register_module(self, name: str | None = None, force: bool = False, module: Any = None) -> Any:
        """Register a class (as a decorator, or directly with ``module=``)."""
        def add(cls: Any) -> Any:
            self.modules[name or cls.__name__] = cls
            return cls
        return add if module is None else add(module)

    def get(self, key: str) -> Any:
        """The class registered as ``key``, or None."""
        child = self.children.get(DefaultScope.current or "")
        if child is not None and key in child.modules:
            return child.modules[key]
        if key in self.modules:
            return self.modules[key]
        return self.fallback(key) if self.fallback else None

    def build(self, cfg: dict[str, Any]) -> Any:
        """``cls(**rest)`` for ``cfg = dict(type=name, **rest)``; KeyError for an unknown name."""
        return build_from_cfg(cfg, self)


def build_from_cfg(cfg: dict[str, Any], registry: Registry) -> Any:
    """Build ``cfg['type']`` from ``registry`` with the other keys as arguments."""
    args = dict(cfg)
    kind = args.pop("type")
    cls = registry.get(kind) if isinstance(kind, str) else kind
    if cls is None:
        raise KeyError(f"{kind!r} is not in the {registry.name} registry")
    return cls(**args)


def _torch_optimizer(name: str) -> Any:
    cls = getattr(torch.optim, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) else None


OPTIMIZERS = Registry("optimizer", fallback=_torch_optimizer)
OPTIM_WRAPPER_CONSTRUCTORS = Registry("optimizer wrapper constructor")
