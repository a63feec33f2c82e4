"""The bytes of TensorBoard's scalar events, without importing protobuf.

An event file holds ``tensorboard.compat.proto.event_pb2.Event`` messages. Importing
those classes (tensorboard's generated modules and protobuf's runtime) took about 20 ms,
the largest part of a first ``fit()``'s fixed cost, for the three kinds of message the
writer makes: the file-version header, an ``Event`` with a ``Summary`` of
``simple_value`` scalars, and (a resumed run) a ``SessionLog.START``. Their proto3 wire
format is small enough to write, and to read back, directly:

    Event          1: wall_time (double)   2: step (int64)   3: file_version (string, oneof what)
                   5: summary (Summary, oneof what)   7: session_log (SessionLog, oneof what)
    Summary        1: value (repeated Summary.Value)
    Summary.Value  1: tag (string)   2: simple_value (float, oneof value)
    SessionLog     1: status (enum: START = 1)

Fields go out in field-number order; a proto3 scalar outside a oneof is left out when
it is zero (``-0.0`` has a bit set, so it is written); a oneof member is always
written. ``tests/logging/test_events.py`` checks the bytes against protobuf's own
``SerializeToString`` for ordinary and edge values (NaN, infinities, numbers beyond
float32, negative and large steps, empty and non-ASCII tags).
"""

from __future__ import annotations

import math
import struct
from typing import Iterable, Iterator, NamedTuple

_DOUBLE = struct.Struct("<d")
_FLOAT = struct.Struct("<f")


def _varint(value: int) -> bytes:
    """A base-128 varint; a negative int64 as its 64-bit two's complement (10 bytes)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(data)) + data


def _float32(value: float) -> bytes:
    """``value`` as protobuf stores a Python float in a ``float`` field: a C cast to
    float32 (round to nearest; beyond float32's range, an infinity of the same sign)."""
    try:
        return _FLOAT.pack(value)
    except OverflowError:  # struct refuses what the cast turns into an infinity
        return _FLOAT.pack(math.copysign(math.inf, value))


def _wall_time_and_step(wall_time: float, step: int) -> bytes:
    out = b""
    if _DOUBLE.pack(wall_time) != b"\x00" * 8:  # proto3: a zero is not written (-0.0 is)
        out += b"\x09" + _DOUBLE.pack(wall_time)
    if not -2**63 <= step < 2**63:
        raise ValueError(f"TensorBoard event step {step} is outside int64")
    if step:
        out += b"\x10" + _varint(step)
    return out


def file_version_event(wall_time: float, version: str = "brain.Event:2") -> bytes:
    """``Event(wall_time=..., step=0, file_version=version).SerializeToString()``."""
    return _wall_time_and_step(wall_time, 0) + _delimited(0x1A, version.encode("utf-8"))


def scalars_event(wall_time: float, step: int, values: Iterable[tuple[str, float]]) -> bytes:
    """``Event(wall_time, step, summary=Summary(value=[Summary.Value(tag=tag,
    simple_value=v), ...])).SerializeToString()`` for ``(tag, v)`` in ``values``."""
    summary = b"".join(
        _delimited(0x0A, (_delimited(0x0A, tag.encode("utf-8")) if tag else b"") + b"\x15" + _float32(v))
        for tag, v in values)
    return _wall_time_and_step(wall_time, step) + _delimited(0x2A, summary)


def session_start_event(wall_time: float, step: int) -> bytes:
    """``Event(wall_time, step, session_log=SessionLog(status=START)).SerializeToString()``:
    what ``torch.utils.tensorboard.SummaryWriter(purge_step=step)`` writes. TensorBoard's
    reader, on meeting it, drops every event it read before with a step >= ``step``."""
    return _wall_time_and_step(wall_time, step) + _delimited(0x3A, b"\x08\x01")


# -- reading events back (a resumed run's purge, treadle/logging/event_files.py) -------------
class EventHead(NamedTuple):
    """What the purge of a resumed run needs of an event: its step, whether it is a
    ``SessionLog.START``, and the tags of its summary's values (None: no summary)."""

    step: int
    start: bool
    tags: tuple[str, ...] | None


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("a varint is cut short or too long")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)`` of a protobuf message: an int for a varint, the bytes
    otherwise (fixed64, length-delimited, fixed32)."""
    i, n = 0, len(data)
    while i < n:
        key, i = _read_varint(data, i)
        wire = key & 7
        value: int | bytes
        if wire == 0:
            value, i = _read_varint(data, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = data[i:i + size], i + size
        elif wire == 2:
            size, i = _read_varint(data, i)
            value, i = data[i:i + size], i + size
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")
        if i > n:
            raise ValueError("a field is cut short")
        yield key >> 3, value


def read_event_head(data: bytes) -> EventHead:
    """The :class:`EventHead` of a serialized ``Event`` (any writer's: fields not named
    above are skipped). A malformed message raises ValueError."""
    step, start, tags = 0, False, None
    for field, value in _fields(data):
        if field == 2 and isinstance(value, int):
            step = value - (1 << 64) if value >= 1 << 63 else value  # int64: two's complement
        elif field == 7 and isinstance(value, bytes):
            start = any(f == 1 and v == 1 for f, v in _fields(value))
        elif field == 5 and isinstance(value, bytes):
            tags = tuple(_tag(v) for f, v in _fields(value) if f == 1 and isinstance(v, bytes))
    return EventHead(step, start, tags)


def _tag(value: bytes) -> str:
    return next((v.decode("utf-8", "replace") for f, v in _fields(value) if f == 1 and isinstance(v, bytes)), "")


__all__ = ["EventHead", "file_version_event", "read_event_head", "scalars_event", "session_start_event"]
