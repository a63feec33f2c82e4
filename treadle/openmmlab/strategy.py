"""FlexibleRunner's ``strategy=dict(type="DDPStrategy" | "FSDPStrategy" | "DeepSpeedStrategy", ...)``
as treadle's ``strategy: {type: ddp | fsdp | deepspeed, ...}`` (options of :class:`treadle.strategies.ddp.DDPStrategy`
and :class:`treadle.strategies.fsdp.FSDPStrategy`).

=====================================================  ==============================================
MMEngine                                               treadle
=====================================================  ==============================================
``DDPStrategy`` without ``model_wrapper``              ``{type: ddp, sync_buffers: false}`` (MMEngine's
                                                       default wrapper has ``broadcast_buffers=False``)
``model_wrapper.find_unused_parameters``,              ``find_unused_parameters``, ``sync_buffers``,
``broadcast_buffers``, ``static_graph``,               ``static_graph``, ``gradient_as_bucket_view``
``gradient_as_bucket_view``
``FSDPStrategy``                                       ``{type: fsdp}``
``model_wrapper.auto_wrap_policy`` (transformer        ``wrap: [the layer classes or names]``
policy with ``transformer_layer_cls``)
``model_wrapper.mixed_precision``                      ``mixed_precision`` (``param_dtype``,
                                                       ``reduce_dtype``, ``cast_forward_inputs``)
``model_wrapper.cpu_offload``                          ``cpu_offload``
``model_wrapper.sharding_strategy: FULL_SHARD /        ``reshard_after_forward: true / false``
SHARD_GRAD_OP``
``sharding_strategy: HYBRID_SHARD /                    the same, on ``dp_shard: node, dp_replicate: -1``
_HYBRID_SHARD_ZERO2``                                  (HSDP: shards within a node, replicas across)
``state_dict_cfg: local`` (or sharded/local types)     equivalent: treadle's FSDP checkpoints are sharded
``SingleDeviceStrategy``                               ``single``
``DeepSpeedStrategy``                                  ``{type: deepspeed, zero_stage: <zero_optimization
                                                       .stage>, config: {the rest}}``
``DeepSpeedStrategy`` ``gradient_clipping``,           the Trainer's ``clip_grad: {max_norm: x}``,
``gradient_accumulation_steps``, ``bf16``/``fp16``     ``accumulate``, ``precision`` (treadle's settings
``.enabled`` (also inside ``config``)                  write DeepSpeed's config)
``DDPStrategy`` ``sync_bn: torch``                     ``sync_bn: true`` (BatchNorm layers become
                                                       SyncBatchNorm before wrapping, as MMEngine's
                                                       ``convert_model`` does)
``FSDPStrategy`` ``sync_bn: torch``                    dropped, with a warning: MMEngine's
                                                       FSDPStrategy takes the key but never converts
                                                       (its ``_wrap_model`` skips ``convert_model``);
                                                       ``{type: fsdp, sync_bn: true}`` synchronizes
``FSDPStrategy`` ``activation_checkpointing:           the Trainer's ``activation_checkpointing:
{check_fn: fn}`` (or ``{type: fn, **kwargs}``)         {check_fn: ...}`` as it is (a predicate on
                                                       modules; ``{type: fn, **kwargs}`` is
                                                       ``functools.partial(fn, **kwargs)``)
runner-level ``sync_bn: torch`` (``Runner``)           ``strategy: {type: ddp, sync_bn: true}``
                                                       (merged into a ddp/fsdp strategy the config
                                                       gives)
=====================================================  ==============================================

The runner-level ``activation_checkpointing: [module paths]`` is treadle's key of the same
name, which takes submodule paths (``backbone.layer1``) as MMEngine's runner does. Anything
else (``ColossalAIStrategy``, ``sync_bn: mmcv``, size-based wrapping, ``state_dict_cfg:
full``, a ``check_fn`` given by registry name, ``checkpoint_wrapper_fn``...) is a
:class:`ConfigError` naming the key as written.
"""

