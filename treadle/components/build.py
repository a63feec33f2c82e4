"""Build the objects a resolved config describes: the Trainer's arguments.

Each component spec ``{type: Name, **kwargs}`` becomes ``resolve_type(kind, Name)(**kwargs)``;
the arguments are checked against the signature first, so a typo is reported with
its key path and the accepted names. Optimizer and scheduler configs are checked
here (type names, argument names, value ranges) but given to the Trainer unchanged:
the Trainer builds them over the model's parameters. Nested dicts inside kwargs are
passed as dicts: a component builds its own parts.

``safe=True`` (everywhere here) accepts only registered names and torch.nn /
torch.optim classes, and no ``collate_fn`` string: :mod:`treadle.components.safe`.

This module never imports the Trainer: the Trainer builds the config dicts it is given
with it (``treadle/engine/args.py``); :mod:`treadle.config.assemble` builds the Trainer.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from treadle.components.errors import ConfigError, did_you_mean, join_path
from treadle.components.hf_models import build_hf_model, is_hf_model_class
from treadle.components.registry import REGISTRIES, Scope, by_scope, check_name, import_object, resolve_type
from treadle.components.safe import refused
from treadle.components.keys import DATALOADER_SCHEMA, check_table
from treadle.data.collate import COLLATE_FUNCTIONS
from treadle.hooks.base import Hook, get_priority
from treadle.hooks.scheduler import ParamSchedulerHook
from treadle.optim.builder import NON_NEGATIVE, check_optimizer_args, resolve_optimizer_type
from treadle.optim.scheduler_builder import SCHEDULERS
from treadle.optim.schedulers import init_arg_names



def check_kwargs(fn: Callable[..., Any], kwargs: dict[str, Any], path: str, skip: tuple[str, ...] = ()) -> None:
    """Unknown arguments (with did-you-mean) and missing required ones, before calling."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return
    named = [p for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in skip]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        accepted = [p.name for p in named]
        for key, value in kwargs.items():
            if key not in accepted:
                raise ConfigError(join_path(path, key), f"unknown argument for {name}", value=value,
                                  expected=f"arguments among {', '.join(accepted) or '(none)'}",
                                  hint=did_you_mean(key, accepted))
    missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
    if missing:
        raise ConfigError(path, f"missing required argument(s) {', '.join(missing)} for {name}")


def check_optimizer_spec(cfg: Any, where: str, *, safe: bool = False) -> None:
    """An optimizer as the Trainer's ``optimizer`` gives it, checked before anything is
    built: a config dict's numbers (no NaN, no negative ``lr``: optim/builder.py) and, in
    safe mode, its ``type`` a torch.optim name or class (before the builder would import
    a dotted path). An Optimizer object is its builder's to check."""
    if not isinstance(cfg, Mapping):
        return
    if safe and isinstance(cfg.get("type"), str):
        check_name("optimizer", cfg["type"], f"{where}.type")
    if isinstance(cfg.get("type"), str) and "." not in cfg["type"]:  # a misspelt name, said as the caller wrote it
        resolve_optimizer_type(cfg["type"], where)
    check_optimizer_args({k: a for k, a in cfg.items() if k != "type"}, where)


def call(fn: Callable[..., Any], kwargs: dict[str, Any], path: str) -> Any:
    """``fn(**kwargs)``, any failure reported as a ConfigError naming ``path``."""
    check_kwargs(fn, kwargs, path)
    try:
        return fn(**kwargs)
    except Exception as e:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise ConfigError(path, f"{getattr(fn, '__name__', fn)}({args}) failed: {type(e).__name__}: {e}") from e


