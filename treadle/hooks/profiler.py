"""ProfilerHook: a ``torch.profiler`` trace of a few training iterations.

The traces (``<worker>.<timestamp>.pt.trace.json``) open in TensorBoard's profiler
plugin (``tensorboard --logdir <out_dir>``, needs ``torch-tb-profiler``), in
``chrome://tracing`` and in https://ui.perfetto.dev.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import get_logger

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ProfilerHook {name} must be an int >= {minimum}, got {value!r}")
    return value


class ProfilerHook(Hook):
    """Profile training iterations with ``torch.profiler``'s schedule.

    Each cycle skips ``wait`` iterations, warms up for ``warmup`` (recorded, then
    discarded: the first iterations after starting the profiler are unrepresentative)
    and records ``active`` iterations into one trace file; ``repeat`` cycles (0: until
    training ends). Once the cycles are done the profiler is stopped, so the rest of
    training runs without it.

    Args:
        wait: the ``torch.profiler.schedule``'s ``wait``.
        warmup: its ``warmup``.
        active: its ``active``.
        repeat: its ``repeat``.
        out_dir: where traces go; None: ``<work_dir>/profiler``.
        record_shapes: passed to ``torch.profiler.profile`` (adds overhead and trace size).
        profile_memory: the same.
        with_stack: the same.
        all_ranks: with several processes, trace every rank (one file each), not only rank 0.

    CPU activity is always recorded, CUDA activity when training on a CUDA device.
    """

    # Step the profiler after the other hooks' work, so it belongs to the iteration.
    priority = Priority.VERY_LOW

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 2, repeat: int = 1,
                 out_dir: str | Path | None = None, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, all_ranks: bool = False) -> None:
        self.wait = _count("wait", wait, 0)
        self.warmup = _count("warmup", warmup, 0)
        self.active = _count("active", active, 1)
        self.repeat = _count("repeat", repeat, 0)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.all_ranks = all_ranks  # several processes: rank 0 only unless True (one trace per rank)
        self.trace_dir: Path | None = None  # where this run's traces went
        self._prof: Any = None
        self._steps = 0

    def before_train(self, trainer: "RunView") -> None:
        import torch.profiler as tp  # torch is loaded; the profiler module only when used

        if not (trainer.is_main or self.all_ranks):
            return
        if self.out_dir is not None:
            out = self.out_dir
        elif trainer.work_dir is not None:
            out = Path(trainer.work_dir) / "profiler"
        else:
            raise ValueError("ProfilerHook needs out_dir= or a Trainer work_dir to write its traces to")
        out.mkdir(parents=True, exist_ok=True)
        self.trace_dir = out
        activities = [tp.ProfilerActivity.CPU]
        if trainer.strategy.device.type == "cuda":
            activities.append(tp.ProfilerActivity.CUDA)
        self._prof = tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat),
            on_trace_ready=tp.tensorboard_trace_handler(str(out)),
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._steps = 0
        self._prof.start()

    def after_train_iter(self, trainer: "RunView", batch: Any, outputs: Any) -> None:
        prof = self._prof
        if prof is None:
            return
        prof.step()
        self._steps += 1
        # After the last cycle's step() the trace is written: nothing left to record.
        if self.repeat and self._steps >= (self.wait + self.warmup + self.active) * self.repeat:
            self._stop()

    def after_train(self, trainer: "RunView") -> None:
        self._stop()

    def after_run(self, trainer: "RunView") -> None:
        self._stop()  # training ended by an exception: still close the profiler

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()  # writes the trace of an active window cut short
            get_logger().info(f"profiler traces in {self.trace_dir}")

    def __repr__(self) -> str:
        return (f"ProfilerHook(wait={self.wait}, warmup={self.warmup}, active={self.active}, "
                f"repeat={self.repeat}, out_dir={self.out_dir})")


__all__ = ["ProfilerHook"]
