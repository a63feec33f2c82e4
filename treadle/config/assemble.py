"""Building the Trainer from a resolved config: :func:`trainer_kwargs` builds its
arguments with :mod:`treadle.components.build`'s builders, :func:`build_trainer` the
``treadle.Trainer``. It is apart from build.py, which the Trainer (and the strategies) use
to build the config dicts they are given, so that build.py needs neither the Trainer nor
its argument definitions.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from treadle.checkpoint.manifest import CheckpointError
from treadle.components.build import (build_component, build_dataloader, build_hook, build_model, check_optimizer, check_safe,
                                  check_schedulers)
from treadle.components.errors import ConfigError, join_path
from treadle.components.registry import by_scope, treadles
from treadle.config.origins import in_user_terms, origins_of
from treadle.config.schema import PROJECT_KEYS, SCHEMA, TRAINING_ONLY
from treadle.openmmlab.scope import check_custom_imports, project_scope, run_custom_imports
from treadle.engine.eval_loop import loader_sets
from treadle.engine.mmengine_model import is_mmengine_model
from treadle.engine.trainer import Trainer


def trainer_kwargs(cfg: dict[str, Any], mode: str = "train", *, safe: bool = False) -> dict[str, Any]:
    """The Trainer's arguments with every component built. ``cfg`` is resolved (see
    :func:`treadle.config.resolve.load_config`). For ``mode`` "validate"/"test" the
    training-only keys are left at their defaults and only the needed loader is built.

    With a ``seed``, the RNGs are seeded first, so the model's initial weights repeat. A model
    spec of treadle's stays a spec, which the Trainer builds (on the meta device under a strategy
    that shards it); a project's (MMEngine's registries) is built here, as its Runner builds it.
    ``safe``: see :mod:`treadle.components.safe`; every name is checked before anything is built.
    Errors name keys as the config file wrote them (``cfg.origins``: :mod:`treadle.config.origins`).
    """
    try:
        return _built(cfg, mode, safe)
    except ConfigError as e:
        renamed = in_user_terms(e, origins_of(cfg))
        if renamed is e:
            raise
        raise renamed from e


def _built(cfg: dict[str, Any], mode: str, safe: bool) -> dict[str, Any]:
    from treadle.seeding import seed_everything

    kw = dict(cfg)
    project = {k.name: kw.pop(k.name, None) for k in PROJECT_KEYS}  # read here, not Trainer arguments
    check_custom_imports(project["custom_imports"], safe=safe)  # safe mode refuses them before anything runs
    if mode != "train":
        kw.update({k: None for k in TRAINING_ONLY})
        kw["resume"] = False
        kw["workflow"] = None
        keep = "val_dataloader" if mode == "validate" else "test_dataloader"
        for key in ("val_dataloader", "test_dataloader"):
            if key != keep:
                kw[key] = None
    if safe:
        check_safe(kw)
    run_custom_imports(project["custom_imports"])  # a project's modules register its classes first
    scope = project_scope(project)  # MMEngine's registries, asked for the names treadle's lack
    kw["optimizer"] = _optimizer_classes(kw.get("optimizer"), scope, safe)
    optimizer_names = check_optimizer(kw.get("optimizer"), safe=safe)
    check_schedulers(kw.get("schedulers"), optimizer_names, safe=safe)
    if kw.get("seed") is not None:
        seed_everything(kw["seed"], per_rank=bool(kw.get("seed_per_rank")))
    # A project's model (MMEngine's registries) is built now, as its Runner builds it; treadle's spec goes to the
    # Trainer as it is, which builds it once its strategy has started the processes: on the meta device where the
    # strategy shards the model, so that no process ever holds it whole (the same path as Trainer(model=dict(...))).
    # An object given from Python (treadle.mmengine.Runner) is used as it is.
    if _spec(kw["model"]) and (not treadles("model", _type_of(kw["model"]), safe=safe)  # the scope's, or its error
                               or project["optim_constructor"] is not None):
        kw["model"] = build_model(kw["model"], safe=safe, scope=scope)
    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        sets = loader_sets(kw.get(key)) if key != "train_dataloader" else None
        if sets is not None:  # several validation (test) sets by name
            kw[key] = {name: build_dataloader(spec, join_path(key, name), safe=safe, scope=scope, seed=kw.get("seed"))
                       if isinstance(spec, Mapping) else spec for name, spec in sets.items()}
        elif isinstance(kw.get(key), Mapping):
            kw[key] = build_dataloader(kw[key], key, safe=safe, scope=scope, seed=kw.get("seed"))
    if _spec(kw.get("loss_fn")):
        kw["loss_fn"] = build_component(kw["loss_fn"], "loss", "loss_fn", safe=safe)
    for key in ("metrics", "train_metrics"):
        if kw.get(key) is not None:
            kw[key] = {name: build_component(spec, "metric", join_path(key, name), safe=safe) if _spec(spec) else spec
                       for name, spec in kw[key].items()}
    kw["hooks"] = [_hook(spec, join_path("hooks", i), safe, scope) for i, spec in enumerate(kw.get("hooks") or [])]
    if scope.used or is_mmengine_model(kw["model"]):  # its parts read MMEngine's message hub while they train
        from treadle.openmmlab.hooks import RuntimeInfo

        kw["hooks"].append(RuntimeInfo())
    if project["optim_constructor"] is not None and isinstance(kw.get("optimizer"), Mapping):
        optimizer = {k: v for k, v in kw["optimizer"].items() if k != "paramwise"}
        kw["optimizer"] = scope.constructed_optimizer(project["optim_constructor"], optimizer, kw["model"],
                                                      "optim_constructor")
    for key, loader, arg in (("val_evaluator", "val_dataloader", "metrics"),
                             ("test_evaluator", "test_dataloader", "test_metrics")):
        if project[key] is not None and kw.get(loader) is not None:
            kw[arg] = {**(kw.get(arg) or {}), "evaluator": _evaluator(project[key], kw[loader], key, scope)}
    return kw


def _optimizer_classes(spec: Any, scope: Any, safe: bool) -> Any:
    """``optimizer`` with a type name only a project's registries know (``Lamb``) replaced by the
    class they give, which the Trainer builds as it builds torch's (several by name too)."""
    if not isinstance(spec, Mapping):
        return spec
    if "type" not in spec:  # optimizers by submodule name
        return {name: _optimizer_classes(sub, scope, safe) for name, sub in spec.items()}
    if by_scope("optimizer", spec["type"], scope, safe=safe):
        return {**spec, "type": scope.optimizer_class(spec["type"])}
    return spec