def build_check_fn(spec: Any, path: str, *, safe: bool = False) -> Callable[..., Any]:
    """A predicate ``fn(module) -> bool`` (``activation_checkpointing.check_fn``): a function,
    its dotted import path, or ``{type: fn or path, **kwargs}``, which gives
    ``functools.partial(fn, **kwargs)`` as MMEngine's FSDPStrategy builds its ``check_fn``.
    ``safe``: a dotted path is refused (it would import code the config names)."""
    kwargs: dict[str, Any] = {}
    fn = spec
    if isinstance(spec, dict):
        if "type" not in spec:
            raise ConfigError(join_path(path, "type"), "missing required key", expected="the function's dotted path")
        fn, kwargs = spec["type"], {k: v for k, v in spec.items() if k != "type"}
        path = join_path(path, "type")
    if isinstance(fn, str):
        if "." not in fn:
            raise ConfigError(path, "not a dotted import path of a function", value=fn, expected="e.g. my_pkg.ac.is_block",
                              hint="treadle does not read MMEngine's FUNCTIONS registry")
        if safe:
            raise refused(path, fn, "a function given from Python, or module classes: activation_checkpointing: [Block]",
                          hint="safe mode imports nothing a config names")
        try:
            fn = import_object(fn)
        except (ImportError, AttributeError) as e:
            raise ConfigError(path, f"cannot import it ({type(e).__name__}: {e})", value=fn) from None
    if not callable(fn) or inspect.isclass(fn):
        raise ConfigError(path, "not a function", value=fn, expected="a predicate fn(module) -> bool")
    return functools.partial(fn, **kwargs) if kwargs else fn


def build_component(spec: Any, kind: str, path: str, *, safe: bool = False, scope: Scope | None = None,
                    **defaults: Any) -> Any:
    """``{type: Name, **kwargs}`` -> the object; a bare name builds with no arguments
    (for ``loss`` a name of a function gives the function itself). ``scope``: the registries
    that build a name treadle does not know (an OpenMMLab project's), with ``defaults`` for
    the arguments the spec does not give (as MMEngine's ``default_args``)."""
    type_ = spec.get("type") if isinstance(spec, dict) else spec
    if by_scope(kind, type_, scope, safe=safe):
        return scope.build(kind, spec if isinstance(spec, dict) else {"type": spec}, path, **defaults)  # type: ignore[union-attr]  # by_scope: a scope
    if isinstance(spec, str):
        target = resolve_type(kind, spec, path, safe=safe, scope=scope)
        if kind == "loss" and not inspect.isclass(target):
            return target
        return call(target, {}, path)
    if not isinstance(spec, dict):
        raise ConfigError(path, "not a component spec", value=spec, expected="{type: Name, arg: value, ...}")
    if "type" not in spec:
        raise ConfigError(join_path(path, "type"), "missing required key", expected=f"the {kind}'s registered name "
                          "or dotted import path")
    kwargs = {**{k: v for k, v in defaults.items() if k not in spec}, **{k: v for k, v in spec.items() if k != "type"}}
    return call(resolve_type(kind, spec["type"], join_path(path, "type"), safe=safe, scope=scope), kwargs, path)


def build_model(spec: Any, *, safe: bool = False, scope: Scope | None = None) -> nn.Module:
    """The model a spec describes, as its constructor made it (a transformers model class:
    from ``config:`` or ``pretrained:``, :mod:`treadle.components.hf_models`): ``init_weights()`` is not
    called here (a model-zoo constructor may have loaded pretrained weights that it would
    overwrite); the Trainer calls it with ``init_weights=True``, which an MMEngine config
    sets (:func:`call_init_weights`). ``scope``: an OpenMMLab project's registries, which build
    the names treadle does not know (``ImageClassifier``)."""
    scoped = isinstance(spec, dict) and by_scope("model", spec.get("type"), scope, safe=safe)
    target = resolve_type("model", spec["type"], "model.type", safe=safe, scope=scope) \
        if isinstance(spec, dict) and "type" in spec and not scoped else None
    if target is not None and is_hf_model_class(target):  # transformers.X: from its config class, or pretrained
        return build_hf_model(target, spec)
    model = build_component(spec, "model", "model", safe=safe, scope=scope)
    if not isinstance(model, nn.Module):
        raise ConfigError("model", f"built a {type(model).__name__}, not a torch.nn.Module", value=spec)
    return model


def call_init_weights(model: nn.Module) -> bool:
    """``model.init_weights()``, as MMEngine's runner calls it (mmcv/MMEngine models set
    their initial or pretrained weights there); False when the model has none. Its error
    is a ConfigError naming the model."""
    init_weights = getattr(model, "init_weights", None)
    if not callable(init_weights):
        return False
    try:
        init_weights()
    except Exception as e:
        raise ConfigError("model", f"{type(model).__name__}.init_weights() failed: {type(e).__name__}: {e}") from e
    return True


