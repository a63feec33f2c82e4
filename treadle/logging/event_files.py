"""A directory of TensorBoard event files as TensorBoard shows it.

A resumed run hides the events its interrupted predecessor wrote after the checkpoint
(``TensorBoardWriter.drop_after``); to know which events TensorBoard shows now, and
which of those must be written again after the purge, it reads the files back the way
TensorBoard's reader does:

* files whose name holds ``tfevents``, in the order of their names (its
  ``DirectoryWatcher`` sorts the paths);
* TFRecord frames (length, masked CRC-32C of the length, data, masked CRC-32C of the
  data: :func:`frame`, which the writer uses too); a frame cut short or failing its CRC
  ends that file (a process killed while writing), as it ends the reader's pass over it;
* a ``SessionLog.START`` event at step ``s`` drops every event read before it with a
  step ``>= s`` (``EventAccumulator._CheckForRestartAndMaybePurge``, for files of
  ``brain.Event:2``, which every file treadle writes is).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator, NamedTuple

import google_crc32c

from treadle.logging.events import read_event_head

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class ShownEvent(NamedTuple):
    """An event with a summary that TensorBoard shows: its step, its values' tags, and
    its serialized bytes (to write it again unchanged)."""

    step: int
    tags: tuple[str, ...]
    data: bytes


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data`` (the CRC in google-crc32c's C code)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """``data`` in a TFRecord frame: length, masked CRC-32C of the length, data, masked
    CRC-32C of the data."""
    header = _LENGTH.pack(len(data))
    return header + _CRC.pack(masked_crc32c(header)) + data + _CRC.pack(masked_crc32c(data))


def event_file_names(log_dir: Path) -> list[str]:
    """The names of the event files in ``log_dir``, in the order TensorBoard reads them."""
    return sorted(p.name for p in log_dir.iterdir() if "tfevents" in p.name and p.is_file())


def read_frames(path: Path) -> Iterator[bytes]:
    """The data of each whole, intact TFRecord frame of ``path``, up to the first that is
    cut short or fails its CRC."""
    with open(path, "rb") as f:
        data = f.read()
    i, n = 0, len(data)
    while i + 12 <= n:
        header = data[i:i + 8]
        if _CRC.unpack_from(data, i + 8)[0] != masked_crc32c(header):
            return
        end = i + 12 + _LENGTH.unpack(header)[0]
        if end + 4 > n:
            return
        body = data[i + 12:end]
        if _CRC.unpack_from(data, end)[0] != masked_crc32c(body):
            return
        yield body
        i = end + 4


def shown_events(log_dir: Path) -> list[ShownEvent]:
    """The events with a summary that TensorBoard shows of ``log_dir``'s event files, in
    the order it read them (see the module docstring). An event that is no protobuf
    ``Event`` is passed over."""
    shown: list[ShownEvent] = []
    for name in event_file_names(log_dir):
        for data in read_frames(log_dir / name):
            try:
                head = read_event_head(data)
            except ValueError:
                continue
            if head.start:
                shown = [e for e in shown if e.step < head.step]
            elif head.tags is not None:
                shown.append(ShownEvent(head.step, head.tags, data))
    return shown


__all__ = ["ShownEvent", "event_file_names", "frame", "masked_crc32c", "read_frames", "shown_events"]
