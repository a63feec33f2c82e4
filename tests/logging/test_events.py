"""treadle.logging.events writes, byte for byte, what protobuf's own classes serialize."""

from __future__ import annotations

import math
import struct

import pytest

from treadle.logging.events import file_version_event, scalars_event

event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
summary_pb2 = pytest.importorskip("tensorboard.compat.proto.summary_pb2")

FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
VALUES = [0.0, -0.0, 1.0, -2.5, 0.1, 1e-3, 123456.789, math.pi, 1e-40, 1e-46, -1e-46, FLT_MAX,
          FLT_MAX * (1 + 2 ** -25), FLT_MAX * (1 + 2 ** -23), -FLT_MAX * 2, 1e39, 1e300, -1e300,
          math.inf, -math.inf, math.nan, 2.0 ** 127, 3.4028235e38]
WALL_TIMES = [1795482434.123456, 0.0, -0.0, 1.5, 1e-320, 2.0 ** 60]
STEPS = [0, 1, 127, 128, 300, 16384, 2 ** 31, 2 ** 63 - 1, -1, -300, -2 ** 63]
TAGS = ["train/loss", "val/acc", "", "lr/pg0", "train/ü-ß-λ", "x" * 200, "a/" * 100]


def _reference(wall_time: float, step: int, values: list[tuple[str, float]]) -> bytes:
    Summary = summary_pb2.Summary
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


def test_file_version_event_equals_protobufs():
    for wall_time in WALL_TIMES:
        expected = event_pb2.Event(wall_time=wall_time, step=0, file_version="brain.Event:2").SerializeToString()
        assert file_version_event(wall_time) == expected, wall_time


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_each_float_value_equals_protobufs(value):
    assert scalars_event(1.5, 7, [("train/loss", value)]) == _reference(1.5, 7, [("train/loss", value)])


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("wall_time", WALL_TIMES)
def test_steps_and_wall_times_equal_protobufs(step, wall_time):
    values = [("train/loss", 0.25), ("train/lr", 1e-3)]
    assert scalars_event(wall_time, step, values) == _reference(wall_time, step, values)


def test_tags_many_values_and_no_value_equal_protobufs():
    values = [(tag, float(i) / 3) for i, tag in enumerate(TAGS)]
    assert scalars_event(12.0, 50, values) == _reference(12.0, 50, values)
    many = [(f"train/m{i}", i * 0.5) for i in range(300)]  # a summary longer than 127 bytes: 2-byte length
    assert scalars_event(12.0, 50, many) == _reference(12.0, 50, many)
    assert scalars_event(12.0, 50, []) == _reference(12.0, 50, [])


def test_a_step_outside_int64_is_refused_as_protobuf_refuses_it():
    for step in (2 ** 63, -2 ** 63 - 1):
        with pytest.raises(ValueError):
            _reference(1.0, step, [])
        with pytest.raises(ValueError, match="outside int64"):
            scalars_event(1.0, step, [])


def test_events_parse_back_with_protobuf():
    data = scalars_event(1795482434.5, 1000, [("train/loss", 0.125), ("val/acc", math.nan)])
    event = event_pb2.Event.FromString(data)
    assert event.wall_time == 1795482434.5 and event.step == 1000
    assert [v.tag for v in event.summary.value] == ["train/loss", "val/acc"]
    assert event.summary.value[0].simple_value == 0.125 and math.isnan(event.summary.value[1].simple_value)
