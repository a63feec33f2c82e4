"""Read configs written with MMEngine's key names, by translating them to treadle's.

A config is translated when it has any key of :data:`MMENGINE_KEYS`. The result uses
only treadle keys, so the ``config.yaml`` saved in the run directory shows the
translation. Scheduler configs are the same in both and pass through unchanged.

=====================================================  =====================================
MMEngine                                               treadle
=====================================================  =====================================
``optim_wrapper.optimizer``                            ``optimizer``
``optim_wrapper.paramwise_cfg``                        ``optimizer.paramwise``
``optim_wrapper.constructor:                           ``optimizer`` by name, one per submodule
MultiOptimWrapperConstructor`` (mmagic's)              (:mod:`treadle.openmmlab.optim`)
``optim_wrapper.constructor`` of a project's registry  ``optim_constructor: {type, paramwise_cfg}``: the
(mmpretrain's LearningRateDecay...)                    optimizer it builds over the model is the run's
``optim_wrapper.clip_grad``                            ``clip_grad``
``optim_wrapper.accumulative_counts``                  ``accumulate``, and ``accumulate_across_epochs:
                                                       true`` when over 1 (MMEngine's windows)
``optim_wrapper.type: AmpOptimWrapper`` (``dtype``)    ``precision: '16'`` (``bfloat16``: ``'bf16'``)
``optim_wrapper.loss_scale`` (AmpOptimWrapper)         ``loss_scale`` (``'dynamic'``: dropped)
``param_scheduler``                                    ``schedulers`` (unchanged)
``train_cfg.max_epochs`` / ``max_iters``               ``max_epochs`` / ``max_iters``
``train_cfg.val_interval``                             ``val_interval``
``train_cfg.by_epoch`` / ``type``, ``val_begin: 1``    checked, then dropped
``val_cfg``, ``test_cfg`` (no options; ``MultiValLoop``  dropped
/ ``MultiTestLoop``, mmagic's, too)
a list of ``val_dataloader`` / ``test_dataloader``     several sets by name: ``{name: loader}``, each
(mmagic's MultiValLoop)                                named by its dataset's ``metainfo.dataset_type``
                                                       (when every one has its own), else its index
``default_hooks`` CheckpointHook                       ``checkpoint``: ``interval`` (-1: null),
                                                       ``by_epoch``, ``max_keep_ckpts`` -> ``keep``
                                                       (absent or negative: null, keep all, as
                                                       MMEngine's default -1), ``save_last``,
                                                       ``save_best`` -> ``best`` (``val/`` added),
                                                       ``rule`` greater/less -> max/min, inferred
                                                       as MMEngine does (``greater_keys``,
                                                       ``less_keys``); ``out_dir`` refused: see
                                                       :mod:`treadle.openmmlab.checkpoint`;
                                                       ``save_optimizer`` / ``save_param_scheduler``:
                                                       true, dropped
``default_hooks`` LoggerHook ``interval``              ``log_interval``; ``ignore_last: true``,
                                                       ``log_metric_by_epoch: false`` (what treadle
                                                       does), ``interval_exp_name``: dropped;
                                                       ``ignore_last: false``: a LoggerHook in
                                                       ``hooks`` (with the log writers)
``default_hooks`` IterTimerHook, ParamSchedulerHook,   dropped: treadle always times steps, steps
DistSamplerSeedHook, RuntimeInfoHook, or null          its schedulers, seeds samplers, logs lr
``custom_hooks`` EMAHook                               ``ema``: ``momentum`` -> ``1 - momentum``
                                                       (MMEngine weighs the new value), ``interval``,
                                                       ``begin_iter`` -> ``start``, and
                                                       ``convention: mmengine`` (its first update
                                                       copies the weights, see EMAHook);
                                                       ``ema_type: ExpMomentumEMA`` (mmdet's):
                                                       ``gamma`` (default 2000) as well;
                                                       ``update_buffers: true`` (treadle averages
                                                       buffers), ``strict_load``, ``priority``:
                                                       dropped; no ``update_buffers``: a warning
``custom_hooks`` PreciseBNHook (mmpretrain's)         ``hooks``: treadle's PreciseBNHook, same
                                                       arguments (``num_samples``, ``interval``)
``custom_hooks`` EarlyStoppingHook                     ``hooks``: ``check_finite`` ->
                                                       ``stop_on_nonfinite``, ``monitor`` with
                                                       ``val/`` added, the rest as is
other ``default_hooks`` / ``custom_hooks``             ``hooks`` (treadle hook types, registered
                                                       ones or dotted paths, and their arguments)
a top-level name also set by the translation           dropped when it holds the same value (a
(``optimizer = dict(...)``, ``max_epochs = 12``)       helper reused in ``optim_wrapper``...)
``randomness.seed`` / ``deterministic`` /              ``seed`` / ``deterministic`` /
``diff_rank_seed``                                     ``seed_per_rank``
``*_dataloader.sampler: {type: DefaultSampler,         ``*_dataloader.shuffle`` (sampler ``seed``
shuffle: ...}``                                        dropped: treadle seeds samplers)
``auto_scale_lr`` without ``enable``                   ``auto_scale_lr`` with ``enable: false``
                                                       (MMEngine scales only with ``enable: true``)
``resume: true`` with ``load_from: PATH``              ``resume: PATH`` (full state), no
                                                       ``load_from``
``model_wrapper_cfg`` (``MMDistributedDataParallel``)  ``strategy: {type: auto | ddp, ...}``: its
and ``find_unused_parameters`` (the Runner's)          ``find_unused_parameters``, ``broadcast_buffers``
                                                       -> ``sync_buffers``; without it the Runner's
                                                       wrapper: ``sync_buffers: false`` (options the
                                                       config's strategy gives win; fsdp, deepspeed:
                                                       untouched)
``sync_bn: torch`` (the runner's)                      ``strategy: {type: ddp, sync_bn: true}``
                                                       (merged into a ddp/fsdp strategy the config
                                                       gives); ``mmcv``: refused
``activation_checkpointing: [paths]`` (the runner's)   the same key: treadle's takes submodule paths
``default_scope``, ``custom_imports``,                 the same keys (the config layer reads them:
``val_evaluator``, ``test_evaluator``                  a project's registries and evaluators,
                                                       treadle/openmmlab/scope.py, evaluator.py)
top-level ``data_preprocessor``                        ``model.data_preprocessor`` unless the model
                                                       gives one (the Runner's ``setdefault``)
runtime keys (``env_cfg``, ``visualizer``,             see :mod:`treadle.openmmlab.runtime`
``log_level``, ``launcher``, ``log_processor``,
``tta_model``), visualization hooks, helper variables
=====================================================  =====================================

Everything else (``model``, ``*_dataloader``, ``work_dir``, ``load_from`` alone or with
``resume: false`` (weights only), ``resume``, ``auto_scale_lr`` with ``enable``) has the
same name and meaning in both. Any other option, or a value treadle cannot honour
(``update_buffers: false``, ``log_metric_by_epoch: true``...), is an error naming the
key as the config wrote it: only the entries marked "dropped" above are left out.
``docs/mmengine.md`` is the migration page.
"""

