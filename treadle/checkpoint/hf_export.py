"""A checkpoint exported as a Hugging Face folder: what ``from_pretrained(folder)`` loads.

    export_folder("runs/x/checkpoints/iter_00001000", "exported/")               # config.json + model.safetensors
    export_folder(ckpt, "adapter/")                # a PEFT model: adapter_config.json + adapter_model.safetensors
    export_folder(ckpt, "merged/", merge=True, base="llama-base/")   # the base with the adapter merged in

Everything comes from the checkpoint: its manifest's ``"model"`` entry (model_info.py: the
Hugging Face config, the PEFT config and keys, tied keys) and its weights, read and written
one tensor at a time (tensor_sources.py, safetensors_stream.py), so an export holds about
one tensor beyond its buffers whatever the model's size. Weights the checkpoint left out
(frozen ones) are read from the base model's folder (``base``, by default where the model
was loaded from), their shapes checked against the model's. The folder is written in a
scratch directory beside it (each file fsynced) and renamed into place: it appears whole
or not at all, and an existing non-empty folder is never written into.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from treadle.fsutil import fsync_dir

from .durable import _scratch_name
from .export_plan import ExportError, FolderPlan, dtype_of, hf_files, open_base
from .manifest import read_manifest
from .safetensors_stream import TensorSpec, parse_size, plan_shards, write_safetensors
from .tensor_sources import SAFE_INDEX, open_checkpoint_weights

__all__ = ["ExportError", "DEFAULT_MAX_SHARD_SIZE", "export_folder", "read_model_info", "check_out_dir"]

#: ``save_pretrained``'s default shard size (transformers 5).
DEFAULT_MAX_SHARD_SIZE = "50GB"


def read_model_info(checkpoint: Path) -> dict[str, Any] | None:
    """The ``"model"`` entry of a checkpoint directory's manifest meta (None without one)."""
    if not checkpoint.is_dir():
        return None
    info = read_manifest(checkpoint).get("meta", {}).get("model")
    return info if isinstance(info, dict) else None