def build_dataloader(spec: dict[str, Any], path: str, *, safe: bool = False, scope: Scope | None = None,
                     seed: int | None = None) -> DataLoader:
    """``{dataset: {...}, batch_size: N, shuffle: bool, ...}`` -> a ``torch.utils.data.DataLoader``.

    ``scope``: an OpenMMLab project's registries build the dataset, sampler and collate
    function names treadle does not know, as MMEngine's Runner builds its loaders: a dataset
    of the project's registries is batched by their ``pseudo_collate`` unless ``collate_fn``
    says otherwise, and a project's sampler gets ``seed`` (the config's) unless it gives one."""
    if "dataset" not in spec:
        raise ConfigError(join_path(path, "dataset"), "missing required key", expected="{type: digits, ...}")
    dataset_spec = spec["dataset"]
    built = not isinstance(dataset_spec, (dict, str))  # a dataset object, given from Python (MMEngine's Runner too)
    check_table({k: v for k, v in spec.items() if not (built and k == "dataset")}, DATALOADER_SCHEMA, path,
                "a dataloader")
    kwargs = {k: v for k, v in spec.items() if k not in ("dataset", "sampler")}
    # A project's loader (MMEngine's Runner's rules): its registries build the dataset, or a config with a
    # default_scope (treadle.mmengine.Runner's) gives the dataset as an object.
    projects = by_scope("dataset", _type_of(dataset_spec), scope, safe=safe) or (
        built and scope is not None and scope.given)
    dataset = dataset_spec if built else build_component(dataset_spec, "dataset", join_path(path, "dataset"), safe=safe,
                                                         scope=scope)
    if "collate_fn" in kwargs or projects:
        kwargs["collate_fn"] = _collate_fn(kwargs.get("collate_fn"), projects, join_path(path, "collate_fn"), safe,
                                           scope)
    if spec.get("sampler") is not None:
        if "shuffle" in kwargs:
            raise ConfigError(join_path(path, "shuffle"), "given with a sampler, which orders the samples itself",
                              value=kwargs["shuffle"], expected="shuffle inside the sampler: {type: DefaultSampler, "
                                                                "shuffle: true}")
        kwargs["sampler"] = _sampler(spec["sampler"], dataset, join_path(path, "sampler"), safe, scope, seed)
    try:
        if kwargs.pop("group_by_aspect_ratio", False):
            return _grouped_loader(dataset, kwargs, path)
        return DataLoader(dataset, **kwargs)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(path, f"DataLoader rejected the options: {type(e).__name__}: {e}") from e


def _type_of(spec: Any) -> Any:
    return spec.get("type") if isinstance(spec, dict) else spec


def _collate_fn(spec: Any, projects: bool, path: str, safe: bool, scope: Scope | None) -> Any:
    """A loader's ``collate_fn``. For a dataset of a project's registries (``projects``) its
    names are MMEngine's ``FUNCTIONS`` (``pseudo_collate``, MMEngine's ``default_collate``),
    and none given is ``pseudo_collate``, as MMEngine's Runner has it; otherwise treadle's
    names (:data:`~treadle.data.collate.COLLATE_FUNCTIONS`), a dotted path, or a project's
    function by registry name."""
    if spec is None and not projects:
        return None
    if spec is None:
        spec = "pseudo_collate"
    type_ = _type_of(spec)
    as_spec = spec if isinstance(spec, dict) else {"type": spec}
    if projects and isinstance(type_, str) and type_ in COLLATE_FUNCTIONS and scope is not None:
        return scope.build("collate_fn", as_spec, path)  # MMEngine's function of that name
    if isinstance(spec, str) and spec in COLLATE_FUNCTIONS:  # treadle's names for treadle's datasets
        return COLLATE_FUNCTIONS[spec]
    if by_scope("collate_fn", type_, scope, safe=safe):
        return scope.build("collate_fn", as_spec, path)  # type: ignore[union-attr]  # by_scope: a scope
    if isinstance(spec, dict):
        if scope is not None:
            raise scope.unknown("collate_fn", type_, join_path(path, "type"))
        raise ConfigError(path, "a collate function by registry name needs an OpenMMLab project's registries",
                          value=spec, expected="default_collate, pseudo_collate or a dotted path to a function",
                          hint="a config with default_scope builds it through that project's registries")
    if not isinstance(spec, str):
        return spec  # a function given from Python
    if safe:
        raise _refused_collate(spec, path)
    try:
        return import_object(spec)
    except (ImportError, AttributeError) as e:
        raise ConfigError(path, f"cannot import it: {e}", value=spec) from e


