"""treadle.logging.events writes, byte for byte, what protobuf's own classes serialize."""

from __future__ import annotations

import math
import struct

import pytest

from treadle.logging.events import EventHead, file_version_event, read_event_head, scalars_event, session_start_event

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


@pytest.mark.parametrize("step", STEPS)
def test_session_start_event_equals_protobufs_and_torchs_purge_event(step):
    expected = event_pb2.Event(wall_time=12.5, step=step,
                               session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)).SerializeToString()
    assert session_start_event(12.5, step) == expected


def test_event_heads_read_back_what_protobuf_wrote():
    Summary = summary_pb2.Summary
    for step in STEPS:
        values = [Summary.Value(tag=tag, simple_value=0.5) for tag in TAGS]
        data = event_pb2.Event(wall_time=3.0, step=step, summary=Summary(value=values)).SerializeToString()
        assert read_event_head(data) == EventHead(step, False, tuple(TAGS)), step
        start = event_pb2.Event(step=step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))
        assert read_event_head(start.SerializeToString()) == EventHead(step, True, None)
    # Other messages: a file version, a STOP, an empty summary, values that are no simple_value.
    assert read_event_head(file_version_event(9.0)) == EventHead(0, False, None)
    stop = event_pb2.Event(step=4, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.STOP, msg="x"))
    assert read_event_head(stop.SerializeToString()) == EventHead(4, False, None)
    assert read_event_head(scalars_event(1.0, 7, [])) == EventHead(7, False, ())
    image = Summary.Value(tag="img", image=Summary.Image(height=2, width=2, encoded_image_string=b"\x00" * 9))
    data = event_pb2.Event(step=5, summary=Summary(value=[image])).SerializeToString()
    assert read_event_head(data) == EventHead(5, False, ("img",))


def test_a_malformed_event_is_a_value_error():
    data = scalars_event(1.0, 300, [("train/loss", 0.5)])
    for cut in (1, 5, len(data) - 1):
        with pytest.raises(ValueError):
            read_event_head(data[:cut])
    with pytest.raises(ValueError):
        read_event_head(b"\x0f")  # wire type 7
