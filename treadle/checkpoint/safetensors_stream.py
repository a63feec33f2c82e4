"""Safetensors files written and read one tensor at a time.

The format (the ``safetensors`` package's): an 8-byte little-endian length, a JSON header
``{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
{...}}`` padded with spaces to a multiple of 8 bytes, then every tensor's bytes, back to
back. The package itself serializes a whole state dict in memory; here the header is
written from the tensors' dtypes and shapes first, then each tensor's bytes as
``read(name)`` produces it, so a file of any size is written holding one tensor at a time::

    specs = [TensorSpec("w", torch.float32, (4, 2)), ...]
    write_safetensors(path, specs, read=lambda name: tensors[name])
    f = SafetensorsFile(path); f.specs["w"]; f.read("w")   # one tensor, read into its own buffer
    f.read_box("w", (2, 0), (2, 2), out)                    # rows 2..3: a process's shard of it

Reading goes through ``readinto`` of one tensor's buffer (or of a block of the rows a box
spans), not a mapping of the file: the pages of tensors already read do not stay in the
process, and a process reading its shard never reads the whole tensor.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .manifest import CheckpointError, CorruptCheckpointError

__all__ = ["TensorSpec", "SafetensorsFile", "write_safetensors", "dtype_name", "tensor_bytes", "plan_shards",
           "parse_size"]

_NAMES: dict[str, str] = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "complex64": "C64", "uint64": "U64",
    "uint32": "U32", "uint16": "U16", "float8_e4m3fn": "F8_E4M3", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
}
#: torch dtype -> the format's name (those this torch release has).
DTYPES: dict[torch.dtype, str] = {getattr(torch, n): s for n, s in _NAMES.items() if hasattr(torch, n)}
_BY_NAME = {s: d for d, s in DTYPES.items()}
_CHUNK = 64 << 20  # bytes handed to one write() call
#: At most this many bytes are read at once beyond the box :meth:`SafetensorsFile.read_box` keeps.
BOX_BLOCK = 16 << 20


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of a file to write: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize


def dtype_name(dtype: torch.dtype, what: str = "") -> str:
    """The format's name of ``dtype`` (``torch.float32`` -> ``"F32"``)."""
    try:
        return DTYPES[dtype]
    except KeyError:
        raise CheckpointError(f"{what or 'a tensor'} has dtype {dtype}, which safetensors cannot store") from None


def parse_size(size: str | int) -> int:
    """Bytes in ``size``: an int, or a number with a unit, as Hugging Face writes them
    (``"5GB"`` = 5 * 10**9, ``"500MB"``, ``"1.5GiB"`` = 1.5 * 2**30)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        text = str(size).strip()
        units = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3, "TIB": 2**40, "GIB": 2**30, "MIB": 2**20,
                 "KIB": 2**10, "B": 1}
        unit = next((u for u in units if text.upper().endswith(u)), None)
        number = text[: len(text) - len(unit)] if unit else text
        try:
            value = int(float(number) * units[unit]) if unit else int(number)
        except ValueError:
            raise ValueError(f"{size!r} is not a size; expected bytes or a number with a unit, e.g. 5GB, "
                             "500MB, 2GiB") from None
    if value <= 0:
        raise ValueError(f"{size!r}: a shard size must be positive")
    return value


def plan_shards(specs: Iterable[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """``specs`` cut into files of at most ``max_bytes`` each, in order, as
    ``huggingface_hub.split_torch_state_dict_into_shards`` cuts a state dict (a tensor
    larger than the limit gets a file of its own)."""
    shards: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if spec.nbytes > max_bytes:
            shards.append([spec])
            continue
        if current and size + spec.nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def _header(specs: list[TensorSpec], metadata: Mapping[str, str] | None) -> bytes:
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    offset = 0
    for spec in specs:
        end = offset + spec.nbytes
        entries[spec.name] = {"dtype": dtype_name(spec.dtype, repr(spec.name)), "shape": list(spec.shape),
                              "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-(len(text) + 8) % 8)  # the data starts 8-byte aligned, as the package writes it
    return struct.pack("<Q", len(text)) + text


def _file_order(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """Larger element sizes first (stable): every tensor then starts at a multiple of its
    element size, as in the package's own files."""
    return sorted(specs, key=lambda s: -s.dtype.itemsize)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of the CPU tensor ``t`` (contiguous), without a copy."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def write_safetensors(path: str | os.PathLike[str], specs: Iterable[TensorSpec], read: Callable[[str], torch.Tensor],
                      *, metadata: Mapping[str, str] | None = None,
                      done: Callable[[str], None] | None = None) -> int:
    """Write a new safetensors file at ``path`` (which must not exist) holding ``specs``,
    each tensor's bytes as ``read(name)`` gives it, then ``done(name)`` (a source may
    give back its pages). The file is fsynced; returns its size in bytes. A tensor whose
    dtype or shape is not its spec's raises :class:`CheckpointError`."""
    if sys.byteorder != "little":  # the format is little-endian, and the bytes are written as they are in memory
        raise CheckpointError("safetensors files are little-endian; this machine is big-endian")
    ordered = _file_order(specs)
    header = _header(ordered, metadata)
    with open(path, "xb") as f:
        f.write(header)
        for spec in ordered:
            t = read(spec.name)
            if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                raise CheckpointError(f"{spec.name!r}: read as {t.dtype} {tuple(t.shape)}, expected "
                                      f"{spec.dtype} {spec.shape}")
            t = t.detach().to("cpu").contiguous()
            data = tensor_bytes(t)
            for start in range(0, len(data), _CHUNK):
                f.write(data[start:start + _CHUNK])
            del data, t
            if done is not None:
                done(spec.name)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


