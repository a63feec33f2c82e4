"""The names a config's ``type:`` may use: one plain dict per kind of component.

Jump from a name to its class with your editor: every entry below is the class (or
function) itself, except the examples' components, which name their file. A ``type``
that is not registered may be a dotted import path such as ``my_pkg.models.Net``,
which imports that module: a config is trusted like code. With ``safe=True`` only
registered names and torch's own classes are accepted (see :mod:`treadle.components.safe`).
To register your own names, add entries to these dicts before building a config
(``MODELS["Net"] = Net``); there is no decorator. An OpenMMLab project's names (a config
with ``default_scope``) come from MMEngine's registries: a :class:`Scope` that the
builders ask for the names treadle does not know.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from treadle.components.errors import ConfigError, did_you_mean
from treadle.components.safe import refused, torch_class
from treadle.hooks.checkpoint import CheckpointHook
from treadle.hooks.early_stopping import EarlyStoppingHook
from treadle.hooks.ema import EMAHook
from treadle.hooks.logger import LoggerHook
from treadle.hooks.nan_guard import NaNGuardHook
from treadle.hooks.precise_bn import PreciseBNHook
from treadle.hooks.profiler import ProfilerHook
from treadle.hooks.runtime_env import RuntimeEnvHook
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.hooks.summary import ModelSummaryHook
from treadle.hooks.sync_buffers import SyncBuffersHook
from treadle.hooks.timer import IterTimerHook
from treadle.data.samplers import SAMPLERS as DATA_SAMPLERS
from treadle.metrics import Accuracy
from treadle.optim.builder import optimizer_names
from treadle.optim.scheduler_builder import SCHEDULERS

#: Where the examples live in a source checkout of treadle.
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class ExampleRef:
    """A component defined in ``examples/<file>``: loaded from there on first use, so
    the library does not import its examples (they are not part of the package)."""

    file: str
    attr: str

    def load(self) -> Any:
        path = EXAMPLES_DIR / self.file
        if not path.is_file():
            raise ImportError(f"{self.attr} is defined in examples/{self.file} of a treadle source checkout, "
                              f"which is not at {path}")
        name = "treadle_examples." + self.file.removesuffix(".py").replace("/", ".")
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None  # a .py file has both
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # before exec: dataclasses and pickling look it up
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return getattr(module, self.attr)


#: Models of the examples (``model: {type: DigitsCNN}``).
MODELS: dict[str, Any] = {
    "DigitsCNN": ExampleRef("digits/digits.py", "DigitsCNN"),
    "RingGAN": ExampleRef("gan/ring_gan.py", "RingGAN"),
}

#: Datasets of the examples (``dataset: {type: digits, split: train}``).
DATASETS: dict[str, Any] = {
    "digits": ExampleRef("digits/digits.py", "digits_dataset"),
    "gaussian_ring": ExampleRef("gan/ring_gan.py", "gaussian_ring"),
}

#: Every loss class of ``torch.nn`` (``loss_fn: {type: CrossEntropyLoss}``).
LOSSES: dict[str, Any] = {name: cls for name, cls in sorted(vars(nn).items())
                          if inspect.isclass(cls) and issubclass(cls, nn.modules.loss._Loss) and not name.startswith("_")}

#: Metrics with ``update(outputs, targets)``, ``compute()``, ``reset()``.
METRICS: dict[str, Any] = {"Accuracy": Accuracy}

#: treadle's built-in hooks (``hooks: [{type: EarlyStoppingHook, patience: 3}]``).
HOOKS: dict[str, Any] = {
    "CheckpointHook": CheckpointHook,
    "EarlyStoppingHook": EarlyStoppingHook,
    "EMAHook": EMAHook,
    "IterTimerHook": IterTimerHook,
    "LoggerHook": LoggerHook,
    "ModelSummaryHook": ModelSummaryHook,
    "NaNGuardHook": NaNGuardHook,
    "PreciseBNHook": PreciseBNHook,
    "SyncBuffersHook": SyncBuffersHook,
    "ParamSchedulerHook": ParamSchedulerHook,
    "ProfilerHook": ProfilerHook,
    "RuntimeEnvHook": RuntimeEnvHook,
}

#: Every ``torch.optim`` optimizer; optimizer configs go to the Trainer unchanged.
OPTIMIZERS: dict[str, Any] = {name: getattr(torch.optim, name) for name in optimizer_names()}

#: A loader's sample orders (``sampler: {type: DefaultSampler}``): MMEngine's, treadle.data.samplers.
SAMPLERS: dict[str, Any] = dict(DATA_SAMPLERS)

#: Kind -> registry. ``scheduler`` is treadle's own table, used by the Trainer.
REGISTRIES: dict[str, dict[str, Any]] = {
    "model": MODELS,
    "dataset": DATASETS,
    "loss": LOSSES,
    "metric": METRICS,
    "hook": HOOKS,
    "optimizer": OPTIMIZERS,
    "scheduler": SCHEDULERS,
    "sampler": SAMPLERS,
}


class Scope(Protocol):
    """Registries beyond treadle's, asked for the type names treadle does not know: an
    OpenMMLab project's, in its ``default_scope`` (:class:`treadle.openmmlab.scope.ProjectScope`).
    The builders of :mod:`treadle.components.build` take one as ``scope=``; kinds are those of
    :data:`REGISTRIES` plus ``collate_fn``."""

    name: str
    given: bool  # the config named the scope (default_scope): its loaders follow MMEngine's Runner

    def knows(self, kind: str, type_: Any) -> bool:
        """Whether ``type_`` names a ``kind`` in these registries."""

    def build(self, kind: str, spec: dict[str, Any], path: str, **defaults: Any) -> Any:
        """The object ``spec`` describes, built by these registries (``defaults``: arguments
        the spec does not give, as MMEngine's ``default_args``); errors name ``path``."""

    def unknown(self, kind: str, type_: Any, path: str) -> ConfigError:
        """The error for a name neither treadle nor these registries know."""


def by_scope(kind: str, type_: Any, scope: Scope | None, *, safe: bool = False) -> bool:
    """Whether ``type_`` is built by ``scope``: a name that treadle cannot resolve (not in its
    registry of ``kind``, and no dotted path that imports) and the scope's registries have. A
    name both know is treadle's, so a config whose every type is treadle's never asks the
    scope (nor needs MMEngine). ``safe``: a dotted name is never the scope's (MMEngine would
    import its first part as a scope's package)."""
    if scope is None or treadles(kind, type_, safe=safe):
        return False
    return scope.knows(kind, type_)


def treadles(kind: str, type_: Any, *, safe: bool = False) -> bool:
    """Whether treadle resolves ``type_`` itself: an object given from Python, a name of its
    registry of ``kind``, or a dotted path that imports (in safe mode any dotted name, which
    safe mode then checks: never a scope's)."""
    if not isinstance(type_, str) or type_ in REGISTRIES.get(kind, {}):
        return True
    if "." in type_:
        if safe:
            return True
        try:
            import_object(type_)
            return True
        except (ImportError, AttributeError):
            pass  # 'mmpretrain.ImageClassifier': a scope-prefixed registry name
    return False


def import_object(dotted: str) -> Any:
    """``"pkg.module.Name"`` (or ``pkg.module.Class.attr``) -> the object."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and not module_name.startswith(e.name):
                raise  # the module exists but fails to import something itself
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError names what is missing
        return obj
    raise ModuleNotFoundError(f"no module named {parts[0]!r}")


def _known(registry: dict[str, Any], limit: int = 12) -> str:
    names = sorted(registry)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def resolve_type(kind: str, type_: Any, path: str, *, safe: bool = False, scope: Scope | None = None) -> Any:
    """The class or function a ``type`` names: a registered name, a dotted import path,
    or (Python configs) the object itself. Errors name ``path`` (e.g. ``model.type``).

    ``safe``: a dotted path must name a torch.nn / torch.optim class, found without
    importing anything (:func:`treadle.components.safe.torch_class`); any other is refused.
    ``scope``: the registries a name treadle does not know was looked up in too (the error
    names them).
    """
    registry = REGISTRIES[kind]
    if callable(type_) and not isinstance(type_, str):
        return type_  # an object given from Python: code is trusted
    if not isinstance(type_, str) or not type_:
        raise ConfigError(path, f"a {kind} type must be a name or a dotted import path", value=type_,
                          expected=f"one of {_known(registry)}")
    if type_ in registry:
        entry = registry[type_]
        try:
            return entry.load() if isinstance(entry, ExampleRef) else entry
        except Exception as e:
            raise ConfigError(path, f"cannot load {kind} {type_!r}: {type(e).__name__}: {e}") from e
    if "." in type_ and safe:
        return _torch_class_or_refuse(kind, type_, path)
    if "." in type_:
        try:
            return import_object(type_)
        except (ImportError, AttributeError) as e:
            raise ConfigError(path, f"cannot import {type_!r}: {e}",
                              expected="an importable dotted path such as my_pkg.models.Net") from e
    if scope is not None:
        raise scope.unknown(kind, type_, path)
    expected = (f"a registered name ({_known(registry)})" + (" or a torch.nn / torch.optim class such as "
                "torch.nn.CrossEntropyLoss" if safe else " or a dotted import path such as my_pkg.models.Net"))
    raise ConfigError(path, f"unknown {kind} type", value=type_, expected=expected,
                      hint=did_you_mean(type_, registry))


def check_name(kind: str, type_: Any, path: str) -> None:
    """Safe mode's check of a ``type`` without loading it: a registered name, a
    torch.nn / torch.optim class, or an object given from Python; else a ConfigError."""
    if isinstance(type_, str) and type_ not in REGISTRIES[kind] and "." in type_:
        _torch_class_or_refuse(kind, type_, path)  # other problems: resolve_type reports them when building


def _torch_class_or_refuse(kind: str, type_: str, path: str) -> type:
    cls = torch_class(type_)
    if cls is None:
        raise refused(path, type_, f"a registered {kind} name ({_known(REGISTRIES[kind])})")
    return cls


def name_of(obj: Any) -> str:
    """How a class or function is written in a saved config: its registered name, or
    its dotted import path (for objects a Python config passed directly)."""
    if isinstance(obj, str):
        return obj
    for registry in REGISTRIES.values():
        for name, entry in registry.items():
            if entry is obj:
                return name
            if isinstance(entry, ExampleRef) and entry.attr == getattr(obj, "__name__", None) and \
                    _same_file(obj, EXAMPLES_DIR / entry.file):
                return name  # an example class a Python config imported as a sibling module
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname and module.startswith("treadle_config_"):  # defined in the config file itself
        name, file = qualname, module[len("treadle_config_"):] + ".py"
        raise ConfigError("", f"{name}, defined in the config file {file}, cannot be written into config.yaml (a "
                          "resumed or repeated run reads the class back by its import path)",
                          expected=f"{name} defined in an importable module beside the config (e.g. models.py, "
                                   f"then `from models import {name}`)")
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        raise ConfigError("", f"{obj!r} has no importable name, so it cannot be written into config.yaml",
                          expected="a class or function defined at the top level of an importable module")
    return f"{module}.{qualname}"


def _same_file(obj: Any, path: Path) -> bool:
    try:
        return Path(inspect.getfile(obj)).resolve() == path.resolve()
    except (TypeError, OSError):
        return False


__all__ = ["DATASETS", "EXAMPLES_DIR", "ExampleRef", "HOOKS", "LOSSES", "METRICS", "MODELS", "OPTIMIZERS",
           "REGISTRIES", "SAMPLERS", "SCHEDULERS", "Scope", "by_scope", "check_name", "import_object", "name_of",
           "resolve_type", "treadles"]
