"""A PEFT model's checkpoint exported with its adapter merged into the base, layer by layer.

The model is rebuilt empty (on the meta device) from what the checkpoint records: the base
class (a transformers class, looked up in the ``transformers`` package by name: nothing
named by the checkpoint is imported) with its config, and the adapter from its PEFT config.
Then each adapted layer in turn is given its tensors (the checkpoint's; the frozen base
weights it left out from the base folder), merged by PEFT's own layer code
(``layer.merge()``, as ``merge_and_unload`` does) and written; its memory goes before the
next. Modules trained whole (``modules_to_save``) come from the checkpoint, the rest from
the checkpoint when it holds them, else from the base folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .export_plan import ExportError, FolderPlan, dtype_of, hf_files, open_base
from .model_info import tied_keys
from .safetensors_stream import TensorSpec

__all__ = ["merged_plan"]

# The settings that initialize an adapter from the base's weights (PiSSA, LoftQ...): not
# wanted here, where the trained adapter weights are loaded over whatever is initialized.
_INIT_SETTINGS = ("init_lora_weights", "init_weights", "init_ia3_weights")


def _transformers_class(path: str) -> type:
    import transformers

    module, _, name = path.rpartition(".")
    cls = getattr(transformers, name, None) if module.split(".", 1)[0] == "transformers" else None
    if not isinstance(cls, type) or cls.__module__ != module:
        raise ExportError(f"--merge rebuilds the base model from transformers; the checkpoint's base is {path}, "
                          "not a transformers model class; export the adapter instead (without --merge)")
    return cls


def _identities(model: nn.Module) -> dict[int, str]:
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    return {id(t): name for name, t in reversed(named)}  # the first name of a tied tensor


def _rebuild(info: Mapping[str, Any]) -> tuple[nn.Module, dict[str, TensorSpec], dict[str, str], dict[str, str]]:
    """``(peft model on meta, base key -> spec, tied base keys, peft key -> base key)``."""
    import peft

    peft_info = info["peft"]
    cls = _transformers_class(peft_info["base_class"])
    config = cls.config_class.from_dict(dict(info["hf"]["config"]))  # type: ignore[attr-defined]  # a PreTrainedModel
    with torch.device("meta"):
        base = cls(config)
    recorded = info.get("tensors") or {}
    base_specs = {k: TensorSpec(k, t.dtype, tuple(t.shape)) for k, t in base.state_dict().items()
                  if isinstance(t, torch.Tensor)}
    tied = tied_keys(base)
    to_base = _identities(base)
    settings = {k: v for k, v in peft_info["config"].items() if k != "auto_mapping"}
    settings["base_model_name_or_path"] = None  # the meta model comes from no folder: no warning that it differs
    peft_config = peft.PeftConfig.from_peft_type(**settings)
    for name in _INIT_SETTINGS:
        if hasattr(peft_config, name):
            setattr(peft_config, name, True)
    model = peft.get_peft_model(base, peft_config, adapter_name=peft_info["adapter"])
    rebuilt = [k for k, t in model.state_dict().items() if isinstance(t, torch.Tensor)]
    if recorded and set(rebuilt) != set(recorded):
        odd = sorted(set(rebuilt) ^ set(recorded))[0]
        raise ExportError(f"--merge: the model rebuilt from the checkpoint's configs differs from the trained one "
                          f"(at {odd!r}); export the adapter instead (without --merge)")
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    peft_to_base = {k: to_base[id(t)] for k, t in named if id(t) in to_base}
    # The dtype each tensor had in training (the meta model's are the default dtype's).
    for key, base_key in peft_to_base.items():
        if key in recorded and base_key in base_specs:
            base_specs[base_key] = TensorSpec(base_key, dtype_of(recorded[key][0]), base_specs[base_key].shape)
    return model, base_specs, tied, peft_to_base


class _Merger:
    """Each output tensor of the merged model, made one adapted layer at a time."""

    def __init__(self, model: nn.Module, info: Mapping[str, Any], source: Any, base_specs: dict[str, TensorSpec],
                 peft_to_base: dict[str, str]) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils import ModulesToSaveWrapper
        from peft.utils.other import AuxiliaryTrainingWrapper

        self.source, self.adapter = source, info["peft"]["adapter"]
        self.recorded = info.get("tensors") or {}
        self.to_base = peft_to_base
        self.from_base = {b: k for k, b in peft_to_base.items()}  # base key -> the peft model's key
        self.layers: dict[str, tuple[str, nn.Module, str]] = {}  # base key -> (layer name, layer, its own key)
        self.copies: dict[str, str] = {}  # base key -> the trained copy's key (modules_to_save)
        for name, module in model.named_modules():
            if isinstance(module, ModulesToSaveWrapper):
                for local in module.original_module.state_dict():
                    self.copies[peft_to_base[f"{name}.original_module.{local}"]] = (
                        f"{name}.modules_to_save.{self.adapter}.{local}")
            elif isinstance(module, AuxiliaryTrainingWrapper):
                raise ExportError(f"--merge: {type(module).__name__} ({name}) is not supported; export the adapter "
                                  "instead (without --merge)")
            elif isinstance(module, BaseTunerLayer):
                for local in module.get_base_layer().state_dict():
                    key = peft_to_base[f"{name}.base_layer.{local}"]
                    self.layers[key] = (name, module, local)
        self.base_specs = base_specs
        self._current: tuple[str, dict[str, torch.Tensor]] | None = None

    def needs_base(self) -> dict[str, TensorSpec]:
        """The base keys not in the checkpoint: read from the base folder."""
        needed = {}
        for key, spec in self.base_specs.items():
            if key in self.copies:
                continue
            if self.from_base.get(key) not in self.source.specs:
                needed[key] = spec
        return needed

    def _merge(self, name: str, layer: nn.Module, folder: Any) -> dict[str, torch.Tensor]:
        """Layer ``name`` given its tensors as it trained (the checkpoint's, else the base's in
        the training dtype), merged by PEFT, its base layer's tensors returned."""
        state = {}
        for local in layer.state_dict():
            key = f"{name}.{local}"
            if key in self.source.specs:  # a copy: the merge writes into it, never into the checkpoint's
                state[local] = self.source.read(key).clone()
                self.source.done(key)
            else:
                dtype = dtype_of(self.recorded[key][0]) if key in self.recorded else None
                t = folder.read(self.to_base[key])
                state[local] = t.to(dtype) if dtype is not None else t
        layer.load_state_dict(state, assign=True)
        del state
        layer.merge(adapter_names=[self.adapter])  # type: ignore[operator]  # a BaseTunerLayer's
        merged = {local: t.detach() for local, t in layer.get_base_layer().state_dict().items()}  # type: ignore[operator]  # a BaseTunerLayer's
        layer.to_empty(device="meta")  # its memory goes with the merged tensors, before the next layer's
        return merged

    def read(self, key: str, folder: Any) -> torch.Tensor:
        if key in self.copies:
            return self.source.read(self.copies[key])
        if key in self.layers:
            name, layer, local = self.layers[key]
            if self._current is None or self._current[0] != name:
                self._current = None  # the previous layer's tensors go first
                self._current = (name, self._merge(name, layer, folder))
            return self._current[1][local]
        peft_key = self.from_base[key]
        if peft_key in self.source.specs:
            return self.source.read(peft_key)
        return folder.read(key).to(self.base_specs[key].dtype)


