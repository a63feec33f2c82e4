"""An MMEngine ``*_dataloader`` spec as treadle's (the keys of a ``torch.utils.data.DataLoader``).

=================================================  ===========================================
MMEngine                                           treadle
=================================================  ===========================================
``sampler: {type: DefaultSampler | InfiniteSampler  the same ``sampler`` (treadle.data.samplers:
shuffle, seed, round_up}``, or a project's          MMEngine's orders, the run's seed unless the
                                                   config gives one); a training ``round_up:
                                                   false`` is refused (ranks would take unequal
                                                   numbers of steps); evaluation shards are
                                                   never padded (MMEngine pads them, then drops
                                                   the padding from the results). A project's
                                                   sampler type: kept, built through MMEngine's
                                                   registry (it must shard itself)
``batch_sampler: null``                            dropped
``batch_sampler: {type: BatchSampler, drop_last}``  ``drop_last`` (torch's BatchSampler over the
                                                   sampler is what the DataLoader batches with)
``batch_sampler: {type: AspectRatioBatchSampler,    ``group_by_aspect_ratio: true`` and ``drop_last``
drop_last}`` (mmdet's; ``mmdet.`` scope too)       (treadle.data.AspectRatioBatchSampler: the same
                                                   batches, resumed and sharded)
``collate_fn: {type: default_collate |             ``collate_fn: default_collate`` (torch's) or
pseudo_collate}``                                  ``pseudo_collate`` (:mod:`treadle.data.collate`)
``collate_fn: {type: <a project's>, ...}``          kept, built through the project's registries
=================================================  ===========================================
"""

from __future__ import annotations

from typing import Any

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.common import take

_SAMPLERS = ("DefaultSampler", "InfiniteSampler")
_COLLATE = ("default_collate", "pseudo_collate")


def _short(kind: Any) -> Any:
    """``'mmengine.dataset.DefaultSampler'`` -> ``'DefaultSampler'`` (a scope or module prefix)."""
    return kind.rsplit(".", 1)[-1] if isinstance(kind, str) else kind


def _sampler(sampler: Any, path: str, training: bool) -> dict[str, Any]:
    if not isinstance(sampler, dict) or "type" not in sampler:
        raise ConfigError(path, "unsupported sampler", value=sampler,
                          expected="{type: DefaultSampler, shuffle: true|false}")
    kind = _short(sampler["type"])
    if kind not in _SAMPLERS:  # a project's own: built through its registry (treadle/openmmlab/scope.py)
        return {"sampler": dict(sampler)}
    names = {"shuffle": "shuffle", "seed": "seed", **({"round_up": "round_up"} if kind == "DefaultSampler" else {})}
    out = take(sampler, path, names, {"type": None})
    if out.get("round_up", True) is not True and training:
        raise ConfigError(join_path(path, "round_up"), "option has no treadle equivalent for this value", value=False,
                          expected="round_up: true (every training process takes as many batches, the shards "
                                   "padded from the start), or no round_up")
    if out.get("round_up") is True:
        del out["round_up"]  # the default
    return {"sampler": {"type": kind, **out}}


def _batch_sampler(spec: Any, path: str) -> dict[str, Any]:
    if spec is None:
        return {}
    kind = _short(spec.get("type")) if isinstance(spec, dict) else spec
    if kind == "BatchSampler":
        return take(spec, path, {"drop_last": "drop_last"}, {"type": None})
    if kind == "AspectRatioBatchSampler":  # mmdet's: portrait and landscape images in batches of their own
        return {"group_by_aspect_ratio": True, **take(spec, path, {"drop_last": "drop_last"}, {"type": None})}
    raise ConfigError(join_path(path, "type") if isinstance(spec, dict) else path, "unsupported batch sampler",
                      value=kind, expected="null, {type: BatchSampler, drop_last: ...} or "
                                           "{type: AspectRatioBatchSampler, drop_last: ...}")


def _collate(spec: Any, path: str) -> Any:
    if not isinstance(spec, dict):
        return spec  # a name or dotted path: checked where the loader is built
    kind = _short(spec.get("type"))
    if kind in _COLLATE and len(spec) == 1:
        return kind
    if "type" not in spec:
        raise ConfigError(path, "unsupported collate_fn", value=spec,
                          expected=f"{{type: {' | '.join(_COLLATE)}}}, a project's function by registry name, or a "
                                   "dotted path to a function")
    return dict(spec)  # a project's function (or one with options): built through its registry


def set_names(specs: list[Any] | tuple[Any, ...]) -> list[str]:
    """Names for a list of evaluation loaders (mmagic's MultiValLoop): each dataset's
    ``metainfo.dataset_type`` when every one has its own, else the indices "0", "1", ..."""
    names = []
    for spec in specs:
        dataset = spec.get("dataset") if isinstance(spec, dict) else None
        meta = dataset.get("metainfo") if isinstance(dataset, dict) else None
        name = meta.get("dataset_type") if isinstance(meta, dict) else None
        names.append(name if isinstance(name, str) and name and "/" not in name else None)
    if None in names or len(set(names)) != len(names):
        return [str(i) for i in range(len(specs))]
    return names  # type: ignore[return-value]  # no None left


def translate_dataloader(spec: Any, path: str) -> Any:
    """treadle's dataloader spec for MMEngine's (see the module's table)."""
    if not isinstance(spec, dict):
        return spec
    out = {k: v for k, v in spec.items() if k not in ("sampler", "batch_sampler")}
    if "sampler" in spec:
        out.update(_sampler(spec["sampler"], join_path(path, "sampler"), path == "train_dataloader"))
    if "batch_sampler" in spec:
        for key, value in _batch_sampler(spec["batch_sampler"], join_path(path, "batch_sampler")).items():
            if key in out and out[key] != value:
                raise ConfigError(join_path(path, "batch_sampler"), f"sets {key}, which the loader also sets",
                                  value=value, expected=f"one {key}")
            out[key] = value
    if "collate_fn" in spec:
        out["collate_fn"] = _collate(spec["collate_fn"], join_path(path, "collate_fn"))
    return out


__all__ = ["set_names", "translate_dataloader"]
