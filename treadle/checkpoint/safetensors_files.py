"""Read parts of tensors from ``.safetensors`` files, a process its own share only.

    files = SafetensorsFiles.open("llama-dir")      # a folder (model.safetensors or shards + index) or a file
    files.shape("model.embed_tokens.weight")         # from the headers: nothing else is read
    files.read_box("model.embed_tokens.weight", (128, 0), (128, 4096), out)   # rows 128..255 into out

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape
and byte range) and the tensors' bytes, row-major. :meth:`SafetensorsFiles.read_box` reads
the rows a box spans with ``os.pread``, a block of rows at a time (at most
:data:`BLOCK_BYTES` beyond the box itself), and copies the box's columns out: a process
reads its shard of each tensor, never the whole set, and the bytes go through the page
cache rather than into the process's memory (no ``mmap``). Nothing in the files is
executed; the header is JSON.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from treadle.checkpoint.manifest import CheckpointError, CorruptCheckpointError

#: safetensors dtype names -> torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
#: At most this many bytes are read at once beyond the box a process keeps.
BLOCK_BYTES = 16 << 20
#: A Hugging Face folder's weights: one file, or shards listed by an index.
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def is_hf_folder(path: str | os.PathLike[str]) -> bool:
    """A folder ``save_pretrained`` wrote: its weights as safetensors, one file or shards with an index."""
    path = Path(path)
    return (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset of the tensor in its file


def _read_header(path: Path) -> dict[str, _Entry]:
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CorruptCheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            size = os.fstat(f.fileno()).st_size
            if length > size - 8:
                raise CorruptCheckpointError(f"{path}: not a safetensors file (a header of {length} bytes in a file "
                                             f"of {size})")
            header = json.loads(f.read(length))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"{path}: not a safetensors file (its header is not JSON: {e})") from None
    entries: dict[str, _Entry] = {}
    base = 8 + length
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype = DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {key!r} has dtype {info.get('dtype')!r}, which treadle does not read "
                                  f"(expected one of {', '.join(DTYPES)})")
        shape = tuple(int(n) for n in info["shape"])
        begin, end = (int(n) for n in info["data_offsets"])
        numel = 1
        for n in shape:
            numel *= n
        if end - begin != numel * dtype.itemsize or base + end > size:
            raise CorruptCheckpointError(f"{path}: tensor {key!r} ({info.get('dtype')} {list(shape)}) does not fit "
                                         f"its byte range {begin}..{end} (the file may be truncated)")
        entries[key] = _Entry(path, dtype, shape, base + begin)
    return entries


class SafetensorsFiles:
    """The tensors of one ``.safetensors`` file, or of a Hugging Face folder's
    (``model.safetensors``, or the shards ``model.safetensors.index.json`` lists)."""

    def __init__(self, entries: dict[str, _Entry], where: str) -> None:
        self.entries = entries
        self.where = where

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "SafetensorsFiles":
        path = Path(path)
        if path.is_file():
            return cls(_read_header(path), str(path))
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such file or folder")
        index = path / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise CorruptCheckpointError(f"{index}: not a safetensors index (no weight_map: {e})") from None
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (path / f).is_file()]
            if missing:
                raise CheckpointError(f"{path}: the shard {missing[0]} that {INDEX_FILE} lists is missing"
                                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            entries: dict[str, _Entry] = {}
            for name in files:
                entries.update(_read_header(path / name))
            absent = [k for k, f in weight_map.items() if k not in entries]
            if absent:
                raise CorruptCheckpointError(f"{path}: {INDEX_FILE} places {absent[0]!r} in {weight_map[absent[0]]}, "
                                             "which does not hold it")
            return cls(entries, str(path))
        if (path / SINGLE_FILE).is_file():
            return cls(_read_header(path / SINGLE_FILE), str(path))
        others = sorted(p.name for p in path.glob("*.safetensors"))
        if len(others) == 1:
            return cls(_read_header(path / others[0]), str(path))
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "nothing"
        raise CheckpointError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} in the folder (it holds {found}); expected "
                              "a folder written by save_pretrained")

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key].shape

    def dtype(self, key: str) -> torch.dtype:
        return self.entries[key].dtype

    def read(self, key: str) -> torch.Tensor:
        """The whole tensor ``key`` (a CPU tensor of its stored dtype)."""
        e = self.entries[key]
        out = torch.empty(e.shape, dtype=e.dtype)
        self.read_box(key, (0,) * len(e.shape), e.shape, out)
        return out

    def read_box(self, key: str, offsets: Sequence[int], sizes: Sequence[int], out: torch.Tensor) -> None:
        """Copy ``tensor[offsets : offsets + sizes]`` (a box, per dimension) into ``out``
        (any device and dtype, of shape ``sizes``), reading only the rows it spans."""
        e = self.entries[key]
        if len(offsets) != len(e.shape) or any(o < 0 or o + s > n for o, s, n in zip(offsets, sizes, e.shape)):
            raise ValueError(f"{key}: the box at {list(offsets)} of size {list(sizes)} is outside its shape {list(e.shape)}")
        if tuple(out.shape) != tuple(sizes):
            raise ValueError(f"{key}: out has shape {list(out.shape)}, the box {list(sizes)}")
        if not e.shape:  # a scalar
            out.copy_(self._rows(e, 0, 1).reshape(()))
            return
        if out.numel() == 0:
            return
        row_shape = e.shape[1:]
        row_bytes = e.dtype.itemsize
        for n in row_shape:
            row_bytes *= n
        inner = tuple(slice(o, o + s) for o, s in zip(offsets[1:], sizes[1:]))
        step = max(1, BLOCK_BYTES // max(row_bytes, 1))
        first, count = offsets[0], sizes[0]
        for done in range(0, count, step):
            n = min(step, count - done)
            rows = self._rows(e, first + done, n).view(n, *row_shape)
            out[done:done + n].copy_(rows[(slice(None), *inner)])

    def _rows(self, e: _Entry, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count`` of ``e`` as a flat tensor of its dtype (one read)."""
        per_row = e.dtype.itemsize
        for n in e.shape[1:]:
            per_row *= n
        buf = torch.empty(count * per_row, dtype=torch.uint8)
        view = memoryview(buf.numpy()).cast("B")
        got = 0
        with open(e.path, "rb", buffering=0) as f:
            while got < len(view):
                chunk = os.preadv(f.fileno(), [view[got:]], e.start + first * per_row + got)
                if chunk <= 0:
                    raise CorruptCheckpointError(f"{e.path}: ended inside a tensor (the file is truncated)")
                got += chunk
        return buf.view(e.dtype)


__all__ = ["BLOCK_BYTES", "DTYPES", "INDEX_FILE", "SINGLE_FILE", "SafetensorsFiles", "is_hf_folder"]