from __future__ import annotations

import warnings
from typing import Any

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.checkpoint import translate_best
from treadle.openmmlab.common import take
from treadle.openmmlab.keys import MMENGINE_KEYS, NOT_TRANSLATED, PROJECT_KEYS
from treadle.openmmlab.data import set_names, translate_dataloader
from treadle.openmmlab.loop import val_schedule
from treadle.openmmlab.optim import MULTI, is_multi, multi_optim_wrapper, schedulers_by_name
from treadle.openmmlab.runtime import helper_names, translate_runtime, visualization_hook
from treadle.openmmlab.strategy import (is_mmengine_strategy, strategy_settings, sync_bn_option,
                                              translate_strategy)
from treadle.components.registry import REGISTRIES
from treadle.engine.argspec import config_defaults
from treadle.engine.spec import TRAINER_KEYS, TrainerArgs
from treadle.precision import amp_precision

#: mmpretrain's PreciseBNHook as configs name it: treadle's takes its arguments (num_samples, interval).
_PRECISE_BN = ("mmpretrain.PreciseBNHook", "mmcls.PreciseBNHook")

_DROPPED_HOOKS = ("IterTimerHook", "ParamSchedulerHook", "DistSamplerSeedHook", "RuntimeInfoHook")

_LOGGER_WHY = {
    "log_metric_by_epoch": "treadle's log.jsonl records carry both epoch and iter, and its TensorBoard logs put "
                           "validation results at the iteration (MMEngine's log_metric_by_epoch=False).",
}


def is_mmengine_style(cfg: dict[str, Any]) -> bool:
    """True when ``cfg`` uses any of MMEngine's key names."""
    return any(k in cfg for k in MMENGINE_KEYS) or is_mmengine_strategy(cfg.get("strategy"))


