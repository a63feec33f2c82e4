"""The DeepSpeed config a treadle run hands to ``deepspeed.initialize``.

treadle's own settings write it; the user's raw entries (``config=``) are merged in, and
an entry that contradicts a treadle setting is an error naming both (never a silent
winner)::

    train_micro_batch_size_per_gpu   the training loader's batch size
    gradient_accumulation_steps      accumulate           (treadle owns the window:
    managed_gradient_accumulation    false                 treadle/strategies/deepspeed_optim.py)
    bf16 / fp16 .enabled             precision="bf16" / "16"
    gradient_clipping                clip_grad=dict(max_norm=x) -> x; else 0 (DeepSpeed's default is 1.0)
    zero_optimization.stage          zero_stage
    zero_optimization.offload_*      offload_optimizer / offload_param -> {"device": "cpu"}

treadle builds the optimizer and steps the schedulers, as for every strategy: a DeepSpeed
``optimizer`` or ``scheduler`` section is refused (``optimizer=dict(type="AdamW", ...)``
gives the torch AdamW that DeepSpeed's ``torch_adam`` would, with no compiled op).
"""

from __future__ import annotations

import copy
from typing import Any

#: Sections treadle refuses, and what to use instead.
_REFUSED = {
    "optimizer": "treadle builds the optimizer: pass optimizer=dict(type='AdamW', lr=...) (the torch optimizer "
                 "DeepSpeed's torch_adam would build, with no compiled op) or an optim_wrapper",
    "scheduler": "treadle steps the schedulers: pass schedulers= / param_scheduler= (torch's or treadle's)",
    "amp": "use precision='bf16' or '16' (DeepSpeed's bf16/fp16 sections)",
}
_STAGES = (0, 1, 2, 3)


def check_options(zero_stage: Any, config: Any, offload_optimizer: Any, offload_param: Any) -> dict[str, Any]:
    """The strategy's own options checked (at construction, before any process starts);
    returns a copy of ``config``."""
    if isinstance(zero_stage, bool) or zero_stage not in _STAGES:
        raise ValueError(f"zero_stage={zero_stage!r}; expected 0, 1, 2 or 3")
    if config is None:
        config = {}
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise TypeError(f"config={config!r}; expected a dict of DeepSpeed config entries, e.g. "
                        "{'zero_optimization': {'stage3_param_persistence_threshold': 0}}")
    for key, why in _REFUSED.items():
        if key in config:
            raise ValueError(f"config[{key!r}] is not taken under treadle: {why}")
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name}={value!r}; expected True, False or None (from config)")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise TypeError(f"config['zero_optimization']={zero!r}; expected a dict")
    if "stage" in zero and zero["stage"] != zero_stage:
        raise ValueError(f"config['zero_optimization']['stage']={zero['stage']!r} contradicts zero_stage={zero_stage}; "
                         "give the stage once")
    if offload_param and zero_stage != 3:
        raise ValueError(f"offload_param=True needs zero_stage=3 (got {zero_stage})")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer=True needs zero_stage 1, 2 or 3 (got 0)")
    return copy.deepcopy(config)


def _agree(config: dict[str, Any], path: tuple[str, ...], value: Any, setting: str) -> None:
    """Set ``config[path] = value``, unless the user's entry there says otherwise: then
    raise, naming both."""
    *parents, leaf = path
    node = config
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise TypeError(f"config[{key!r}]={node!r}; expected a dict")
    where = "config" + "".join(f"[{k!r}]" for k in path)
    if leaf in node and node[leaf] != value:
        raise ValueError(f"{where}={node[leaf]!r} contradicts {setting} (which means {value!r}); set it in one "
                         "place: the treadle setting")
    node[leaf] = value


def build_config(user: dict[str, Any], *, zero_stage: int, offload_optimizer: bool | None,
                 offload_param: bool | None, micro_batch: int | None, accumulate: int, world_size: int, precision: str,
                 clip_grad: dict[str, Any] | None, device_type: str) -> dict[str, Any]:
    """The config for ``deepspeed.initialize`` (see the module docstring)."""
    cfg = copy.deepcopy(user)
    if micro_batch is not None:
        _agree(cfg, ("train_micro_batch_size_per_gpu",), int(micro_batch), f"the training loader's batch_size={micro_batch}")
    cfg.setdefault("train_micro_batch_size_per_gpu", 1)  # no loader known: DeepSpeed only counts samples with it
    if "train_batch_size" in cfg:
        total = cfg["train_micro_batch_size_per_gpu"] * accumulate * world_size
        _agree(cfg, ("train_batch_size",), total, f"batch_size x accumulate x processes = {total}")
    _agree(cfg, ("gradient_accumulation_steps",), accumulate, f"accumulate={accumulate}")
    _agree(cfg, ("managed_gradient_accumulation",), False, "treadle's accumulation windows")
    if precision == "16" and device_type == "cpu":
        raise ValueError("precision='16' under DeepSpeed needs a GPU: DeepSpeed's CPU accelerator has no fp16; "
                         "use precision='bf16' or '32'")
    _agree(cfg, ("bf16", "enabled"), precision == "bf16", f"precision={precision!r}")
    _agree(cfg, ("fp16", "enabled"), precision == "16", f"precision={precision!r}")
    if clip_grad is not None:
        if "value" in clip_grad:
            raise ValueError(f"clip_grad={clip_grad!r}: DeepSpeed clips by norm only; use clip_grad=dict(max_norm=...)")
        if float(clip_grad.get("norm_type", 2)) != 2.0:
            raise ValueError(f"clip_grad={clip_grad!r}: DeepSpeed clips by the 2-norm only (norm_type=2)")
    clip = float(clip_grad["max_norm"]) if clip_grad is not None else 0.0
    _agree(cfg, ("gradient_clipping",), clip, f"clip_grad={clip_grad!r}")
    _agree(cfg, ("zero_optimization", "stage"), zero_stage, f"zero_stage={zero_stage}")
    zero = cfg["zero_optimization"]
    for flag, key in ((offload_optimizer, "offload_optimizer"), (offload_param, "offload_param")):
        section = zero.get(key)
        on = isinstance(section, dict) and section.get("device", "none") not in ("none", None)
        if flag is None:
            continue
        if flag != on and section is not None:
            raise ValueError(f"config['zero_optimization'][{key!r}]={section!r} contradicts {key}={flag}")
        if flag:
            zero[key] = {"device": "cpu", "pin_memory": device_type == "cuda", **(section or {})}
    if isinstance(zero.get("offload_optimizer"), dict):
        # A torch optimizer over offloaded state: DeepSpeed otherwise insists on its compiled CPUAdam.
        cfg.setdefault("zero_force_ds_cpu_optimizer", False)
    cfg.setdefault("zero_allow_untested_optimizer", True)  # a torch optimizer under ZeRO
    cfg.setdefault("steps_per_print", 2**62)  # treadle logs; DeepSpeed's own progress lines off
    return cfg


__all__ = ["build_config", "check_options"]