from __future__ import annotations

import warnings
from typing import Any

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.common import take

#: FlexibleRunner's strategy class names: a ``strategy`` dict with one of them is MMEngine's.
MMENGINE_STRATEGIES = ("SingleDeviceStrategy", "DDPStrategy", "FSDPStrategy", "DeepSpeedStrategy",
                       "ColossalAIStrategy")
_DDP_WRAPPERS = (None, "MMDistributedDataParallel", "DistributedDataParallel",
                 "torch.nn.parallel.DistributedDataParallel")
_FSDP_WRAPPERS = (None, "MMFullyShardedDataParallel", "FullyShardedDataParallel",
                  "torch.distributed.fsdp.FullyShardedDataParallel")
#: FSDP1's sharding strategies: (reshard_after_forward, the mesh). HYBRID_SHARD shards within
#: a node and replicates across nodes (FSDP1's default groups for it), which is HSDP.
_HSDP = {"dp_replicate": -1, "dp_shard": "node"}
_SHARDING: dict[str, tuple[bool, dict[str, Any]]] = {
    "FULL_SHARD": (True, {}), "SHARD_GRAD_OP": (False, {}),
    "HYBRID_SHARD": (True, _HSDP), "_HYBRID_SHARD_ZERO2": (False, _HSDP)}
