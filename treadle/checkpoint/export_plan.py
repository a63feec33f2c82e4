"""What an exported folder holds, and where its tensors come from: the pieces that the
whole-model, adapter and merged exports share (treadle/checkpoint/hf_export.py,
treadle/checkpoint/peft_merge.py).

A :class:`FolderPlan` lists the folder's small JSON files and its weights (a
:class:`~treadle.checkpoint.safetensors_stream.TensorSpec` each, and a function reading
each tensor when it is written); :func:`open_base` opens the base model's folder that frozen
weights left out of a checkpoint are read from, each checked for its shape first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .manifest import CheckpointError
from .safetensors_stream import TensorSpec
from .tensor_sources import FolderWeights

__all__ = ["ExportError", "FolderPlan", "dtype_of", "hf_config", "hf_files", "open_base"]


class ExportError(CheckpointError):
    """An export that cannot be done as asked (one line: what, and what to do)."""


@dataclass
class FolderPlan:
    """What goes into the folder: small JSON files, and the weights file(s) ``weights``
    (``model`` or ``adapter_model``) of ``specs``, each tensor from ``read``."""

    files: dict[str, Any]
    weights: str
    specs: list[TensorSpec]
    read: Callable[[str], torch.Tensor]
    done: Callable[[str], None] = lambda key: None
    shard: bool = True


def _shape(shape: Any) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a checkpoint records by name (``"bfloat16"``)."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ExportError(f"the checkpoint records a tensor of dtype {name!r}, which this torch does not have")
    return dtype


def _not_a_folder(info: Mapping[str, Any], base: str) -> str:
    """Why the recorded ``base`` cannot be read: a folder that was there when the model was
    loaded (a recorded local folder, or an absolute path) and is missing now, or a name
    that is not a local folder (a Hub id)."""
    was_a_path = base == info.get("pretrained") or os.path.isabs(base)
    if was_a_path and not os.path.lexists(base):
        return "which no longer exists"
    return "not a local folder"


def open_base(info: Mapping[str, Any], base: str | os.PathLike[str] | None, checkpoint: Path,
              needed: Mapping[str, TensorSpec]) -> FolderWeights:
    """The base folder the weights ``needed`` (the model's keys there -> the model's
    spec) are read from: ``base``, or where the model was loaded from; each tensor there
    checked for its shape first."""
    what = "--base"
    if base is None:
        peft_cfg = (info.get("peft") or {}).get("config") or {}
        base = info.get("pretrained") or peft_cfg.get("base_model_name_or_path")
        first = next(iter(needed))
        if not base or not Path(base).is_dir():
            loaded = f"; the model was loaded from {str(base)!r}, {_not_a_folder(info, str(base))}" if base else ""
            raise ExportError(f"{checkpoint} leaves out {len(needed)} of the model's weights (frozen ones, e.g. "
                              f"{first!r}); they are read from the base model: pass --base DIR (a folder "
                              f"save_pretrained wrote){loaded}")
        what = "the base"
    folder = FolderWeights(base, what)
    for key, spec in needed.items():
        have = folder.specs.get(key)
        if have is None:
            raise ExportError(f"{what} {folder.path}: no tensor {key!r}, which the model has {_shape(spec.shape)}; "
                              "is it the folder this model was loaded from?")
        if have.shape != spec.shape:
            raise ExportError(f"{what} {folder.path}: tensor {key!r} has shape {_shape(have.shape)}, the model's is "
                              f"{_shape(spec.shape)}; it is not this model's base")
    return folder


def hf_config(info: Mapping[str, Any], class_name: str, specs: list[TensorSpec]) -> dict[str, Any]:
    """``config.json``'s content as ``save_pretrained`` writes it: the recorded config with the
    model's class as its architecture and the dtype of its first floating-point weights."""
    config = dict(info["hf"]["config"])
    config["architectures"] = [class_name]
    floating = next((s.dtype for s in specs if s.dtype.is_floating_point), None)
    if floating is not None:
        config["torch_dtype" if "torch_dtype" in config else "dtype"] = str(floating).removeprefix("torch.")
    return config


def hf_files(info: Mapping[str, Any], class_name: str, specs: list[TensorSpec]) -> dict[str, Any]:
    """``config.json`` and, where the model has one, ``generation_config.json``."""
    files: dict[str, Any] = {"config.json": hf_config(info, class_name, specs)}
    if info["hf"].get("generation_config") is not None:
        files["generation_config.json"] = info["hf"]["generation_config"]
    return files