class SafetensorsFile:
    """A safetensors file's header (:attr:`specs`), and its tensors read one by one."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.specs: dict[str, TensorSpec] = {}
        self._offsets: dict[str, tuple[int, int]] = {}
        try:
            with open(self.path, "rb") as f:
                raw = f.read(8)
                size = os.fstat(f.fileno()).st_size
                (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
                if not 0 < length <= size - 8:
                    raise ValueError("the header length is not within the file")
                header = json.loads(f.read(length))
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: no such file") from None
        except (OSError, ValueError, struct.error) as e:
            raise CorruptCheckpointError(f"{self.path}: not a safetensors file ({e})") from None
        self._start = 8 + length
        self.metadata = header.pop("__metadata__", None) if isinstance(header, dict) else None
        try:
            for name, entry in header.items():
                begin, end = entry["data_offsets"]
                spec = TensorSpec(name, _BY_NAME[entry["dtype"]], tuple(int(s) for s in entry["shape"]))
                if not (0 <= begin <= end <= size - self._start and end - begin == spec.nbytes):
                    raise ValueError(f"{name!r}: its offsets do not fit the file or its shape")
                self.specs[name], self._offsets[name] = spec, (begin, end)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"{self.path}: not a safetensors file (a malformed header: {e})") from None

    def read_box(self, name: str, offsets: Sequence[int], sizes: Sequence[int], out: torch.Tensor) -> None:
        """Copy ``tensor[offsets : offsets + sizes]`` (a box, per dimension: a process's
        shard) into ``out`` (any device and dtype, of shape ``sizes``), reading only the rows
        it spans, :data:`BOX_BLOCK` bytes at a time at most beyond the box itself."""
        spec = self.specs[name]
        if len(offsets) != len(spec.shape) or any(o < 0 or o + s > n for o, s, n in zip(offsets, sizes, spec.shape)):
            raise ValueError(f"{name}: the box at {list(offsets)} of size {list(sizes)} is outside its shape "
                             f"{list(spec.shape)}")
        if tuple(out.shape) != tuple(sizes):
            raise ValueError(f"{name}: out has shape {list(out.shape)}, the box {list(sizes)}")
        if not spec.shape:  # a scalar
            out.copy_(self._rows(name, 0, 1).reshape(()))
            return
        if out.numel() == 0:
            return
        row_shape = spec.shape[1:]
        row_bytes = TensorSpec(name, spec.dtype, row_shape).nbytes
        inner = tuple(slice(o, o + s) for o, s in zip(offsets[1:], sizes[1:]))
        step = max(1, BOX_BLOCK // max(row_bytes, 1))
        for done in range(0, sizes[0], step):
            n = min(step, sizes[0] - done)
            rows = self._rows(name, offsets[0] + done, n).view(n, *row_shape)
            out[done:done + n].copy_(rows[(slice(None), *inner)])

    def _rows(self, name: str, first: int, count: int) -> torch.Tensor:
        """Rows ``first .. first + count`` of ``name`` as a flat tensor of its dtype (one read)."""
        spec = self.specs[name]
        per_row = TensorSpec(name, spec.dtype, spec.shape[1:]).nbytes
        buf = torch.empty(count * per_row, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(self._start + self._offsets[name][0] + first * per_row)
            if f.readinto(tensor_bytes(buf)) != buf.numel():
                raise CorruptCheckpointError(f"{self.path}: {name!r} is cut short")
        return buf.view(spec.dtype)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name``, read into a new CPU tensor."""
        spec = self.specs[name]
        begin, _ = self._offsets[name]
        t = torch.empty(spec.shape, dtype=spec.dtype)
        if spec.nbytes:
            with open(self.path, "rb") as f:
                f.seek(self._start + begin)
                view = tensor_bytes(t)
                if f.readinto(view) != len(view):
                    raise CorruptCheckpointError(f"{self.path}: {name!r} is cut short")
        return t
