"""MetricStore: scalars put by steps and hooks, read only at the log interval.

``put`` appends the value as it is (a device tensor stays on the device); ``flush``
reduces every pending window with a single host transfer for all tensor values.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor


class MetricStore:
    """Windows of scalars since the last flush, and the last flushed values."""

    def __init__(self) -> None:
        self.pending: defaultdict[str, list[Any]] = defaultdict(list)
        self.latest: dict[str, float] = {}

    def put(self, name: str, value: Tensor | float) -> None:
        """Record one value (no host sync: tensors are kept as they are)."""
        self.pending[name].append(value)

    def put_dict(self, values: dict[str, Tensor | float]) -> None:
        pending = self.pending
        for k, v in values.items():
            pending[k].append(v)

    def flush(self) -> dict[str, float]:
        """Mean of each window as floats; clears the windows.

        All tensor windows are reduced on their device and fetched together, so the
        host waits once per flush, not once per value.
        """
        out: dict[str, float] = {}
        tensor_keys: list[str] = []
        means: list[Tensor] = []
        for key, values in self.pending.items():
            if not values:
                continue
            if isinstance(values[0], Tensor):
                tensor_keys.append(key)
                try:  # the common case: same-shape scalars, one stack op
                    stacked = torch.stack(values)
                except RuntimeError:  # mixed shapes, e.g. () and (1,)
                    stacked = torch.stack([v.reshape(()) for v in values])
                if stacked.requires_grad:  # a custom step's value that was not detached
                    stacked = stacked.detach()
                if not stacked.is_floating_point():
                    stacked = stacked.float()
                means.append(stacked.mean())
            else:
                out[key] = float(sum(values)) / len(values)
        if means:
            devices = {m.device for m in means}
            if len(devices) > 1:
                means = [m.cpu() for m in means]
            fetched = [means[0].tolist()] if len(means) == 1 else torch.stack(means).tolist()
            for key, value in zip(tensor_keys, fetched):
                out[key] = value
        self.pending.clear()
        self.latest.update(out)
        return out