def _sampler(spec: Any, dataset: Any, path: str, safe: bool, scope: Scope | None, seed: int | None) -> Any:
    """A loader's ``sampler``: treadle's orders by MMEngine's names (treadle.data.samplers), or
    a project's sampler built through its registries (given the dataset, and ``seed`` unless
    the spec has one, as MMEngine's Runner builds it)."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(path, "not a sampler spec", value=spec, expected="{type: DefaultSampler, shuffle: true}")
    if by_scope("sampler", spec["type"], scope, safe=safe):
        return scope.build("sampler", spec, path, dataset=dataset, seed=seed)  # type: ignore[union-attr]  # by_scope: a scope
    kind = spec["type"]
    if isinstance(kind, str) and kind.rsplit(".", 1)[-1] in REGISTRIES["sampler"]:  # mmengine.DefaultSampler too
        spec = {**spec, "type": kind.rsplit(".", 1)[-1]}
    return build_component(spec, "sampler", path, safe=safe, scope=scope, dataset=dataset)


def _grouped_loader(dataset: Any, kwargs: dict[str, Any], path: str) -> DataLoader:
    """A DataLoader whose batches share an orientation (``group_by_aspect_ratio: true``)."""
    from treadle.data.grouped import AspectRatioBatchSampler

    order = kwargs.pop("sampler", None) or (RandomSampler(dataset) if kwargs.pop("shuffle", False)
                                            else SequentialSampler(dataset))
    try:
        batches = AspectRatioBatchSampler(order, kwargs.pop("batch_size", 1), kwargs.pop("drop_last", False))
    except (TypeError, ValueError) as e:
        raise ConfigError(join_path(path, "group_by_aspect_ratio"), str(e), value=True) from None
    return DataLoader(dataset, batch_sampler=batches, **kwargs)


def _refused_collate(value: Any, path: str) -> ConfigError:
    return refused(path, value, f"no collate_fn (torch's default collate) or one of {', '.join(COLLATE_FUNCTIONS)}",
                   hint="Pass the function itself from Python or, if you trust the config as code, load it without "
                        "safe mode.")


def build_hook(spec: Any, path: str, *, safe: bool = False, scope: Scope | None = None) -> Hook:
    """A hook from its spec; ``priority:`` (a name or 0..100) overrides the class's. ``scope``:
    an OpenMMLab project's registries, which build (and adapt) the hook names treadle does not
    know."""
    if isinstance(spec, dict) and by_scope("hook", spec.get("type"), scope, safe=safe):
        return scope.build("hook", spec, path)  # type: ignore[union-attr]  # by_scope: a scope
    priority = spec.get("priority") if isinstance(spec, dict) else None
    if isinstance(spec, dict):
        spec = {k: v for k, v in spec.items() if k != "priority"}
        if spec.get("type") in ("ParamSchedulerHook", ParamSchedulerHook):
            raise ConfigError(join_path(path, "type"), "is added by the Trainer when `schedulers` is set",
                              value=spec["type"], expected="a `schedulers:` list instead")
    hook = build_component(spec, "hook", path, safe=safe)
    if not isinstance(hook, Hook):
        raise ConfigError(path, f"built a {type(hook).__name__}, not a treadle.Hook", value=spec)
    if priority is not None:
        try:
            get_priority(priority)
        except (TypeError, ValueError) as e:
            raise ConfigError(join_path(path, "priority"), str(e), value=priority) from None
        hook.priority = priority
    return hook


# -- optimizer and scheduler configs: checked, passed on unchanged ----------------------


def _check_optimizer(spec: Any, path: str, safe: bool) -> None:
    if not isinstance(spec, dict):
        raise ConfigError(path, "not an optimizer spec", value=spec, expected="{type: AdamW, lr: 0.001}")
    if "type" not in spec:
        raise ConfigError(join_path(path, "type"), "missing required key", expected="a torch.optim class name such as AdamW")
    cls = resolve_type("optimizer", spec["type"], join_path(path, "type"), safe=safe)
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise ConfigError(join_path(path, "type"), "is not a torch.optim.Optimizer subclass", value=spec["type"])
    kwargs = {k: v for k, v in spec.items() if k not in ("type", "paramwise", "paramwise_cfg")}
    check_kwargs(cls, kwargs, path, skip=("params",))
    for key in NON_NEGATIVE:  # optim/builder.py's: the builder refuses the same
        value = kwargs.get(key)
        if key in kwargs and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(join_path(path, key), f"wrong type {type(value).__name__}", value=value,
                              expected="a number >= 0")
        if key in kwargs and not value >= 0:
            raise ConfigError(join_path(path, key), "out of range", value=value, expected="a number >= 0")
    betas = kwargs.get("betas")
    if "betas" in kwargs and not (isinstance(betas, list) and len(betas) == 2 and
                                  all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        raise ConfigError(join_path(path, "betas"), "out of range", value=betas, expected="two numbers in [0, 1)")


def _per_optimizer(spec: Any) -> bool:
    """Whether ``optimizer`` is a mapping of optimizer specs by submodule name."""
    return (isinstance(spec, dict) and "type" not in spec and bool(spec)
            and all(isinstance(v, dict) for v in spec.values()))


def check_optimizer(spec: Any, *, safe: bool = False) -> list[str] | None:
    """Check ``optimizer``; returns the optimizer names of a per-submodule mapping."""
    if spec is None:
        return None
    if _per_optimizer(spec):
        for name, sub in spec.items():
            _check_optimizer(sub, join_path("optimizer", name), safe)
        return list(spec)
    _check_optimizer(spec, "optimizer", safe)
    return None


# Keys the scheduler builder reads besides the constructor's arguments.
_SCHEDULER_EXTRA = ["convert_to_iter_based", "epoch_length", "_scope_"]


def _check_scheduler_list(specs: Any, path: str, safe: bool) -> None:
    if not isinstance(specs, list):
        specs = [specs]  # the Trainer accepts a single spec too
        path_of = lambda i: path  # noqa: E731
    else:
        path_of = lambda i: join_path(path, i)  # noqa: E731
    for i, spec in enumerate(specs):
        p = path_of(i)
        if not isinstance(spec, dict) or "type" not in spec:
            raise ConfigError(p, "not a scheduler spec", value=spec, expected="{type: CosineAnnealingLR, ...}")
        kind = spec["type"]
        if not isinstance(kind, str):
            continue  # a class from a Python config: the Trainer checks it
        if kind.rsplit(".", 1)[-1] in SCHEDULERS:  # MMEngine scope prefixes are tolerated
            accepted = init_arg_names(SCHEDULERS[kind.rsplit(".", 1)[-1]]) + _SCHEDULER_EXTRA
            for key, value in spec.items():
                if key not in accepted and key != "type":
                    raise ConfigError(join_path(p, key), f"unknown argument for {kind}", value=value,
                                      expected=f"arguments among {', '.join(accepted)}", hint=did_you_mean(key, accepted))
            continue
        if "." in kind:
            resolve_type("scheduler", kind, join_path(p, "type"), safe=safe)  # a torch scheduler by import path
            continue
        raise ConfigError(join_path(p, "type"), "unknown scheduler type", value=kind,
                          expected="a name of treadle.optim.scheduler_builder.SCHEDULERS such as LinearLR or "
                                   "CosineAnnealingLR", hint=did_you_mean(kind, SCHEDULERS))


def check_schedulers(spec: Any, optimizer_names: list[str] | None, *, safe: bool = False) -> None:
    """Check scheduler type names (arguments are checked by the Trainer's builder)."""
    if spec is None:
        return
    if isinstance(spec, dict) and "type" not in spec:
        names = optimizer_names or ["default"]
        for name, specs in spec.items():
            if name not in names:
                raise ConfigError(join_path("schedulers", name), "is not an optimizer name", value=specs,
                                  expected=f"a mapping by optimizer name ({', '.join(names)}) or a list",
                                  hint=did_you_mean(name, names))
            _check_scheduler_list(specs, join_path("schedulers", name), safe)
        return
    _check_scheduler_list(spec, "schedulers", safe)


# -- safe mode: every name checked before anything is built ---------------------------
def _spec_name(spec: Any, path: str) -> tuple[Any, str]:
    """The name a component spec gives (a bare name or its ``type``) and its key path."""
    if isinstance(spec, Mapping):
        return spec.get("type"), join_path(path, "type")
    return spec, path


def named_types(cfg: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """``(kind, name, key path)`` for every name that building ``cfg`` resolves: the
    components' types, each loader's ``collate_fn`` (kind "collate_fn"), optimizer and
    scheduler types. Follows :func:`trainer_kwargs`; a test checks the two agree."""
    if cfg.get("model") is not None:
        yield ("model", *_spec_name(cfg["model"], "model"))
    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        loader = cfg.get(key)
        sets = [(join_path(key, name), one) for name, one in loader.items() if isinstance(one, Mapping)] \
            if isinstance(loader, Mapping) and "dataset" not in loader and key != "train_dataloader" else [(key, loader)]
        for where, loader in sets:  # one loader, or several sets by name
            if isinstance(loader, Mapping):
                if "dataset" in loader:
                    yield ("dataset", *_spec_name(loader["dataset"], join_path(where, "dataset")))
                if loader.get("collate_fn") is not None:
                    yield "collate_fn", loader["collate_fn"], join_path(where, "collate_fn")
    if cfg.get("loss_fn") is not None:
        yield ("loss", *_spec_name(cfg["loss_fn"], "loss_fn"))
    for key in ("metrics", "train_metrics"):
        metrics = cfg.get(key)
        for name, spec in (metrics.items() if isinstance(metrics, Mapping) else ()):
            yield ("metric", *_spec_name(spec, join_path(key, name)))
    hooks = cfg.get("hooks")
    for i, spec in enumerate(hooks if isinstance(hooks, list) else ()):
        yield ("hook", *_spec_name(spec, join_path("hooks", i)))
    optimizer = cfg.get("optimizer")
    if _per_optimizer(optimizer):
        for name, sub in optimizer.items():
            yield "optimizer", sub.get("type"), join_path(join_path("optimizer", name), "type")
    elif isinstance(optimizer, Mapping):
        yield "optimizer", optimizer.get("type"), "optimizer.type"
    schedulers = cfg.get("schedulers")
    by_name = isinstance(schedulers, Mapping) and "type" not in schedulers
    for name, specs in (schedulers.items() if by_name else [("", schedulers)]):
        base = join_path("schedulers", name) if name else "schedulers"
        items = list(enumerate(specs)) if isinstance(specs, list) else [(None, specs)]
        for i, spec in items:
            path = base if i is None else join_path(base, i)
            if isinstance(spec, Mapping):
                yield "scheduler", spec.get("type"), join_path(path, "type")


def check_safe(cfg: Mapping[str, Any]) -> None:
    """Safe mode's check of a whole config, before anything is built or imported: every
    name is registered or a torch.nn / torch.optim class, and no ``collate_fn`` is a string
    other than a name of :data:`treadle.data.collate.COLLATE_FUNCTIONS`."""
    for kind, name, path in named_types(cfg):
        if kind == "collate_fn":
            if isinstance(name, str) and name not in COLLATE_FUNCTIONS:
                raise _refused_collate(name, path)
        elif kind == "scheduler" and isinstance(name, str) and name.rsplit(".", 1)[-1] in SCHEDULERS:
            continue  # a treadle scheduler (an MMEngine scope prefix is dropped, never imported)
        else:
            check_name(kind, name, path)


__all__ = ["build_check_fn", "build_component", "build_dataloader", "build_hook", "build_model", "call", "check_kwargs",
           "check_optimizer", "check_optimizer_spec", "check_safe", "check_schedulers", "named_types"]
