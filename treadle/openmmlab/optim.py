"""Several optimizers in an MMEngine config: ``optim_wrapper`` with
``constructor='MultiOptimWrapperConstructor'`` (mmagic's, the GAN configs' constructor)
as treadle's optimizers by name.

=====================================================  =====================================
MMEngine (mmagic's constructor)                        treadle
=====================================================  =====================================
``optim_wrapper.<name>.optimizer``                     ``optimizer.<name>``: an optimizer over
                                                       the model's submodule ``<name>``
``optim_wrapper.<name>.paramwise_cfg``                 ``optimizer.<name>.paramwise`` (the rules
                                                       of DefaultOptimWrapperConstructor, within
                                                       that submodule)
``optim_wrapper.<name>.type`` / ``dtype``,             ``precision``, ``clip_grad``,
``clip_grad``, ``accumulative_counts``,                ``accumulate``, ``loss_scale``: one value
``loss_scale``                                         for every optimizer (a value that differs
                                                       between entries is refused)
``param_scheduler`` (a list or one scheduler)          ``schedulers: {<name>: [...]}``: the same
                                                       schedulers for each optimizer, as
                                                       MMEngine's runner builds them
``param_scheduler: {<name>: [...]}``                   ``schedulers`` by name, unchanged
``optim_wrapper.<name>.modules``, a top-level          refused: treadle optimizes the submodule
``modules`` or ``paramwise_cfg``                       named as the entry
=====================================================  =====================================
"""

from __future__ import annotations

from typing import Any

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.common import take

MULTI = "MultiOptimWrapperConstructor"
WRAPPER_TYPES = ("OptimWrapper", "AmpOptimWrapper")
#: The wrapper options every optimizer of a treadle run shares.
SHARED = ("type", "dtype", "clip_grad", "accumulative_counts", "loss_scale")
_SUBMODULE = ("treadle gives each optimizer the model's submodule named as its entry (mmagic's rule when the name is "
              "a child module); name the entries after the submodules, or build the optimizers in Python and pass "
              "them by name")


def _short(kind: Any) -> Any:
    return kind.rsplit(".", 1)[-1] if isinstance(kind, str) else kind


def is_multi(spec: Any) -> bool:
    """``spec`` (an ``optim_wrapper``) names mmagic's ``MultiOptimWrapperConstructor``."""
    return isinstance(spec, dict) and _short(spec.get("constructor")) == MULTI


def multi_optim_wrapper(spec: dict[str, Any], path: str = "optim_wrapper") -> tuple[dict[str, Any], dict[str, Any]]:
    """``(optimizers by name, the shared wrapper options)`` for an ``optim_wrapper`` with
    ``constructor='MultiOptimWrapperConstructor'``. The options come back with MMEngine's
    names (``type``, ``dtype``, ``clip_grad``, ``accumulative_counts``, ``loss_scale``),
    for the single wrapper's translation to take."""
    for key in ("modules", "paramwise_cfg", "optimizer"):
        if key in spec:
            raise ConfigError(join_path(path, key), f"is not translated with {MULTI}", value=spec[key],
                              expected="one entry per submodule: {generator: {optimizer: {...}}, discriminator: {...}}",
                              hint=_SUBMODULE if key != "paramwise_cfg" else "set paramwise_cfg in each entry")
    entries = {k: v for k, v in spec.items() if k != "constructor"}
    if not entries:
        raise ConfigError(path, f"{MULTI} with no optimizer", value=spec,
                          expected="{constructor: MultiOptimWrapperConstructor, generator: {optimizer: {...}}, ...}")
    optimizers: dict[str, Any] = {}
    shared: dict[str, tuple[str, Any]] = {}  # option -> (the entry that set it first, its value)
    for name, entry in entries.items():
        where = join_path(path, name)
        if not isinstance(entry, dict) or not isinstance(entry.get("optimizer"), dict):
            raise ConfigError(where, "must be an optimizer wrapper with an 'optimizer' mapping", value=entry,
                              expected="{type: OptimWrapper, optimizer: {type: Adam, lr: ...}}")
        kind = entry.get("type", "OptimWrapper")
        if _short(kind) not in WRAPPER_TYPES:
            raise ConfigError(join_path(where, "type"), "unsupported optimizer wrapper", value=kind,
                              expected=" or ".join(WRAPPER_TYPES))
        if "modules" in entry:
            raise ConfigError(join_path(where, "modules"), "has no treadle equivalent", value=entry["modules"],
                              expected=f"no modules: the submodule {name!r}", hint=_SUBMODULE)
        opts = take(entry, where, {"optimizer": "optimizer", "paramwise_cfg": "paramwise", "clip_grad": "clip_grad",
                                   "accumulative_counts": "accumulative_counts", "dtype": "dtype",
                                   "loss_scale": "loss_scale"}, {"type": None})
        optimizer = dict(opts.pop("optimizer"))
        if "paramwise" in opts:
            optimizer["paramwise"] = opts.pop("paramwise")
        optimizers[str(name)] = optimizer
        opts["type"] = _short(kind)
        for key in SHARED:
            value = opts.get(key)
            if key not in shared:
                shared[key] = (str(name), value)
            elif shared[key][1] != value:
                first, seen = shared[key]
                raise ConfigError(join_path(where, key), f"differs from {join_path(join_path(path, first), key)} "
                                  f"({seen!r})", value=value,
                                  expected="one value for every optimizer (treadle's precision, clip_grad, accumulate "
                                           "and loss_scale apply to all of them)")
    options = {key: value for key, (_, value) in shared.items() if value is not None}
    return optimizers, options


def schedulers_by_name(schedulers: Any, names: list[str]) -> Any:
    """MMEngine's runner with several optimizers: a list of schedulers (or one) is built
    for each optimizer; a mapping by optimizer name is kept as it is."""
    if isinstance(schedulers, dict) and "type" not in schedulers:
        return schedulers
    listed = schedulers if isinstance(schedulers, list) else [schedulers]
    return {name: [dict(s) if isinstance(s, dict) else s for s in listed] for name in names}


__all__ = ["MULTI", "is_multi", "multi_optim_wrapper", "schedulers_by_name"]
