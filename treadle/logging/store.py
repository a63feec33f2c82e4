"""MetricStore: scalars put by steps and hooks, read only at the log interval.

``put`` appends the value as it is (a device tensor stays on the device); ``flush``
reduces every pending window with a single host transfer for all tensor values (CPU
tensors, which need no transfer, are read one by one).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor


class MetricStore:
    """Windows of scalars since the last flush, and the last flushed values."""

    def __init__(self) -> None:
        self._pending: defaultdict[str, list[Any]] = defaultdict(list)
        self.latest: dict[str, float] = {}
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
        return list(self._pending.get(name, ()))

    def keep_last(self, n: int) -> None:
        """Keep only the last ``n`` values of every window (MMEngine's ``window_size``)."""
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
                out[key] = [float(v) for v in values]
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
            return [v.item() for v in values]
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
    return all(v.is_cpu for v in values)
