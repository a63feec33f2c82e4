"""Where an export, or a model built on the meta device, reads tensors from, one at a time.

Each source has ``specs`` (``{key: TensorSpec}``, known before any tensor is read),
``read(key)`` and ``done(key)`` (the tensor was written: its memory may go):

* :class:`MappedWeights`: a state dict of a ``state.pt`` loaded with
  ``torch.load(mmap=True, weights_only=True)``; each tensor is read from disk as it is
  written, and its pages are given back afterwards (Linux ``madvise``), so that the
  process does not end up holding the whole file.
* :class:`ShardedWeights`: the ``model`` of a sharded (DCP) checkpoint; each tensor is
  read whole through DCP, with treadle's safe reader and planner (dcp_safe.py).
* :class:`FolderWeights`: a Hugging Face folder (``model.safetensors``, or shards and
  ``model.safetensors.index.json``) or a ``.safetensors`` file, read tensor by tensor, or a
  process's box of each (a model built on the meta device: treadle/strategies/materialize.py).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .manifest import STATE_FILE, CheckpointError, CorruptCheckpointError, verify_checkpoint
from .safetensors_stream import SafetensorsFile, TensorSpec

__all__ = ["MappedWeights", "ShardedWeights", "FolderWeights", "ema_weights", "is_hf_folder", "open_checkpoint_weights"]

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


def _spec(key: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(key, t.dtype, tuple(t.shape))


def _madvise() -> Any:
    flag = getattr(mmap, "MADV_DONTNEED", None)
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError, TypeError):  # no C library to ask (Windows)
        return None
    if flag is None:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lambda start, length: fn(start, length, flag)


_RELEASE = _madvise()


def ema_weights(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A checkpoint's EMA weights: a best-weights checkpoint's top-level ``ema``, or a
    training checkpoint's EMAHook state; None for a run without EMA."""
    if isinstance(state.get("ema"), Mapping):
        return state["ema"]
    hooks = state.get("hooks")
    hook = hooks.get("EMAHook") if isinstance(hooks, Mapping) else None
    ema = hook.get("ema") if isinstance(hook, Mapping) else None
    if isinstance(ema, Mapping) and isinstance(ema.get("module"), Mapping):
        return ema["module"]
    return None


class MappedWeights:
    """The tensors of a state dict; ``mapped``: their storages are mapped from a file
    (``torch.load(mmap=True)``), whose pages :meth:`done` gives back."""

    def __init__(self, weights: Mapping[str, Any], where: str, *, mapped: bool = False) -> None:
        self._release = _RELEASE if mapped else None
        self.tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
        if not self.tensors:
            raise CheckpointError(f"{where}: holds no weights")
        self.specs = {k: _spec(k, v) for k, v in self.tensors.items()}

    def read(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def done(self, key: str) -> None:
        """Give back the pages of ``key``'s storage: they are a private mapping of the
        file, never written, so the kernel reads them again from the file if a tied
        tensor needs them. Whole pages inside the storage only."""
        storage = self.tensors[key].untyped_storage()
        if self._release is None or storage.nbytes() == 0:
            return
        start, page = storage.data_ptr(), mmap.PAGESIZE
        first = -(-start // page) * page
        last = (start + storage.nbytes()) // page * page
        if last > first:
            self._release(first, last - first)

    def close(self) -> None:
        self.tensors.clear()


def open_checkpoint_weights(path: Path, *, ema: bool = False) -> MappedWeights | ShardedWeights:
    """The model's (or EMA's) weights of the checkpoint directory ``path``, verified, to be
    read tensor by tensor."""
    from .sharded import is_sharded_checkpoint

    if is_sharded_checkpoint(path):
        if ema:
            raise CheckpointError(f"{path}: a sharded checkpoint holds no EMA weights; export without --ema")
        return ShardedWeights(path)
    from .io import load_checkpoint

    state = load_checkpoint(path, files=[STATE_FILE], mmap=True)[STATE_FILE]
    where = str(path / STATE_FILE)
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: not a checkpoint's state (a {type(state).__name__})")
    weights = ema_weights(state) if ema else state.get("model")
    if weights is None and ema:
        raise CheckpointError(f"{path}: the run had no EMA (it was trained without ema=), so there are no EMA "
                              "weights; export without --ema for the model's weights")
    if not isinstance(weights, Mapping):
        raise CheckpointError(f"{where}: no model weights (its entries: {sorted(map(str, state))})")
    return MappedWeights(weights, where, mapped=True)


class ShardedWeights:
    """The ``model`` entry of a sharded checkpoint, read one whole tensor at a time."""

    def __init__(self, path: Path, entry: str = "model") -> None:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from .dcp_safe import _SafeReader

        verify_checkpoint(path)
        self.path, self.entry = path, entry
        self.reader = _SafeReader(path)
        prefix = f"{entry}."
        self.specs = {}
        #: The entry's keys that are not tensors (a module's ``_extra_state``...), not read.
        self.non_tensors: list[str] = []
        for key, md in self.reader.read_metadata().state_dict_metadata.items():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix):]
            if isinstance(md, TensorStorageMetadata):
                self.specs[name] = TensorSpec(name, md.properties.dtype, tuple(md.size))
            else:
                self.non_tensors.append(name)
        if not self.specs:
            raise CheckpointError(f"{path}: no {entry!r} tensors in its sharded state")

    def read(self, key: str) -> torch.Tensor:
        from torch.distributed.checkpoint import CheckpointException
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        from .dcp_safe import _SafeLoadPlanner
        from .sharded import _as_checkpoint_error, _quiet_single_process

        spec = self.specs[key]
        t = torch.empty(spec.shape, dtype=spec.dtype)
        _quiet_single_process()
        try:
            _load_state_dict({self.entry: {key: t}}, storage_reader=self.reader, planner=_SafeLoadPlanner(),
                             no_dist=True)
        except (Exception, CheckpointException) as e:  # DCP's exception is a BaseException
            raise _as_checkpoint_error(e, self.path, f"reading {key!r}") from None
        return t

    def done(self, key: str) -> None:
        """Nothing kept: each read is a new tensor."""

    def close(self) -> None:
        """Nothing held open."""


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """A folder ``save_pretrained`` wrote: its weights as safetensors, one file or shards with an index."""
    path = Path(path)
    return (path / SAFE_WEIGHTS).is_file() or (path / SAFE_INDEX).is_file()


