"""The bytes of TensorBoard's scalar events, without importing protobuf.

An event file holds ``tensorboard.compat.proto.event_pb2.Event`` messages. Importing
those classes (tensorboard's generated modules and protobuf's runtime) took about 20 ms,
the largest part of a first ``fit()``'s fixed cost, for the two kinds of message the
writer makes: the file-version header and an ``Event`` with a ``Summary`` of
``simple_value`` scalars. Their proto3 wire format is small enough to write directly:

    Event          1: wall_time (double)   2: step (int64)   3: file_version (string, oneof what)
                   5: summary (Summary, oneof what)
    Summary        1: value (repeated Summary.Value)
    Summary.Value  1: tag (string)   2: simple_value (float, oneof value)

Fields go out in field-number order; a proto3 scalar outside a oneof is left out when
it is zero (``-0.0`` has a bit set, so it is written); a oneof member is always
written. ``tests/logging/test_events.py`` checks the bytes against protobuf's own
``SerializeToString`` for ordinary and edge values (NaN, infinities, numbers beyond
float32, negative and large steps, empty and non-ASCII tags).
"""

from __future__ import annotations

import math
import struct
from typing import Iterable

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


__all__ = ["file_version_event", "scalars_event"]
