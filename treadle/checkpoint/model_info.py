"""What a checkpoint records about its model, so that ``treadle export`` needs nothing else.

:func:`describe_model` is called once per run, when the strategy prepares the model; the
strategy puts its result under ``"model"`` in every checkpoint's manifest meta (JSON)::

    {"class": "transformers.models.llama.modeling_llama.LlamaForCausalLM",
     "tensors": {"model.embed_tokens.weight": ["float32", [32000, 4096]], ...},  # every state-dict tensor
     "tied": {"lm_head.weight": "model.embed_tokens.weight"},  # an alias -> the key kept in its place
     "pretrained": "/abs/path/of/the/folder/it/was/loaded/from",  # when that is a local folder
     "hf": {"config": {...}, "generation_config": {...}},  # a Hugging Face model's, as save_pretrained writes them
     "peft": {"adapter": "default", "config": {...adapter_config.json...},      # a PEFT model
              "base_class": "transformers....LlamaForCausalLM",
              "keys": {"base_model.model....lora_A.default.weight": "base_model.model....lora_A.weight"}}}

``tensors`` lists the whole model even when a checkpoint leaves frozen weights out.
``tied`` follows ``save_pretrained``: of the keys that share one tensor, those the model
declares tied (``_tied_weights_keys``) are dropped, one key is kept. ``peft.keys`` maps the
model's state-dict keys to the adapter file's, as PEFT's ``get_peft_model_state_dict``
names them (``null`` with ``peft.unsupported`` for an adapter whose file is not the
model's own tensors, e.g. prompt learning).

Duck-typed: nothing of transformers or peft is imported unless the model is one of theirs.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["describe_model", "class_path", "json_safe"]

logger = logging.getLogger("treadle")


def class_path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def json_safe(obj: Any) -> Any:
    """``obj`` as JSON can hold it: dtypes and enums by name, sets and tuples as lists,
    non-finite floats as their names; other objects by ``str``."""
    if isinstance(obj, enum.Enum):  # before str: PEFT's enums are strs too
        return json_safe(obj.value)
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        items = [json_safe(v) for v in obj]
        return sorted(items) if all(isinstance(v, str) for v in items) else items
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return str(obj)


def _tensors(module: nn.Module) -> dict[str, list[Any]]:
    out = {}
    for key, t in module.state_dict().items():
        if isinstance(t, torch.Tensor):  # not a module's _extra_state
            out[key] = [str(t.dtype).removeprefix("torch."), list(t.shape)]
    return out


def _declared_tied(module: nn.Module) -> list[str]:
    """The patterns of the keys a Hugging Face model declares tied (its modules'
    ``_tied_weights_keys``: a dict of target -> source, or a list of targets)."""
    found = []
    for name, sub in module.named_modules():
        declared = getattr(sub, "_tied_weights_keys", None) or ()
        found += [f"{name}.{k}" if name else str(k) for k in declared]
    return found


def _matches(pattern: str, key: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return pattern == key


def tied_keys(module: nn.Module) -> dict[str, str]:
    """``{alias: kept}`` for the state-dict keys that name one tensor (the same Parameter
    or buffer): per group, the declared-tied keys are dropped as long as one key is left,
    then all but the first of the others (state-dict order)."""
    order = {k: i for i, k in enumerate(module.state_dict())}
    groups: dict[int, list[str]] = {}
    owners: dict[int, Any] = {}
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, t in named:
        if name in order:
            groups.setdefault(id(t), []).append(name)
            owners[id(t)] = t  # keep the object alive: ids stay unique
    patterns = _declared_tied(module)
    out: dict[str, str] = {}
    for names in groups.values():
        names = sorted(set(names), key=order.__getitem__)
        if len(names) < 2:
            continue
        declared = [n for n in sorted(names) if any(_matches(p, n) for p in patterns)]
        dropped = declared[: len(names) - 1] if len(declared) == len(names) else declared
        kept = [n for n in names if n not in dropped]
        out.update({n: kept[0] for n in dropped})
        out.update({n: kept[0] for n in kept[1:]})
    return out


def _hf_part(module: nn.Module) -> dict[str, Any] | None:
    config = getattr(module, "config", None)
    if not callable(getattr(config, "to_dict", None)):
        return None
    as_dict = getattr(config, "to_diff_dict", None) or config.to_dict  # what save_pretrained writes
    part: dict[str, Any] = {"config": json_safe(as_dict())}
    generation = getattr(module, "generation_config", None)
    can_generate = getattr(module, "can_generate", None)
    if generation is not None and callable(can_generate) and can_generate():
        as_dict = getattr(generation, "to_diff_dict", None) or generation.to_dict
        part["generation_config"] = json_safe(as_dict())
    return part


def _is_peft(module: nn.Module) -> bool:
    return type(module).__module__.split(".", 1)[0] == "peft" and isinstance(getattr(module, "peft_config", None), dict)


def _peft_part(module: nn.Module) -> dict[str, Any]:
    """The active adapter's config as ``PeftModel.save_pretrained`` writes it, and its keys."""
    from peft.utils import get_peft_model_state_dict  # a PEFT model: peft is there

    name = module.active_adapter  # type: ignore[attr-defined]  # a PeftModel's
    name = name if isinstance(name, str) else name[0]
    config = module.peft_config[name]  # type: ignore[index]  # checked by _is_peft
    base = module.get_base_model()  # type: ignore[operator]  # a PeftModel's
    written = json_safe(config.to_dict())
    written["inference_mode"] = True  # as save_pretrained writes it
    if written.get("base_model_name_or_path") is None:
        written["base_model_name_or_path"] = getattr(base, "name_or_path", None) or None
    if written.get("task_type") is None:  # save_pretrained's auto mapping, for a model of no known task
        written["auto_mapping"] = {"base_model_class": type(base).__name__, "parent_library": type(base).__module__}
    part: dict[str, Any] = {"adapter": name, "config": written, "base_class": class_path(base), "keys": None}
    if getattr(config, "is_prompt_learning", False):
        part["unsupported"] = f"{written.get('peft_type')} (prompt learning) keeps its adapter outside the model's tensors"
        return part
    targets = getattr(config, "target_modules", None) or ()
    embeddings = isinstance(targets, (list, set, tuple)) and any(
        t in targets for t in ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_in", "embed_out"))
    state = module.state_dict()
    # Its own selection of the adapter's entries, given the model's state dict: each comes
    # back as the same tensor object under the adapter file's key. (Embedding layers are
    # saved when targeted; PEFT's "auto" would also ask the Hub whether the vocabulary changed.)
    adapter = get_peft_model_state_dict(module, state_dict=state, adapter_name=name, save_embedding_layers=embeddings)
    by_id = {id(t): k for k, t in state.items()}
    keys = {by_id.get(id(t)): k for k, t in adapter.items()}
    if None in keys:
        part["unsupported"] = f"{written.get('peft_type')}: its adapter file holds tensors computed from the model's"
        return part
    part["keys"] = keys
    return part


def describe_model(module: nn.Module) -> dict[str, Any]:
    """The ``"model"`` entry of a checkpoint's meta for ``module`` (the module docstring)."""
    info: dict[str, Any] = {"class": class_path(module), "tensors": _tensors(module), "tied": tied_keys(module)}
    try:
        hf = _hf_part(module)
        if hf is not None:
            info["hf"] = hf
            source = getattr(getattr(module, "config", None), "_name_or_path", None)
            if isinstance(source, str) and source and os.path.isdir(source):
                info["pretrained"] = os.path.abspath(source)
        if _is_peft(module):
            info["peft"] = _peft_part(module)
    except Exception as e:  # never a reason to stop training: export says what it lacks
        logger.warning(f"the checkpoints will not record {class_path(module)}'s Hugging Face or PEFT config "
                       f"({type(e).__name__}: {e}); treadle export can still write its weights to a .safetensors file")
    return info