def check_out_dir(out: Path) -> None:
    """``out`` may be created as a folder: it does not exist, or is an empty folder."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(f"--out {out}: exists and is not a folder; give a new or empty folder (or a path ending "
                          "in .safetensors for one file)")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"--out {out}: the folder exists and is not empty; export into a new or empty folder "
                          "(nothing was written)")
    for parent in out.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ExportError(f"--out {out}: {parent} is not a directory")
            break


def full_plan(info: Mapping[str, Any], source: Any, checkpoint: Path, base: Any) -> FolderPlan:
    """The model's weights under its own keys, tied aliases dropped; the ones the
    checkpoint left out read from the base folder."""
    recorded = info.get("tensors") or {k: [str(s.dtype).removeprefix("torch."), list(s.shape)]
                                       for k, s in source.specs.items()}
    tied = info.get("tied") or {}
    specs = [source.specs.get(k) or TensorSpec(k, dtype_of(d), tuple(shape)) for k, (d, shape) in recorded.items()
             if k not in tied]
    missing = {s.name: s for s in specs if s.name not in source.specs}
    folder = open_base(info, base, checkpoint, missing) if missing else None

    def read(key: str) -> torch.Tensor:
        if key in source.specs:
            return source.read(key)
        # A frozen weight, as the model held it: the base's, in the model's dtype.
        return folder.read(key).to(missing[key].dtype)  # type: ignore[union-attr]  # missing keys: a folder

    def done(key: str) -> None:
        if key in source.specs:
            source.done(key)

    class_name = str(info.get("class", "")).rsplit(".", 1)[-1]
    return FolderPlan(hf_files(info, class_name, specs), "model", specs, read, done)


def adapter_plan(info: Mapping[str, Any], source: Any, checkpoint: Path) -> FolderPlan:
    """The active adapter as ``PeftModel.save_pretrained`` writes it."""
    peft = info["peft"]
    keys = peft.get("keys")
    if keys is None:
        raise ExportError(f"{checkpoint}: a PEFT adapter folder is written for adapters held in the model's own "
                          f"tensors (LoRA, IA3, LoHa...); not {peft.get('unsupported')}; export the weights with "
                          "--out FILE.safetensors")
    absent = [k for k in keys if k not in source.specs]
    if absent:
        raise ExportError(f"{checkpoint}: holds no adapter tensor {absent[0]!r} ({len(absent)} missing); the adapter "
                          "cannot be exported from it")
    by_file_key = {file_key: key for key, file_key in keys.items()}
    specs = [TensorSpec(file_key, source.specs[key].dtype, source.specs[key].shape) for key, file_key in keys.items()]
    return FolderPlan({"adapter_config.json": peft["config"]}, "adapter_model", specs,
                      lambda k: source.read(by_file_key[k]), lambda k: source.done(by_file_key[k]), shard=False)


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _write_small(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_folder(out: Path, plan: FolderPlan, max_shard_size: str | int) -> Path:
    """Write ``plan`` into a scratch folder beside ``out``, then rename it onto ``out``."""
    limit = parse_size(max_shard_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / _scratch_name(out.name, "tmp")
    tmp.mkdir()
    try:
        for name, content in plan.files.items():
            _write_small(tmp / name, _json_bytes(content))
        shards = plan_shards(plan.specs, limit) if plan.shard else [plan.specs]
        meta = {"format": "pt"}
        if len(shards) == 1:
            write_safetensors(tmp / f"{plan.weights}.safetensors", shards[0], plan.read, metadata=meta, done=plan.done)
        else:
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, 1):
                name = f"{plan.weights}-{i:05d}-of-{len(shards):05d}.safetensors"
                write_safetensors(tmp / name, shard, plan.read, metadata=meta, done=plan.done)
                weight_map.update({s.name: name for s in shard})
            index = {"metadata": {"total_size": sum(s.nbytes for s in plan.specs)}, "weight_map": weight_map}
            _write_small(tmp / SAFE_INDEX.replace("model", plan.weights, 1), _json_bytes(index))
        fsync_dir(tmp)
        try:
            os.rename(tmp, out)  # onto a missing or an empty folder only
        except OSError as e:
            raise ExportError(f"--out {out}: {e.strerror or e} (the folder appeared or filled meanwhile; nothing "
                              "was written there)") from None
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_folder(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *, ema: bool = False,
                  merge: bool = False, base: str | os.PathLike[str] | None = None,
                  max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Export the checkpoint directory ``checkpoint`` as a Hugging Face folder at ``out``
    (which must not exist, or be empty): the model (``ema``: its EMA weights) with its
    config; for a PEFT model its adapter, or with ``merge`` the base with the adapter
    merged in. ``base``: the folder frozen weights the checkpoint left out are read from
    (default: where the model was loaded from). Returns ``out``."""
    checkpoint, out = Path(checkpoint), Path(out)
    check_out_dir(out)
    parse_size(max_shard_size)  # a bad size is refused before anything is read
    info = read_model_info(checkpoint)
    if info is None or ("hf" not in info and "peft" not in info):
        what = f" (the model is a {info['class']})" if info and info.get("class") else ""
        raise ExportError(f"{checkpoint}: records no Hugging Face config{what}, which a folder export needs; export "
                          "the weights alone with --out FILE.safetensors")
    peft = info.get("peft")
    if merge and peft is None:
        raise ExportError(f"--merge: {checkpoint} holds no PEFT model, so there is no adapter to merge; export "
                          "without --merge")
    if peft is not None and not merge and base is not None:
        raise ExportError("--base: an adapter export reads nothing from the base; --base goes with --merge")
    source = open_checkpoint_weights(checkpoint, ema=ema)
    try:
        if peft is None:
            plan = full_plan(info, source, checkpoint, base)
        elif merge:
            from .peft_merge import merged_plan  # imports transformers and peft

            plan = merged_plan(info, source, checkpoint, base)
        else:
            plan = adapter_plan(info, source, checkpoint)
        return write_folder(out, plan, max_shard_size)
    finally:
        source.close()
