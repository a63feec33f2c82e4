"""A rank's Python stack as its stall watch reads it: written in ``faulthandler``'s format
by the rank's helper thread, or by ``faulthandler``'s watchdog itself (from C, when the
training thread holds the GIL; treadle/distributed/sentinel.py), parsed here, and read for
what the phase the loop wrote does not say (forward, backward or optimizer inside a step;
the innermost frame of the user's code; the ``torch.distributed`` call it waits in).

The dump is ``faulthandler``'s format: for each thread ``Thread 0x<id> (most recent call
first):`` (``Current thread ...`` for the one that ran the handler), then one line
``  File "<path>", line <n> in <function>`` per frame. Nothing here reads a source file
to learn where the rank is; :func:`format_stack` shows each frame's line of code, as a
traceback does.
"""

from __future__ import annotations

import linecache
import os
import re
from dataclasses import dataclass

_SEP = "/"
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass(frozen=True)
class Frame:
    """One frame of a dumped stack."""

    file: str
    line: int
    name: str


@dataclass(frozen=True)
class Place:
    """Where a rank's training thread is, from its stack: ``phase`` refined inside a step
    (forward, backward, optimizer, compile; "" when the stack does not say), ``detail``
    (the innermost frame of the user's code, e.g. ``forward, model.py:40``) and
    ``collective``: the ``torch.distributed`` function it waits in, or ""."""

    phase: str = ""
    detail: str = ""
    collective: str = ""


def thread_stack(dump: str, ident: int) -> list[Frame] | None:
    """The frames of thread ``ident`` (``threading.get_ident()``) in the last dump of
    ``dump`` that has it, outermost first; None when no dump has it."""
    want = int(ident)
    found: list[Frame] | None = None
    current: list[Frame] | None = None
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head:
            current = [] if int(head.group(1), 16) == want else None
            if current is not None:
                found = current
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(_norm(frame.group(1)), int(frame.group(2)), frame.group(3).strip()))
    if found is None:
        return None
    return list(reversed(found))  # faulthandler writes the most recent call first


def _norm(path: str) -> str:
    return path.replace("\\", _SEP)


def _dir_of(module_file: str) -> str:
    return _norm(os.path.dirname(module_file)) + _SEP


class Places:
    """Reads a :class:`Place` from frames (the directories of torch, treadle and the
    standard library looked up once)."""

    def __init__(self, torch_dir: str | None = None) -> None:
        if torch_dir is None:
            import torch

            torch_dir = _dir_of(torch.__file__)
        self.torch = torch_dir
        self.treadle = _norm(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + _SEP
        self.stdlib = _dir_of(os.__file__)

    def own(self, file: str) -> bool:
        """A frame of the user's code or of a library of theirs (not torch, treadle or the standard library)."""
        return not file.startswith((self.torch, self.treadle, self.stdlib, "<"))

    def _torch_phase(self, frame: Frame) -> str | None:
        t, file, name = self.torch, frame.file, frame.name.rsplit(".", 1)[-1]  # a qualified name's last part
        if file.startswith((t + "_dynamo/", t + "_inductor/")):
            return "compile"
        if file.startswith(t + "autograd/") or (file == t + "_tensor.py" and name == "backward"):
            return "backward"
        if file.startswith(t + "optim/"):
            return "optimizer"
        if file == t + "nn/modules/module.py" and name in ("_call_impl", "_wrapped_call_impl"):
            return "forward"
        return None

    def read(self, frames: list[Frame]) -> Place:
        """The place of a stack (outermost frame first)."""
        phase = ""
        for f in frames:  # the outermost torch phase: forward, backward, optimizer, compile
            found = self._torch_phase(f)
            if found is not None:
                phase = found
                break
        collective = frames[-1].name if frames and frames[-1].file.startswith(self.torch + "distributed/") else ""
        inner = list(reversed(frames))
        named = next((f for f in inner if self.own(f.file)), None) or next(
            (f for f in inner if f.file.startswith(self.treadle)), None)
        detail = f"{named.name}, {os.path.basename(named.file)}:{named.line}" if named else ""
        return Place(phase, detail, collective)


def format_stack(frames: list[Frame] | None, places: Places, limit: int = 24) -> str:
    """A stack as a traceback shows it (most recent call last, with each frame's line of
    code): from treadle's loop down (the command line and ``fit`` above it say nothing),
    at most the innermost ``limit`` frames."""
    if not frames:
        return "  (no Python frame)"
    loops = places.treadle + "engine/"
    start = next((i for i, f in enumerate(frames)
                  if f.file.startswith(loops) and "loop" in os.path.basename(f.file)), 0)
    lines = []
    for f in frames[start:][-limit:]:
        lines.append(f'  File "{f.file}", line {f.line}, in {f.name}')
        code = linecache.getline(f.file, f.line).strip()
        if code:
            lines.append(f"    {code}")
    return "\n".join(lines)


__all__ = ["Frame", "Place", "Places", "format_stack", "thread_stack"]