class _Out:
    """The translated config. Two MMEngine keys that set one treadle key with two values
    are an error. A top-level name that a translated key also sets is a variable of the
    config, as MMEngine's runner sees it (``max_epochs = 12`` then ``train_cfg =
    dict(max_epochs=max_epochs)``): the runner key wins, the name is listed in
    ``replaced`` (name -> the key that set it), whatever its value."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = {k: v for k, v in cfg.items() if k not in MMENGINE_KEYS}
        self.translated: dict[str, str] = {}
        self.replaced: dict[str, str] = {}
        # treadle key path -> the path the file wrote, for errors (treadle/config/origins.py)
        self.origins: dict[str, str] = {}
        self.hook_sources: list[str] = []  # the file's path of each hook _hooks translated, in order

    def set(self, key: str, value: Any, source: str) -> None:
        if key in self.cfg and self.cfg[key] != value:
            if key in self.translated:
                raise ConfigError(source, f"sets {key!r}, which {self.translated[key]} also sets", value=value,
                                  expected=f"only one of {source} and {self.translated[key]}")
            self.replaced[key] = source
        elif key in self.cfg and key not in self.translated:
            self.replaced[key] = source  # the same value: a helper reused by the runner key
        self.cfg[key] = value
        self.translated[key] = source
        self.origins[key] = source

    def renamed(self, key: str, source: str, names: dict[str, str]) -> None:
        """Record that the options of ``source`` (its names: ``names``' keys) became those of
        ``key`` (``names``' values), for errors in the file's words."""
        for old, new in names.items():
            if old != new:
                self.origins[join_path(key, new)] = join_path(source, old)


def _optim_wrapper(spec: Any, out: _Out) -> None:
    path = "optim_wrapper"
    if is_multi(spec):  # mmagic's GAN constructor: one optimizer per submodule, by name
        optimizers, options = multi_optim_wrapper(spec, path)
        spec = {"optimizer": optimizers, **options}
    elif isinstance(spec, dict) and "optimizer" not in spec and spec and all(
            isinstance(v, dict) and "optimizer" in v for v in spec.values()):
        raise ConfigError(path, "gives optimizers by name without a constructor", value=sorted(spec),
                          expected=f"constructor='{MULTI}' beside them (mmagic's; MMEngine's runner refuses them too)")
    if not isinstance(spec, dict) or "optimizer" not in spec:
        raise ConfigError(path, "must be a mapping with an 'optimizer'", value=spec,
                          expected="{optimizer: {type: AdamW, lr: ...}, ...}")
    kind = spec.get("type", "OptimWrapper")
    if kind not in ("OptimWrapper", "AmpOptimWrapper", "DeepSpeedOptimWrapper"):  # DeepSpeed's: the strategy's
        raise ConfigError(join_path(path, "type"), "unsupported optimizer wrapper", value=kind,
                          expected="OptimWrapper, AmpOptimWrapper or DeepSpeedOptimWrapper")
    amp = kind == "AmpOptimWrapper"
    names = {"optimizer": "optimizer", "paramwise_cfg": "paramwise", "clip_grad": "clip_grad",
             "accumulative_counts": "accumulate", "dtype": "dtype", **({"loss_scale": "loss_scale"} if amp else {})}
    constructor = spec.get("constructor", "DefaultOptimWrapperConstructor")
    own = isinstance(constructor, str) and constructor.rsplit(".", 1)[-1] not in ("DefaultOptimWrapperConstructor", MULTI)
    rest = take({k: v for k, v in spec.items() if not (own and k == "constructor")}, path, names,
                {"type": None, "constructor": "DefaultOptimWrapperConstructor"})
    optimizer = rest.pop("optimizer")
    if not isinstance(optimizer, dict):
        raise ConfigError(join_path(path, "optimizer"), "must be a mapping", value=optimizer, expected="{type: AdamW, lr: ...}")
    if own:  # a project's constructor (its registry's) makes the parameter groups: treadle.config.assemble
        out.cfg["optim_constructor"] = {"type": constructor, **({"paramwise_cfg": rest.pop("paramwise")}
                                                               if "paramwise" in rest else {})}
        out.origins["optim_constructor"] = join_path(path, "constructor")
    if "paramwise" in rest:
        optimizer = {**optimizer, "paramwise": rest.pop("paramwise")}
    out.set("optimizer", optimizer, join_path(path, "optimizer"))
    out.origins["optimizer.paramwise"] = join_path(path, "paramwise_cfg")
    if rest.get("loss_scale", "dynamic") != "dynamic":  # a fixed scale or GradScaler's options
        out.set("loss_scale", rest["loss_scale"], join_path(path, "loss_scale"))
    if rest.get("clip_grad") is not None:
        out.set("clip_grad", _clip_grad(rest["clip_grad"], join_path(path, "clip_grad")), join_path(path, "clip_grad"))
    if rest.get("accumulate") is not None:
        out.set("accumulate", rest["accumulate"], join_path(path, "accumulative_counts"))
    if rest.get("accumulate") not in (None, 1):  # MMEngine counts windows over the run, not per epoch
        out.set("accumulate_across_epochs", True, join_path(path, "accumulative_counts"))
    dtype = rest.get("dtype")
    if kind == "AmpOptimWrapper":
        precision = "16" if dtype is None else amp_precision(dtype)  # fp16 unless told
        if precision is None:
            raise ConfigError(join_path(path, "dtype"), "unsupported AMP dtype", value=dtype, expected="float16 or bfloat16")
        out.set("precision", precision, join_path(path, "type"))
    elif dtype is not None:
        raise ConfigError(join_path(path, "dtype"), "only applies to AmpOptimWrapper", value=dtype)


def _clip_grad(spec: Any, path: str) -> Any:
    """MMEngine's ``clip_grad``: ``{max_norm, norm_type, ...}`` (``type: norm``, the default) or
    ``{type: value, clip_value}``, as treadle's ``{max_norm, ...}`` or ``{value}``."""
    if not isinstance(spec, dict) or "type" not in spec:
        return spec
    kind = spec["type"]
    if kind == "norm":
        return {k: v for k, v in spec.items() if k != "type"}
    if kind == "value":
        return take(spec, path, {"clip_value": "value"}, {"type": None})
    raise ConfigError(join_path(path, "type"), "unsupported gradient clipping", value=kind, expected="norm or value")


def _train_cfg(spec: Any, out: _Out) -> None:
    path = "train_cfg"
    if not isinstance(spec, dict):
        raise ConfigError(path, "must be a mapping", value=spec, expected="{by_epoch: true, max_epochs: N, val_interval: K}")
    rest = take(spec, path, {"max_epochs": "max_epochs", "max_iters": "max_iters", "val_interval": "val_interval",
                              "by_epoch": "by_epoch", "type": "type", "val_begin": "val_begin",
                              "dynamic_intervals": "dynamic_intervals"}, {})
    loops = {"EpochBasedTrainLoop": True, "IterBasedTrainLoop": False}
    if "type" in rest and rest["type"] not in loops:
        raise ConfigError(join_path(path, "type"), "unsupported loop", value=rest["type"], expected=" or ".join(loops))
    by_epoch = rest.pop("by_epoch", loops.get(rest.pop("type", ""), "max_iters" not in rest))
    wrong = "max_iters" if by_epoch else "max_epochs"
    if wrong in rest:
        raise ConfigError(join_path(path, wrong), f"does not fit by_epoch={by_epoch}", value=rest[wrong],
                          expected=f"{'max_epochs' if by_epoch else 'max_iters'} for this loop")
    if not by_epoch:
        rest.setdefault("val_interval", 1000)  # IterBasedTrainLoop's default (EpochBasedTrainLoop's is 1, treadle's)
    schedule = val_schedule(rest.pop("val_begin", 1), rest.pop("dynamic_intervals", None), rest.get("val_interval", 1),
                            rest.get("max_epochs" if by_epoch else "max_iters"), by_epoch, path)
    for key, value in rest.items():
        out.set(key, value, join_path(path, key))
    if schedule is not None and out.cfg.get("val_dataloader") is not None:  # MMEngine: no loader, no validation
        out.set("workflow", schedule, path)


def _checkpoint(spec: dict[str, Any], path: str, out: _Out) -> None:
    names = {"interval": "interval", "by_epoch": "by_epoch", "max_keep_ckpts": "keep", "save_last": "save_last",
             "save_best": "best", "rule": "rule", "out_dir": "out_dir", "greater_keys": "greater_keys",
             "less_keys": "less_keys"}
    ck = take(spec, path, names, {"type": None, "save_optimizer": True, "save_param_scheduler": True})
    translate_best(ck, path, out.cfg)  # save_best, rule, greater/less_keys, out_dir (mmengine_checkpoint.py)
    if ck.get("interval", -1) == -1:  # MMEngine's default: no periodic saves, the last one (save_last)
        ck["interval"] = None
    keep = ck.get("keep")
    if keep is None or (isinstance(keep, int) and not isinstance(keep, bool) and keep < 0):
        ck["keep"] = None  # MMEngine's default (-1) keeps every checkpoint; treadle's default keeps 3
    if "rule" in ck:
        rules = {"greater": "max", "less": "min"}
        if ck["rule"] not in rules:
            raise ConfigError(join_path(path, "rule"), "unsupported rule", value=ck["rule"], expected="greater or less")
        ck["rule"] = rules[ck["rule"]]
    out.set("checkpoint", ck, path)
    out.renamed("checkpoint", path, names)


#: MMEngine ``EMAHook(ema_type=...)`` averages treadle follows (a registry scope such as
#: ``mmdet.`` may prefix the name), and whether each ramps its momentum up (``gamma``).
_EMA_TYPES = {"ExponentialMovingAverage": False, "ExpMomentumEMA": True}


def _ema(spec: dict[str, Any], path: str, out: _Out) -> None:
    ema_type = spec.get("ema_type", "ExponentialMovingAverage")
    name = ema_type.rpartition(".")[2] if isinstance(ema_type, str) else ema_type
    if name not in _EMA_TYPES:
        raise ConfigError(join_path(path, "ema_type"), "unsupported average", value=ema_type,
                          expected="ExponentialMovingAverage or ExpMomentumEMA (mmdet's)")
    ramps = _EMA_TYPES[name]
    names = {"momentum": "momentum", "interval": "interval", "begin_iter": "start", **({"gamma": "gamma"} if ramps else {})}
    ema = take(spec, path, names,
                {"type": None, "ema_type": None, "update_buffers": True, "strict_load": None, "priority": None,
                 "begin_epoch": 0},
                {"update_buffers": "treadle's EMA averages the buffers (BatchNorm statistics) as it averages the "
                                   "weights; it cannot copy them from the model as MMEngine does with "
                                   "update_buffers=False. Write update_buffers: true to train with averaged buffers."})
    if "update_buffers" not in spec:
        warnings.warn(f"{path}: EMAHook without update_buffers: MMEngine then copies the model's buffers (BatchNorm "
                      "statistics) into the average, but treadle averages them like the weights (MMEngine's "
                      "update_buffers=True). The two differ for models with BatchNorm. Write update_buffers: true "
                      "to accept treadle's averaging and silence this warning.", UserWarning, stacklevel=4)
    if "momentum" in ema:
        m = ema["momentum"]
        if isinstance(m, bool) or not isinstance(m, (int, float)):
            raise ConfigError(join_path(path, "momentum"), "not a number", value=m, expected="a number in [0, 1]")
        ema["momentum"] = round(1.0 - m, 12)  # MMEngine weighs the new weights by momentum
    if ramps:
        ema.setdefault("gamma", 2000)  # mmdet's ExpMomentumEMA default
    ema["convention"] = "mmengine"  # its first update copies the weights; every iteration counts
    out.set("ema", ema, path)
    out.renamed("ema", path, names)


#: The Runner's own default hooks that treadle takes (the others are what treadle always does):
#: a config's ``default_hooks`` update them, and ``None`` switches one off.
RUNNER_HOOKS = {"logger": {"type": "LoggerHook"}, "checkpoint": {"type": "CheckpointHook", "interval": 1}}


def _hooks(default_hooks: Any, custom_hooks: Any, out: _Out, *, scoped: bool,
           by_epoch: bool) -> tuple[list[Any], bool]:
    """The hooks to add, and whether the LoggerHook logs leftover iterations (``ignore_last: false``).
    ``scoped``: the config has a ``default_scope``, whose registries may know a hook treadle does
    not; ``by_epoch``: the loop (the Runner's default checkpoint saves each epoch, which an
    iteration-based loop has only at its end)."""
    if default_hooks is not None and not isinstance(default_hooks, dict):
        raise ConfigError("default_hooks", "must be a mapping of name: hook spec", value=default_hooks)
    if custom_hooks is not None and not isinstance(custom_hooks, list):
        raise ConfigError("custom_hooks", "must be a list of hook specs", value=custom_hooks)
    runner = {**RUNNER_HOOKS, "checkpoint": {"type": "CheckpointHook", "interval": 1 if by_epoch else -1}}
    defaults = {k: v for k, v in runner.items() if k not in (default_hooks or {})}
    items = [(f"default_hooks.{k}", v) for k, v in {**(default_hooks or {}), **defaults}.items()]
    items += [(f"custom_hooks[{i}]", v) for i, v in enumerate(custom_hooks or [])]
    hooks: list[Any] = []
    logs_leftovers = False
    for path, spec in items:
        before = len(hooks)
        if spec is None:  # MMEngine's way to switch a default hook off
            if path == "default_hooks.checkpoint":
                out.set("checkpoint", False, path)  # no checkpoint at all (treadle's default saves the last one)
            continue
        if not isinstance(spec, (dict, str, list, tuple)) and spec is not None:  # a hook object (Runner(...))
            hooks.append(spec)
            out.hook_sources.append(path)
            continue
        if not isinstance(spec, dict) or "type" not in spec:
            raise ConfigError(path, "must be a hook spec", value=spec, expected="{type: HookName, ...}")
        kind = spec["type"]
        if spec.get("enable") is False and kind not in REGISTRIES["hook"]:
            continue  # an MMEngine project's hook switched off (BadCaseAnalysisHook, VisualizationHook...)
        if kind in _DROPPED_HOOKS or visualization_hook(spec, path):
            continue
        if kind in _PRECISE_BN:  # mmpretrain's (mmcls's before it): the same arguments
            spec, kind = {**spec, "type": "PreciseBNHook"}, "PreciseBNHook"
        if isinstance(kind, str) and "." not in kind and kind not in REGISTRIES["hook"] and not scoped:
            raise ConfigError(join_path(path, "type"), "unknown hook type", value=kind,
                              expected=f"a treadle hook ({', '.join(sorted(REGISTRIES['hook']))}), a registered "
                                       "one, or a dotted import path",
                              hint="a config with default_scope takes its project's hooks by registry name")
        if kind == "CheckpointHook":
            _checkpoint(spec, path, out)
        elif kind == "LoggerHook":
            log = take(spec, path, {"interval": "interval", "ignore_last": "ignore_last"},
                       {"type": None, "log_metric_by_epoch": False, "interval_exp_name": None}, _LOGGER_WHY)
            out.set("log_interval", log.get("interval", 10), join_path(path, "interval"))  # MMEngine's default: 10
            if log.get("ignore_last", True) is not True:
                if log["ignore_last"] is not False:
                    raise ConfigError(join_path(path, "ignore_last"), "not a bool", value=log["ignore_last"],
                                      expected="true or false")
                logs_leftovers = True
        elif kind == "EMAHook":
            _ema(spec, path, out)
        elif kind == "EarlyStoppingHook":
            if spec.get("stopping_threshold") is not None:
                raise ConfigError(join_path(path, "stopping_threshold"), "option has no treadle equivalent",
                                  value=spec["stopping_threshold"], expected="no stopping_threshold (treadle stops "
                                  "on patience only)")
            hook = {("stop_on_nonfinite" if k == "check_finite" else k): v for k, v in spec.items()
                    if k != "stopping_threshold"}
            hook.setdefault("min_delta", 0.1)  # MMEngine's default (treadle's own is 0)
            if isinstance(hook.get("monitor"), str) and not hook["monitor"].startswith("val/"):
                hook["monitor"] = f"val/{hook['monitor']}"  # an evaluator's result: treadle's validation result
            hooks.append(hook)
        else:
            hooks.append(dict(spec))
        out.hook_sources += [path] * (len(hooks) - before)
    return hooks, logs_leftovers


def _model_wrapper(spec: Any, find_unused: Any) -> dict[str, Any]:
    """The options of a ddp strategy for the Runner's wrapper: without ``model_wrapper_cfg`` its
    ``MMDistributedDataParallel`` has ``broadcast_buffers=False`` and the top-level
    ``find_unused_parameters``; with one, that config's (torch's defaults otherwise)."""
    path = "model_wrapper_cfg"
    if spec is None:
        options = {"sync_buffers": False}
        if find_unused is not None:
            options["find_unused_parameters"] = find_unused
        return options
    if not isinstance(spec, dict):
        raise ConfigError(path, "must be a mapping", value=spec, expected="{type: MMDistributedDataParallel, ...}")
    kind = spec.get("type", "MMDistributedDataParallel")
    if not isinstance(kind, str) or kind.rsplit(".", 1)[-1] not in ("MMDistributedDataParallel",
                                                                    "DistributedDataParallel"):
        raise ConfigError(join_path(path, "type"), "unsupported model wrapper", value=kind,
                          expected="MMDistributedDataParallel (treadle's ddp strategy; fsdp and deepspeed: "
                                   "strategy: {type: fsdp | deepspeed})")
    return take(spec, path, {"find_unused_parameters": "find_unused_parameters", "broadcast_buffers": "sync_buffers",
                             "static_graph": "static_graph", "gradient_as_bucket_view": "gradient_as_bucket_view"},
                {"type": None, "device_ids": None, "detect_anomalous_params": False})


def _strategy_with(given: Any, options: dict[str, Any], source: str) -> dict[str, Any]:
    """``given`` (the config's strategy, or None) with ``options`` for its process group."""
    if given is None or given in ("auto", "ddp", "fsdp"):
        given = {"type": "ddp" if given in (None, "auto") else given}
    if not isinstance(given, dict) or given.get("type") not in ("auto", "ddp", "fsdp"):
        raise ConfigError(source, "needs a strategy that starts a process group", value=given,
                          expected="no strategy, or ddp or fsdp")
    clash = sorted(set(options) & set(given))
    if clash:
        raise ConfigError(source, f"sets strategy {', '.join(clash)}, which the config also gives", value=options,
                          expected="only one of them")
    return {**given, "type": "ddp" if given["type"] == "auto" else given["type"], **options}


def translate(cfg: dict[str, Any], replaced: dict[str, str] | None = None,
              origins: dict[str, str] | None = None) -> dict[str, Any]:
    """``cfg`` with MMEngine's keys replaced by treadle's (see the module's table).
    ``replaced`` receives the top-level variables that a translated key overrode (or
    helpers it dropped), each with the key that set it; ``origins`` each key path the
    translation wrote, with the path the file wrote (treadle/config/origins.py)."""
    out = _Out(cfg)
    if "optim_wrapper" in cfg:
        _optim_wrapper(cfg["optim_wrapper"], out)
    if "param_scheduler" in cfg:
        schedulers = cfg["param_scheduler"]
        if is_multi(cfg.get("optim_wrapper")) and schedulers is not None:  # the same ones for each optimizer
            schedulers = schedulers_by_name(schedulers, list(out.cfg["optimizer"]))
        out.set("schedulers", schedulers, "param_scheduler")
    if "train_cfg" in cfg:
        _train_cfg(cfg["train_cfg"], out)
    for key in ("val_cfg", "test_cfg"):
        spec = cfg.get(key)
        loops = ("ValLoop", "MultiValLoop") if key == "val_cfg" else ("TestLoop", "MultiTestLoop")
        kind = spec.get("type") if isinstance(spec, dict) else None
        loop = kind.rpartition(".")[2] if isinstance(kind, str) else kind  # mmagic's, with its scope or not
        if spec not in (None, {}) and not (set(spec) == {"type"} and loop in loops):
            raise ConfigError(key, "options have no treadle equivalent", value=spec,
                              expected=f"{{}}, null or {{type: {loops[0]} | {loops[1]}}} without options")
    hooks, logs_leftovers = _hooks(cfg.get("default_hooks"), cfg.get("custom_hooks"), out,
                                   scoped=cfg.get("default_scope") is not None,
                                   by_epoch=out.cfg.get("max_iters") is None)
    if "randomness" in cfg:
        rnd = cfg["randomness"]
        if not isinstance(rnd, dict):
            raise ConfigError("randomness", "must be a mapping", value=rnd, expected="{seed: N, deterministic: bool}")
        for key, value in take(rnd, "randomness", {"seed": "seed", "deterministic": "deterministic",
                                                   "diff_rank_seed": "seed_per_rank"}, {}).items():
            out.set(key, value, join_path("randomness", key))
    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        if key in out.cfg and key != "train_dataloader" and isinstance(out.cfg[key], (list, tuple)):
            out.cfg[key] = {name: translate_dataloader(spec, join_path(key, i))  # mmagic's MultiValLoop: sets by name
                            for i, (name, spec) in enumerate(zip(set_names(out.cfg[key]), out.cfg[key]))}
        elif key in out.cfg:
            out.cfg[key] = translate_dataloader(out.cfg[key], key)
    defaults = config_defaults(TrainerArgs)  # the Trainer's: log_interval, log_writers
    log_interval = out.cfg.get("log_interval", defaults["log_interval"])
    rt = translate_runtime(cfg, deterministic=out.cfg.get("deterministic") is True)
    for key, value, source in rt.settings:
        out.set(key, value, source)
    if is_mmengine_strategy(out.cfg.get("strategy")):
        for key, value, source in strategy_settings(out.cfg["strategy"]):
            out.set(key, value, source)
        out.cfg["strategy"] = translate_strategy(out.cfg["strategy"])
    if rt.strategy:
        out.cfg["strategy"] = _strategy_with(out.cfg.get("strategy"), rt.strategy, rt.strategy_source)
    wrapper = _model_wrapper(cfg.get("model_wrapper_cfg"), cfg.get("find_unused_parameters"))
    given = out.cfg.get("strategy")
    flexible = is_mmengine_strategy(cfg.get("strategy"))  # FlexibleRunner's strategy: its own wrapper options
    if not flexible and (given in (None, "auto", "ddp") or (isinstance(given, dict) and given.get("type") in
                                                            ("auto", "ddp"))):
        given = given if isinstance(given, dict) else {"type": given or "auto"}  # auto: ddp's options on several
        out.cfg["strategy"] = {**given, **{k: v for k, v in wrapper.items() if k not in given}}
    if "sync_bn" in out.cfg:  # the runner's: BatchNorm layers converted when it wraps the model for several processes
        sync = sync_bn_option(out.cfg.pop("sync_bn"), "sync_bn")
        if sync:
            out.cfg["strategy"] = _strategy_with(out.cfg.get("strategy"), sync, "sync_bn")
    hooks = rt.hooks + hooks
    sources = ["env_cfg" if "env_cfg" in cfg else "log_level"] * len(rt.hooks) + out.hook_sources
    logger = {**({"ignore_last": False} if logs_leftovers else {}),
              **rt.logger}
    if logger:  # options of the LoggerHook: it replaces the default one, so it takes the writers too
        hooks.append({"type": "LoggerHook", "interval": log_interval, **logger,
                      "writers": out.cfg.get("log_writers", defaults["log_writers"])})
        sources.append("log_processor" if rt.logger else "default_hooks.logger")
    if hooks:
        out.set("hooks", hooks, "custom_hooks")
        for i, source in enumerate(sources):
            out.origins[join_path("hooks", i)] = source
            if source.startswith("custom_hooks[") and hooks[i].get("type") == "EarlyStoppingHook":
                out.origins[join_path(join_path("hooks", i), "stop_on_nonfinite")] = join_path(source, "check_finite")
    keys = [*(k.name for k in TRAINER_KEYS), *(k.name for k in PROJECT_KEYS), *MMENGINE_KEYS, *NOT_TRANSLATED]
    for name in helper_names(cfg, keys):
        if out.cfg.pop(name, None) is not None:  # used only to write other keys
            out.replaced.setdefault(name, "")
    if cfg.get("visualizer") is not None and "vis_backends" in out.cfg:  # default_runtime.py's helper
        out.cfg.pop("vis_backends")
        out.replaced.setdefault("vis_backends", "visualizer")
    scale = out.cfg.get("auto_scale_lr")
    if isinstance(scale, dict) and "enable" not in scale:
        out.cfg["auto_scale_lr"] = {**scale, "enable": False}  # MMEngine scales only with enable=True
    if out.cfg.get("resume") is True and out.cfg.get("load_from") is not None:
        out.cfg["resume"] = out.cfg.pop("load_from")  # MMEngine resumes from load_from (full state)
    if "model" in out.cfg:
        out.cfg.setdefault("init_weights", True)  # MMEngine's runner calls model.init_weights()
    if "data_preprocessor" in out.cfg:  # the Runner's: model.setdefault('data_preprocessor', ...)
        preprocessor = out.cfg.pop("data_preprocessor")
        if isinstance(out.cfg.get("model"), dict) and preprocessor is not None:
            out.cfg["model"] = {**out.cfg["model"], "data_preprocessor": out.cfg["model"].get(
                "data_preprocessor", preprocessor)}
            out.origins.setdefault("model.data_preprocessor", "data_preprocessor")
    if replaced is not None:
        replaced.update(out.replaced)
    if origins is not None:
        origins.update(out.origins)
    return out.cfg


__all__ = ["MMENGINE_KEYS", "NOT_TRANSLATED", "is_mmengine_style", "translate"]