_LOCAL_STATE = ("local", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")
_WHY = {
    "skip_init_weights": "treadle builds the model with its weights",
    "use_orig_params": "FSDP2 always keeps the original parameters",
    "limit_all_gathers": "FSDP2 limits all-gathers itself",
    "detect_anomalous_params": "treadle has no such check",
}


def is_mmengine_strategy(value: Any) -> bool:
    """Whether ``value`` is a FlexibleRunner strategy dict (``type`` among :data:`MMENGINE_STRATEGIES`)."""
    return isinstance(value, dict) and value.get("type") in MMENGINE_STRATEGIES


def _short(name: Any) -> Any:
    """``'torch.distributed.fsdp.wrap.transformer_auto_wrap_policy'`` → its last part; a function → its name."""
    if callable(name):
        return getattr(name, "__name__", name)
    return name.rsplit(".", 1)[-1] if isinstance(name, str) else name


def _wrapper(spec: Any, path: str, types: tuple) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ConfigError(path, "must be a mapping", value=spec, expected="{type: ..., option: value}")
    if spec.get("type") not in types:
        raise ConfigError(join_path(path, "type"), "unsupported model wrapper", value=spec.get("type"),
                          expected=f"one of {', '.join(t for t in types if t)} (or no type)")
    return {k: v for k, v in spec.items() if k != "type"}


def sync_bn_option(value: Any, path: str) -> dict[str, Any]:
    """MMEngine's ``sync_bn`` (``'torch'``, ``'mmcv'`` or None) as treadle strategy options."""
    if value is None:
        return {}
    if value == "torch":
        return {"sync_bn": True}
    hint = ("mmcv's SyncBatchNorm (mmcv.ops) is not available in treadle; 'torch' synchronizes the same statistics"
            if value == "mmcv" else "")
    raise ConfigError(path, "no such SyncBatchNorm implementation in treadle", value=value,
                      expected="'torch' (torch's SyncBatchNorm; treadle's own on the CPU) or null", hint=hint)


def _ddp(spec: dict[str, Any], path: str) -> dict[str, Any]:
    top = take(spec, path, {"model_wrapper": "model_wrapper", "sync_bn": "sync_bn"}, {"type": None}, _WHY)
    sync = sync_bn_option(top.get("sync_bn"), join_path(path, "sync_bn"))
    if top.get("model_wrapper") is None:
        return {"type": "ddp", "sync_buffers": False, **sync}
    wpath = join_path(path, "model_wrapper")
    options = take(_wrapper(top["model_wrapper"], wpath, _DDP_WRAPPERS), wpath,
                   {"find_unused_parameters": "find_unused_parameters", "broadcast_buffers": "sync_buffers",
                    "static_graph": "static_graph", "gradient_as_bucket_view": "gradient_as_bucket_view"},
                   {"detect_anomalous_params": False}, _WHY)
    return {"type": "ddp", **options, **sync}


def _wrap_policy(policy: Any, path: str) -> list[Any]:
    if isinstance(policy, dict) and _short(policy.get("type")) == "transformer_auto_wrap_policy":
        layers = take({k: v for k, v in policy.items() if k != "type"}, path,
                      {"transformer_layer_cls": "layers"}, {}).get("layers")
        if isinstance(layers, (list, tuple, set, frozenset)) and layers:
            return sorted(layers, key=lambda c: c if isinstance(c, str) else c.__name__)
        raise ConfigError(join_path(path, "transformer_layer_cls"), "not a set of layer classes", value=layers,
                          expected="the classes (or class names) of the layers to shard one by one")
    kind = _short(policy.get("type") if isinstance(policy, dict) else policy)
    raise ConfigError(path, "wrap policy has no treadle equivalent", value=kind,
                      expected="dict(type='torch.distributed.fsdp.wrap.transformer_auto_wrap_policy', "
                               "transformer_layer_cls={...})",
                      hint="treadle shards the listed layer classes (FSDPStrategy wrap=...), not by parameter count")


def _fsdp(spec: dict[str, Any], path: str) -> dict[str, Any]:
    top = take(spec, path, {"model_wrapper": "model_wrapper", "state_dict_cfg": "state_dict_cfg", "sync_bn": "sync_bn"},
               {"type": None, "skip_init_weights": False, "activation_checkpointing": None}, _WHY)
    if sync_bn_option(top.get("sync_bn"), join_path(path, "sync_bn")):
        warnings.warn(f"{join_path(path, 'sync_bn')}: MMEngine's FSDPStrategy takes sync_bn but never converts "
                      "BatchNorm layers (its _wrap_model skips convert_model), so the translation leaves them as "
                      "they are, as MMEngine trains; write strategy: {type: fsdp, sync_bn: true} for statistics "
                      "over all processes.", UserWarning, stacklevel=4)
    state = top.get("state_dict_cfg", "local")
    kind = state.get("state_dict_type", "LOCAL_STATE_DICT") if isinstance(state, dict) else state
    extra = sorted(set(state) - {"state_dict_type"}) if isinstance(state, dict) else []
    if _short(getattr(kind, "name", kind)) not in _LOCAL_STATE or extra:
        where = join_path(path, "state_dict_cfg") + (f".{extra[0]}" if extra else "")
        raise ConfigError(where, "option has no treadle equivalent", value=state,
                          expected="local (each rank saves its shard, as treadle's FSDP checkpoints do)",
                          hint="full weights come from `treadle export CHECKPOINT` and best checkpoints")
    out: dict[str, Any] = {"type": "fsdp"}
    if top.get("model_wrapper") is None:
        return out
    wpath = join_path(path, "model_wrapper")
    opts = take(_wrapper(top["model_wrapper"], wpath, _FSDP_WRAPPERS), wpath,
                {"auto_wrap_policy": "wrap", "mixed_precision": "mixed_precision", "cpu_offload": "cpu_offload",
                 "sharding_strategy": "sharding_strategy"},
                {"use_orig_params": True, "limit_all_gathers": True}, _WHY)
    if opts.get("wrap") is not None:
        out["wrap"] = _wrap_policy(opts["wrap"], join_path(wpath, "auto_wrap_policy"))
    if opts.get("mixed_precision") is not None:
        mp = opts["mixed_precision"]
        if not isinstance(mp, dict):
            raise ConfigError(join_path(wpath, "mixed_precision"), "must be a mapping", value=mp,
                              expected="{param_dtype: bfloat16, reduce_dtype: float32, ...}")
        if mp.get("buffer_dtype") is not None:
            raise ConfigError(join_path(join_path(wpath, "mixed_precision"), "buffer_dtype"), "option has no treadle equivalent",
                              value=mp["buffer_dtype"], expected="null (FSDP2 keeps buffers in their own dtype)")
        out["mixed_precision"] = take(mp, join_path(wpath, "mixed_precision"),
                                      {"param_dtype": "param_dtype", "reduce_dtype": "reduce_dtype",
                                       "cast_forward_inputs": "cast_forward_inputs"},
                                      {"buffer_dtype": None, "keep_low_precision_grads": False,
                                       "cast_root_forward_inputs": True})
    offload = opts.get("cpu_offload")
    if isinstance(offload, dict):
        offload = take(offload, join_path(wpath, "cpu_offload"), {"offload_params": "on"}, {}).get("on", False)
    if offload is not None:
        out["cpu_offload"] = offload
    sharding = _short(getattr(opts.get("sharding_strategy"), "name", opts.get("sharding_strategy")))
    if sharding is not None:
        if sharding not in _SHARDING:
            raise ConfigError(join_path(wpath, "sharding_strategy"), "sharding strategy has no treadle equivalent",
                              value=sharding, expected="FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD or _HYBRID_SHARD_ZERO2")
        out["reshard_after_forward"], mesh = _SHARDING[sharding]
        out.update(mesh)
    return out


#: MMEngine's DeepSpeedStrategy keys that are the Trainer's settings in treadle (treadle's
#: settings write DeepSpeed's config: treadle/strategies/deepspeed_config.py).
_DS_SETTINGS = {"gradient_clipping": "clip_grad", "gradient_accumulation_steps": "accumulate",
                "bf16": "precision", "fp16": "precision"}
#: MMEngine's DeepSpeedStrategy keys copied into DeepSpeed's config as they are.
_DS_CONFIG = ("train_micro_batch_size_per_gpu", "activation_checkpointing", "aio", "amp")


def _check_fn(spec: Any, path: str) -> dict[str, Any]:
    """An ``FSDPStrategy``'s ``activation_checkpointing`` (``{check_fn: fn}``; ``fn`` a
    predicate on modules, its dotted path, or ``{type: fn, **kwargs}``) as treadle's
    ``activation_checkpointing: {check_fn: ...}`` (imported when the Trainer is built)."""
    if not isinstance(spec, dict):
        raise ConfigError(path, "must be a mapping", value=spec, expected="{check_fn: fn}")
    fn = take(spec, path, {"check_fn": "check_fn"}, {}).get("check_fn")
    where = join_path(path, "check_fn")
    name = fn.get("type") if isinstance(fn, dict) else fn
    if isinstance(name, str) and "." not in name:
        raise ConfigError(where, "a name in MMEngine's FUNCTIONS registry", value=name,
                          expected="the function, its dotted import path, or {type: path, **kwargs}",
                          hint="treadle does not read MMEngine's registries; or name the classes to checkpoint: "
                               "activation_checkpointing: [Block]")
    if fn is None or not (callable(name) or isinstance(name, str)) or isinstance(name, type):
        raise ConfigError(where, "not a function", value=fn,
                          expected="a predicate fn(module) -> bool, its dotted import path, or {type: fn, **kwargs}")
    return {"check_fn": fn}


def strategy_settings(spec: Any, path: str = "strategy") -> list[tuple[str, Any, str]]:
    """The Trainer settings an MMEngine strategy dict holds, as ``(key, value, source)``:
    a ``DeepSpeedStrategy``'s ``gradient_clipping`` -> ``clip_grad``,
    ``gradient_accumulation_steps`` -> ``accumulate``, ``bf16``/``fp16`` ``enabled`` ->
    ``precision``; an ``FSDPStrategy``'s ``activation_checkpointing`` ->
    ``activation_checkpointing``. Empty for the others."""
    if isinstance(spec, dict) and spec.get("type") == "FSDPStrategy" and spec.get("activation_checkpointing") is not None:
        where = join_path(path, "activation_checkpointing")
        return [("activation_checkpointing", _check_fn(spec["activation_checkpointing"], where), where)]
    if not isinstance(spec, dict) or spec.get("type") != "DeepSpeedStrategy":
        return []
    spec = {**_ds_file(spec.get("config"), path), **spec}  # the strategy's keys override its config's (MMEngine)
    out: list[tuple[str, Any, str]] = []
    clip = spec.get("gradient_clipping")
    if clip:  # 0 or None: no clipping, treadle's default
        out.append(("clip_grad", {"max_norm": clip}, join_path(path, "gradient_clipping")))
    if spec.get("gradient_accumulation_steps") not in (None, 1):
        out.append(("accumulate", spec["gradient_accumulation_steps"], join_path(path, "gradient_accumulation_steps")))
    for key, precision in (("bf16", "bf16"), ("fp16", "16")):
        section = spec.get(key)
        if isinstance(section, dict) and section.get("enabled", False):
            out.append(("precision", precision, join_path(path, key)))
    return out


def _ds_file(config: Any, path: str) -> dict[str, Any]:
    """A DeepSpeedStrategy's ``config``: a mapping, or a JSON file's path (MMEngine reads it)."""
    import json

    if isinstance(config, str):
        try:
            with open(config) as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError(join_path(path, "config"), f"cannot read the DeepSpeed JSON file ({e})", value=config,
                              expected="a readable JSON file or a mapping") from None
    if config is not None and not isinstance(config, dict):
        raise ConfigError(join_path(path, "config"), "must be a mapping or a JSON file's path", value=config)
    return dict(config or {})


def _deepspeed(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """treadle's ``dict(type="deepspeed", ...)`` for MMEngine's DeepSpeedStrategy; the keys
    that are Trainer settings are taken by :func:`strategy_settings`."""
    rest = take(spec, path, {"config": "config", "zero_optimization": "zero_optimization",
                             **{k: k for k in _DS_CONFIG}},
                {"type": None, "steps_per_print": None, "inputs_to_half": None, "exclude_frozen_parameters": False,
                 **{k: None for k in _DS_SETTINGS}},
                why={"exclude_frozen_parameters": "treadle's checkpoints hold every parameter"})
    config = _ds_file(rest.pop("config", None), path)
    config = {k: v for k, v in config.items() if k not in _DS_SETTINGS}  # strategy_settings takes these
    config.update(rest)
    zero = dict(config.pop("zero_optimization", None) or {})
    stage = zero.pop("stage", 0)
    if zero:
        config["zero_optimization"] = zero
    return {"type": "deepspeed", "zero_stage": stage, "config": config}


def translate_strategy(spec: dict[str, Any], path: str = "strategy") -> str | dict[str, Any]:
    """treadle's ``strategy`` for a FlexibleRunner strategy dict (see the module's table)."""
    kind = spec["type"]
    if kind == "DeepSpeedStrategy":
        return _deepspeed(spec, path)
    if kind == "ColossalAIStrategy":
        raise ConfigError(join_path(path, "type"), "ColossalAI is not supported", value=kind,
                          expected="DDPStrategy or FSDPStrategy (or strategy: {type: ddp|fsdp})")
    if kind == "SingleDeviceStrategy":
        take(spec, path, {}, {"type": None})
        return "single"
    return _ddp(spec, path) if kind == "DDPStrategy" else _fsdp(spec, path)


__all__ = ["MMENGINE_STRATEGIES", "is_mmengine_strategy", "strategy_settings", "sync_bn_option", "translate_strategy"]
