"""MetricStore: scalars put by steps and hooks, read only at the log interval.

``put`` appends the value as it is (a device tensor stays on the device); ``flush``
reduces every pending window with a single host transfer for all tensor values (CPU
tensors, which need no transfer, are read one by one).

The train loop records each step's outputs and each iteration's times here, when a
reader asked for them (``record_outputs``: the logger; ``record_times``: the timer),
as one list append per iteration: a step record ``(iter, epoch, outputs)``, a time
record ``(data_time, step_time)``. They join the named windows (``outputs``' keys,
``data_time``, ``step_time``) when the store is next read, so the per-iteration cost is
the append, not a hook call and a loop over the keys.
"""

from __future__ import annotations

from collections import defaultdict
from operator import attrgetter
from typing import Any, Callable, Mapping

import torch
from torch import Tensor


class MetricStore:
    """Windows of scalars since the last flush, and the last flushed values."""

    def __init__(self) -> None:
        self._pending: defaultdict[str, list[Any]] = defaultdict(list)
        self.latest: dict[str, float] = {}
        # Set by the hooks that read them (LoggerHook, IterTimerHook): the loop records then.
        self.record_outputs = False
        self.record_times = False
        # Step records since the last flush, the first `_joined` of them already in the
        # windows; time records not yet joined. Cleared in place: the loop holds their appends.
        self._steps: list[tuple[int, int, Mapping[str, Any]]] = []
        self._joined = 0
        self._times: list[tuple[float, float]] = []
        self.flushed_steps: list[tuple[int, int, Mapping[str, Any]]] = []  # the step records the last flush read
        # Values kept beyond one flush (a LoggerHook's windows, treadle/logging/history.py),
        # checkpointed with the windows, per rank; a saved one waits here until attached.
        self.history: Any = None
        self._history_state: dict[str, Any] | None = None

    def attach_history(self, history: Any) -> None:
        """Keep ``history`` (a LogHistory) in this store's checkpointed state; a state loaded
        before it was attached (a resume before the run starts) is given to it now."""
        self.history = history
        if self._history_state is not None:
            history.load_state_dict(self._history_state)
            self._history_state = None

    def recorders(self) -> tuple[Callable[[tuple[int, int, Mapping[str, Any]]], None] | None,
                                 Callable[[tuple[float, float]], None] | None]:
        """The train loop's ``(record_step, record_time)``: appends of a step record
        ``(iter, epoch, outputs)`` and a time record ``(data_time, step_time)``, each None
        when no reader asked for it (``record_outputs``, ``record_times``)."""
        return (self._steps.append if self.record_outputs else None,
                self._times.append if self.record_times else None)

    def pending_steps(self) -> list[tuple[int, int, Mapping[str, Any]]]:
        """The step records ``(iter, epoch, outputs)`` since the last flush (a copy)."""
        return list(self._steps)

    def _join(self) -> None:
        """Put the step and time records not joined yet into the named windows."""
        steps = self._steps
        if len(steps) > self._joined:
            pending = self._pending
            new = steps[self._joined:]
            outs = [r[2] for r in new]
            first = outs[0]
            same = False
            if set(map(type, outs)) == {dict}:  # the usual case: dicts with the same keys, a column per key
                try:
                    columns = [(k, [o[k] for o in outs]) for k in first]
                    same = sum(map(len, outs)) == len(first) * len(outs)  # no step has more keys
                except KeyError:
                    pass
            if same:
                for k, column in columns:
                    pending[k].extend(column)
            else:
                for (it, _, o) in new:
                    if not isinstance(o, Mapping):
                        raise TypeError(f"the train step of iteration {it + 1} returned a {type(o).__name__}; expected "
                                        "a dict of values to log (name -> number or one-element tensor)")
                    for k, v in o.items():
                        pending[k].append(v)
            self._joined = len(steps)
        times = self._times
        if times:
            data, step = zip(*times)
            self._pending["data_time"].extend(data)
            self._pending["step_time"].extend(step)
            times.clear()

    def put(self, name: str, value: Tensor | float) -> None:
        """Record one value (no host sync: tensors are kept as they are)."""
        self._pending[name].append(value)

    def put_dict(self, values: dict[str, Tensor | float]) -> None:
        """Record one value of each name (a step's outputs), as :meth:`put`."""
        pending = self._pending
        for k, v in values.items():
            pending[k].append(v)

    def extend(self, name: str, values: list[Tensor | float]) -> None:
        """Record several values of one name (e.g. the grad norms of a log interval)."""
        self._pending[name].extend(values)

    def window(self, name: str) -> list[Tensor | float]:
        """A copy of the values of ``name`` recorded since the last flush (empty if none)."""
        self._join()
        return list(self._pending.get(name, ()))

    def keep_last(self, n: int) -> None:
        """Keep only the last ``n`` values of every window (MMEngine's ``window_size``)."""
        self._join()
        for values in self._pending.values():
            del values[:-n]

    def flush(self) -> dict[str, float]:
        """Mean of each window as floats; clears the windows (read as :meth:`flush_values`)."""
        out = {key: float(sum(values)) / len(values) for key, values in self.flush_values().items()}
        self.latest.update(out)
        return out

    def flush_values(self) -> dict[str, list[float]]:
        """Each window's values as floats, in order; clears the windows.

        Every tensor value of every window is read in one go: one ``stack`` of all of
        them and one host transfer per flush (not one per value, not one per window),
        and the means are taken on the host. Few device ops matter here: this runs once
        per log interval in code the training steps have pushed out of the caches. Values
        already in host memory are read with ``item()`` each instead: there is no
        transfer to save, and that is cheaper than a cold ``stack``.
        """
        self._join()
        steps = self._steps
        self.flushed_steps = steps.copy()
        steps.clear()
        self._joined = 0
        out: dict[str, list[float]] = {}
        tensor_keys: list[str] = []
        lengths: list[int] = []
        flat: list[Tensor] = []
        for key, values in self._pending.items():
            if not values:
                continue
            if isinstance(values[0], Tensor):
                tensor_keys.append(key)
                lengths.append(len(values))
                flat.extend(values)
            else:
                out[key] = list(map(float, values))
        if flat:
            host = _read_all(flat)
            i = 0
            for key, n in zip(tensor_keys, lengths):
                out[key] = host[i:i + n]
                i += n
        self._pending.clear()
        return out


    def state_dict(self) -> dict[str, Any]:
        """The windows not flushed yet, as numbers (one host read for all the tensors,
        at checkpoints only), so that a resumed run logs the same means as an
        uninterrupted one. ``{"tensors": {name: [...]}, "numbers": {name: [...]}}``, and
        ``"history"``: the attached history's state, if any."""
        self._join()
        windows = {k: values for k, values in self._pending.items() if values}
        tensors = {k: values for k, values in windows.items() if isinstance(values[0], Tensor)}
        flat = [v for values in tensors.values() for v in values]
        host = _read_all(flat) if flat else []
        out: dict[str, Any] = {"tensors": {}, "numbers": {}}
        i = 0
        for k, values in tensors.items():
            out["tensors"][k] = host[i:i + len(values)]
            i += len(values)
        out["numbers"] = {k: list(values) for k, values in windows.items() if k not in tensors}
        if self.history is not None:
            out["history"] = self.history.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; a tensor window's values come back as float64
        CPU scalars, which ``flush`` reads to the same numbers."""
        self._pending.clear()
        for k, values in state.get("tensors", {}).items():
            self._pending[k].extend(torch.tensor(v, dtype=torch.float64) for v in values)
        for k, values in state.get("numbers", {}).items():
            self._pending[k].extend(values)
        if "history" in state:
            if self.history is not None:
                self.history.load_state_dict(state["history"])
            else:
                self._history_state = state["history"]


def _read_all(values: list[Tensor]) -> list[float]:
    """One number per tensor (its mean), with one host transfer in the usual cases."""
    if _on_host(values):
        # Nothing to transfer: read each scalar where it lies. One small method run many
        # times stays in the caches; a stack (list handling, type promotion, a new
        # tensor) runs cold at each flush and slows the steps after it (10 to 36 us per
        # interval in interval_cost.py --compare-stack-read, see benchmarks/README.md).
        try:
            return list(map(Tensor.item, values))
        except RuntimeError:  # a value with several elements: counts by its mean below
            pass
    try:  # the common case: scalars of one device (dtypes are promoted), one op
        stacked = torch.stack(values)
    except RuntimeError:  # mixed shapes, e.g. () and (1,), or several devices
        stacked = None
    if stacked is None or stacked.dim() != 1:  # non-scalar values count by their mean
        scalars = [v.reshape(()) if v.numel() == 1 else v.detach().float().mean() for v in values]
        if len({v.device for v in scalars}) > 1:
            scalars = [v.cpu() for v in scalars]
        stacked = torch.stack(scalars)
    return stacked.tolist()


def _on_host(values: list[Tensor]) -> bool:
    """Whether every value is in host memory (reading one there is not a transfer)."""
    return all(map(_IS_CPU, values))


_IS_CPU = attrgetter("is_cpu")
