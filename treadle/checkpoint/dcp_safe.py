"""Reading DCP checkpoints without running anything they contain.

Plain ``torch.distributed.checkpoint`` unpickles its ``.metadata`` file and loads
non-tensor values with ``torch.load(weights_only=False)``: a crafted checkpoint could
run code. treadle's sharded loads (:mod:`treadle.checkpoint.sharded`) go through the
reader and planners here instead: an allow-list unpickler for the metadata, and
``weights_only=True`` for every value.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from .io import CorruptCheckpointError, UnsafeCheckpointError, _refusal, _torch_reason


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name} is not allowed in DCP metadata")
        self.qualname = f"{module}.{name}"


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's ``Metadata`` and nothing else (dataclasses, dtypes, sizes, paths)."""

    _METADATA = "torch.distributed.checkpoint.metadata"
    _OTHERS = frozenset({("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                         ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                         ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                         ("pathlib", "PureWindowsPath"), ("pathlib", "Path"), ("builtins", "set"),
                         ("builtins", "frozenset")})

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
        raise _RefusedGlobal(module, name)


def read_metadata_safely(path: str | os.PathLike[str]) -> Metadata:
    """Unpickle a DCP ``.metadata`` file with the allow-list unpickler.

    Raises :class:`UnsafeCheckpointError` naming the refused global when the pickle
    references anything but DCP's metadata classes (nothing is executed), and
    :class:`CorruptCheckpointError` when the file is missing or is not DCP metadata.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except _RefusedGlobal as e:
        raise UnsafeCheckpointError(
            f"{path}: refused to load DCP metadata: it references the Python global {e.qualname!r}, which is "
            "not one of DCP's metadata classes (treadle's unpickler allows only those); nothing in the file was "
            "executed"
        ) from None
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path}: missing (a sharded checkpoint needs DCP's metadata)") from None
    except Exception as e:  # a damaged pickle raises about anything
        raise CorruptCheckpointError(f"{path}: unreadable DCP metadata ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(
            f"{path}: not DCP metadata (holds a {type(metadata).__name__}, expected a {Metadata.__qualname__})"
        )
    return metadata


class _SafeReader(dcp.FileSystemReader):
    """DCP's file reader with an allow-list unpickler for ``.metadata``.

    The metadata is read when the reader is made, before DCP runs: a refused or damaged
    ``.metadata`` is reported as such (:func:`read_metadata_safely`) rather than through
    DCP's fallback to per-rank metadata files, which treadle never writes.
    """

    def __init__(self, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self._metadata_path = self._metadata_file()
        self._metadata = read_metadata_safely(self._metadata_path)

    def _metadata_file(self, rank: int | None = None) -> Path:
        """DCP's name for its metadata file (or a rank's own, which newer releases can write
        and treadle never does); spelled here, as torch 2.6 has no method that gives it."""
        return Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._metadata_file(kwargs.get("rank"))
        if path != self._metadata_path:  # another rank's file, or reset() to another checkpoint
            self._metadata_path, self._metadata = path, read_metadata_safely(path)
        metadata = self._metadata
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_bytes_safely(planner: DefaultLoadPlanner, read_item: Any, value: Any) -> None:
    """DefaultLoadPlanner.load_bytes, but with weights_only=True (DCP's uses False)."""
    try:
        obj = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"refused to load the value of {read_item.dest_index.fqn!r}: {_refusal(str(e))} treadle loads only "
            f"tensors and plain containers, and nothing in it was executed. torch's reason: {_torch_reason(str(e))}"
        ) from None
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
