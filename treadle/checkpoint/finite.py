"""Finding non-finite values in a state before it is saved.

A checkpoint that holds NaN or inf weights is worse than none: ``resume=True`` picks it
and the run fails again at once. So every save first looks at the weights and the
optimizer state, with one host read per device and dtype for the whole state (each tensor's min
and max: NaN and inf survive them, and nothing can overflow). Nothing here runs per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["first_nonfinite", "named_tensors"]


def named_tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    """``(dotted key, tensor)`` for every floating-point tensor in nested dicts and lists."""
    if isinstance(tree, Tensor):
        if tree.is_floating_point() or tree.is_complex():
            yield prefix, tree
    elif isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from named_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from named_tensors(v, f"{prefix}.{i}" if prefix else str(i))


def _local(t: Tensor) -> Tensor:
    # A sharded DTensor (FSDP): this rank's shard, so that no collective runs here; the
    # caller combines the ranks' answers.
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def first_nonfinite(named: Iterable[tuple[str, Tensor]]) -> str | None:
    """The name of the first tensor holding a NaN or an inf, or None when all are finite."""
    items = [(name, _local(t).detach()) for name, t in named]
    items = [(name, t) for name, t in items if t.numel()]
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, (_, t) in enumerate(items):
        groups.setdefault((t.device, _real(t).dtype), []).append(i)
    bad: list[int] = []
    for idx in groups.values():
        # min and max in one pass per tensor: both finite exactly when every value is (NaN
        # propagates, and nothing is summed that could overflow). On CPU this is ~15x
        # faster than an inf-norm; on CUDA one small kernel per tensor, at a save only.
        # Stacked per device and dtype: one more op per group, one host read per group.
        # Judged in Python: the first call of a torch op in a process costs 0.1 to 1 ms
        # (isfinite, all), far more than testing a few thousand floats here.
        extremes = torch.stack([m for i in idx for m in torch.aminmax(_real(items[i][1]))]).tolist()
        lows, highs = extremes[0::2], extremes[1::2]
        bad.extend(i for i, lo, hi in zip(idx, lows, highs) if not (math.isfinite(lo) and math.isfinite(hi)))
    return items[min(bad)][0] if bad else None