def merged_plan(info: Mapping[str, Any], source: Any, checkpoint: Path, base: Any) -> FolderPlan:
    """The plan of a merged export (see the module docstring)."""
    if "hf" not in info:
        raise ExportError(f"--merge: {checkpoint} records no Hugging Face config of the base model; export the "
                          "adapter instead (without --merge)")
    model, base_specs, tied, peft_to_base = _rebuild(info)
    merger = _Merger(model, info, source, base_specs, peft_to_base)
    changed = set(merger.layers) | set(merger.copies)
    for alias, kept in tied.items():
        if {alias, kept} & changed and not {alias, kept} <= changed:
            raise ExportError(f"--merge: the adapter changes {(alias if alias in changed else kept)!r}, which the "
                              f"model ties to {(kept if alias in changed else alias)!r}; a merged folder cannot hold "
                              "both: export the adapter instead (without --merge)")
    specs = [spec for key, spec in base_specs.items() if key not in tied]
    needed = {k: s for k, s in merger.needs_base().items() if k not in tied}
    folder = open_base(info, base, checkpoint, needed) if needed else None

    def done(key: str) -> None:
        peft_key = merger.copies.get(key) or merger.from_base.get(key)
        if peft_key in source.specs and key not in merger.layers:
            source.done(peft_key)

    class_name = info["peft"]["base_class"].rsplit(".", 1)[-1]
    return FolderPlan(hf_files(info, class_name, specs), "model", specs, lambda k: merger.read(k, folder), done)