def _type_of(spec: Any) -> Any:
    return spec.get("type") if isinstance(spec, Mapping) else spec


def _spec(value: Any) -> bool:
    """A config's spec of a component (a mapping or a name), not an object given from Python."""
    return isinstance(value, (Mapping, str))


def _hook(spec: Any, path: str, safe: bool, scope: Any) -> Any:
    """A hook from its spec; an MMEngine hook given as an object (treadle.mmengine.Runner's
    ``custom_hooks``) adapted; a treadle Hook as it is."""
    if _spec(spec):
        return build_hook(spec, path, safe=safe, scope=scope)
    if type(spec).__module__.split(".")[0] == "mmengine" or any(
            c.__module__.startswith("mmengine.hooks") for c in type(spec).__mro__):
        from treadle.openmmlab.hooks import adapt_hook

        return adapt_hook(spec, path)
    return spec


def _evaluator(spec: Any, loader: Any, key: str, scope: Any) -> Any:
    """An OpenMMLab project's evaluator for ``loader``'s dataset, as a treadle metric."""
    from treadle.openmmlab.evaluator import evaluator_metric

    if loader_sets(loader) is not None:
        raise ConfigError(key, "one evaluator for several evaluation sets is not supported", value=spec,
                          expected="one val_dataloader (test_dataloader) with it")
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        raise ConfigError(key, f"needs a loader with a dataset, got a {type(loader).__name__}", value=spec)
    return evaluator_metric(spec, scope, dataset, key)


def _explain(err: Exception, cfg: dict[str, Any]) -> ConfigError:
    """A Trainer check's error as a ConfigError. Its messages start with the argument's
    name (the Trainer names schedulers ``schedulers[i]``), which becomes the key path."""
    # str() of a KeyError is the repr of its message (quoted); any other message is kept as it is.
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str) else str(err)
    first = re.match(r"[A-Za-z_]+", text)
    if first and first.group(0) in SCHEMA:
        return ConfigError("", text)  # starts with the key path already
    return ConfigError("", f"{type(err).__name__}: {text}")


def build_trainer(cfg: dict[str, Any], mode: str = "train", *, safe: bool = False, **overrides: Any) -> Any:
    """Build every component and the ``treadle.Trainer``; nothing is written yet (the
    Trainer creates ``work_dir`` in fit/validate/test). ``overrides`` replace Trainer
    arguments after the build (e.g. ``load_from=`` for ``treadle validate``). ``safe``:
    only registered names and torch classes (:mod:`treadle.components.safe`), for the
    Trainer's own optimizer build too."""
    kw = trainer_kwargs(cfg, mode, safe=safe)
    kw.update(overrides)
    try:
        return Trainer(**kw, safe=safe)
    except (ConfigError, CheckpointError):  # a checkpoint that does not load is not a config error
        raise
    except (ValueError, TypeError, KeyError, FileNotFoundError, NotImplementedError, RuntimeError) as e:
        raise in_user_terms(_explain(e, cfg), origins_of(cfg)) from e


__all__ = ["build_trainer", "trainer_kwargs"]