class FolderWeights:
    """The weights of a Hugging Face folder (``save_pretrained``'s safetensors files: one
    file, or the shards its index lists), or of one ``.safetensors`` file, read tensor by
    tensor (:meth:`read`) or a process's box of one (:meth:`read_box`)."""

    def __init__(self, path: str | os.PathLike[str], what: str = "base") -> None:
        self.path = Path(path)
        index = self.path / SAFE_INDEX
        if self.path.is_file():
            names = [self.path.name]
            self.path = self.path.parent
        elif not self.path.is_dir():
            raise CheckpointError(f"{what} {self.path}: no such folder; expected a Hugging Face model folder "
                                  "(save_pretrained's, with model.safetensors)")
        elif index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                names = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CorruptCheckpointError(f"{index}: not a safetensors index ({e})") from None
            missing = [n for n in names if not (self.path / n).is_file()]
            if missing:
                raise CheckpointError(f"{what} {self.path}: the shard {missing[0]} that {SAFE_INDEX} lists is missing"
                                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        elif (self.path / SAFE_WEIGHTS).is_file():
            names = [SAFE_WEIGHTS]
        else:
            have = sorted(p.name for p in self.path.iterdir())[:8]
            raise CheckpointError(f"{what} {self.path}: no {SAFE_WEIGHTS} or {SAFE_INDEX} (it has {have}); treadle "
                                  "reads safetensors only: save the model with save_pretrained(safe_serialization=True)")
        self.files: dict[str, SafetensorsFile] = {}
        self.specs: dict[str, TensorSpec] = {}
        for name in names:
            if Path(name).name != name:  # never a path out of the folder
                raise CorruptCheckpointError(f"{index}: names a file outside its folder: {name!r}")
            f = SafetensorsFile(self.path / name)
            for key, spec in f.specs.items():
                self.specs[key], self.files[key] = spec, f

    def read(self, key: str) -> torch.Tensor:
        return self.files[key].read(key)

    def read_box(self, key: str, offsets: Any, sizes: Any, out: torch.Tensor) -> None:
        """This process's box of ``key`` into ``out`` (:meth:`SafetensorsFile.read_box`)."""
        self.files[key].read_box(key, offsets, sizes, out)

    def done(self, key: str) -> None:
        """Nothing kept: each read is a new tensor."""

    def close(self) -> None:
        """Nothing held open."""
