"""Reading DCP checkpoints without running anything they contain.

Plain ``torch.distributed.checkpoint`` unpickles its ``.metadata`` file and loads
non-tensor values with ``torch.load(weights_only=False)``: a crafted checkpoint could
run code. treadle's sharded loads (:mod:`treadle.checkpoint.sharded`) go through the
reader and planners here instead: an allow-list unpickler for the metadata, and
``weights_only=True`` for every value.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner

from .io import CheckpointError, UnsafeCheckpointError, _torch_reason


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's ``Metadata`` and nothing else (dataclasses, dtypes, sizes, paths)."""

    _METADATA = "torch.distributed.checkpoint.metadata"
    _OTHERS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
               ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
               ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
               ("pathlib", "PureWindowsPath"), ("pathlib", "Path"), ("builtins", "set"), ("builtins", "frozenset")}

    def find_class(self, module: str, name: str) -> Any:
        if module == self._METADATA and (not name.startswith("_") or name == "_MEM_FORMAT_ENCODING"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == module:  # its own dataclasses and enums only
                return obj
        elif (module, name) in self._OTHERS:
            return super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                           torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader with an allow-list unpickler for ``.metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise CheckpointError(f"{path}: refused to load DCP metadata ({e})") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes_safely(planner: DefaultLoadPlanner, read_item: Any, value: Any) -> None:
    """DefaultLoadPlanner.load_bytes, but with weights_only=True (DCP's uses False)."""
    try:
        obj = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(f"refused to load the value of {read_item.dest_index.fqn!r}: treadle loads only "
                                    f"tensors and plain containers; torch's reason: {_torch_reason(str(e))}") from None
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], obj)
    else:
        planner.state_dict[read_item.dest_index.fqn] = obj


class _SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: Any, value: Any) -> None:
        _load_bytes_safely(self, read_item, value)


class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: Any, value: Any) -> None:
        _load_bytes_safely(self, read_item, value)
